"""The stop signals of `omnitrace run` once its agent may start: remembered, forwarded
to the command, and turned into run.json's status."""
from __future__ import annotations

import signal
import subprocess

from omnitrace import childproc


class StopSignals:
    """SIGINT, SIGTERM and SIGHUP for `omnitrace run` once its agent may start: remembered
    (a signal before the command runs means it never starts) and forwarded to the command
    once it runs, whose exit then ends the run as usual. A hangup (the terminal, or a
    launcher that died) asks the command for its clean stop, SIGTERM: most servers die
    on a SIGHUP without one. A ``planned`` stop signal other than these (`omnitrace
    loadtest`'s SIGUSR1) asks for that clean stop too, and leaves the status the agent's."""

    KINDS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self, planned: int | None = None) -> None:
        self.got: list[int] = []
        self.planned = planned
        self.child: subprocess.Popen | None = None
        kinds = (*self.KINDS, *([planned] if planned and planned not in self.KINDS else []))
        self.old = {s: signal.signal(s, self._handle) for s in kinds}

    def _handle(self, signum: int, _frame: object) -> None:
        self.got.append(signum)
        self._send(signum)

    def _send(self, signum: int) -> None:
        try:
            if self.child is not None:
                self.child.send_signal(signum if signum in (signal.SIGINT, signal.SIGTERM) else signal.SIGTERM)
        except ProcessLookupError:
            pass

    def attach(self, child: subprocess.Popen) -> None:
        """Forward from now on, and what came while the command was being started."""
        self.child = child
        for signum in list(self.got):
            self._send(signum)

    def status(self) -> str | None:
        """run.json's status for a run a signal ended (interrupted, terminated, hangup);
        None: the agent's own (the command ended by itself, or by the planned stop)."""
        if not self.got or self.got[0] == self.planned:
            return None
        return childproc.stop_status(self.got[0])

    def restore(self) -> None:
        for s, h in self.old.items():
            signal.signal(s, h)
