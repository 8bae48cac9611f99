"""The caller's W3C trace context the tracecontext tests send: its trace id and span id."""

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
