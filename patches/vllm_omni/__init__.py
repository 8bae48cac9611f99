"""vLLM-Omni async-chunk hooks (see ``wrappers.py`` for what each event means)."""
