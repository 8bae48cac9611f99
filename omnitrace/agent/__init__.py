"""The agent: drains the rings, assembles spans, exports OTLP, Prometheus and the run directory."""
