"""Reference pipeline runtime: a faithful, lightweight model of vLLM-Omni's async-chunk path."""
