"""Load generator for /v1/chat/completions streams."""
