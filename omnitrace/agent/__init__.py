"""The agent: drains the rings into the run's event log and serves live views of it
(Prometheus, OTLP spans and metrics); see docs/architecture.md."""
