"""omnitrace.runner.signals.StopSignals: which signals `omnitrace run` takes as a stop and
what run.json then says. Passing them on to a real command: tests/system/test_stop.py and
tests/system/cli/test_loadtest.py (loadtest's planned stop ends its run complete)."""
from __future__ import annotations

import os
import signal

import pytest

from omnitrace.runner.signals import StopSignals


@pytest.fixture
def stops():
    made: list[StopSignals] = []
    yield lambda planned=None: made.append(StopSignals(planned)) or made[-1]
    for s in reversed(made):
        s.restore()


def test_a_planned_signal_outside_the_stop_signals_is_caught_and_reads_as_the_agents(stops):
    sigs = stops(signal.SIGUSR1)  # unhandled, SIGUSR1 would kill the run outright
    os.kill(os.getpid(), signal.SIGUSR1)
    assert sigs.got == [signal.SIGUSR1] and sigs.status() is None


def test_a_users_signal_before_the_planned_one_is_the_status(stops):
    sigs = stops(signal.SIGUSR1)
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGUSR1)
    assert sigs.status() == "terminated"


def test_a_planned_sigterm_still_reads_as_the_agents(stops):
    sigs = stops(signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGTERM)
    assert sigs.status() is None


def test_restore_gives_back_every_handler_it_took(stops):
    before = signal.getsignal(signal.SIGUSR1)
    stops(signal.SIGUSR1).restore()
    assert signal.getsignal(signal.SIGUSR1) is before
