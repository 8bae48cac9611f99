"""Injection: `omnitrace run`, the PYTHONPATH bootstrap and the vLLM plugin entry point."""
