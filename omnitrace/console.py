"""How every omnitrace command speaks to its user: one line on stderr, ``omnitrace PROG:
MESSAGE``, flushed at once (the agent's and a stage's lines interleave with the served
command's output; a buffered line would come late or, if the process is killed, never).
stdout stays for results (reports, JSON).
"""
from __future__ import annotations

import sys


def say(prog: str, message: str) -> None:
    """``omnitrace PROG: MESSAGE`` on stderr."""
    print(f"omnitrace {prog}: {message}", file=sys.stderr, flush=True)
