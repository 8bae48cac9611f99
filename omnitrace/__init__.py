"""omnitrace: tracing and profiling for multi-stage omni-model servers."""
__version__ = "0.1.0"
