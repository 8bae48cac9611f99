"""How every omnitrace command speaks to its user: one line on stderr, ``omnitrace PROG:
MESSAGE``, flushed at once (the agent's and a stage's lines interleave with the served
command's output; a buffered line would come late or, if the process is killed, never).
stdout stays for results (reports, JSON).
"""
from __future__ import annotations

import sys


def say(prog: str, message: str, *, gap: bool = False) -> None:
    """``omnitrace PROG: MESSAGE`` on stderr; ``gap``: after an empty line (the line ends a
    progress bar's or the served command's output)."""
    print(("\n" if gap else "") + f"omnitrace {prog}: {message}", file=sys.stderr, flush=True)


def text(block: str) -> None:
    """A preformatted block (usage) on stderr."""
    print(block, file=sys.stderr, flush=True)
