"""The bench's arrival schedule (omnitrace.bench.load): vLLM's gamma gaps, seeded apart from
the prompts. Sending by it against a real server: tests/system/bench/test_bench.py."""
from __future__ import annotations

import math

import numpy as np
import pytest

from omnitrace.bench.load import arrival_offsets, check_arrivals


def test_an_infinite_rate_sends_everything_at_once():
    assert arrival_offsets(5, math.inf, 1.0, 0) == arrival_offsets(5, None, 1.0, 0) == [0.0] * 5


@pytest.mark.parametrize("burstiness", [0.5, 1.0, 4.0])
def test_gaps_have_the_rate_and_the_gamma_shape(burstiness):
    rate = 8.0
    t = arrival_offsets(20_001, rate, burstiness, 11)
    gaps = np.diff(t)
    assert t[0] == 0.0 and (gaps > 0).all()
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.03)
    # a gamma's coefficient of variation is 1/sqrt(shape): Poisson's 1, burstier above
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)


def test_the_schedule_is_the_seed_s():
    assert arrival_offsets(50, 3.0, 1.0, 7) == arrival_offsets(50, 3.0, 1.0, 7)
    assert arrival_offsets(50, 3.0, 1.0, 7) != arrival_offsets(50, 3.0, 1.0, 8)


@pytest.mark.parametrize("rate,burstiness", [(0, 1), (-1, 1), (math.nan, 1), (2, 0), (2, math.inf),
                                             (2, math.nan)])
def test_a_rate_or_shape_that_cannot_schedule_is_refused(rate, burstiness):
    with pytest.raises(ValueError, match="must be positive"):
        check_arrivals(rate, burstiness)


def test_no_rate_is_a_closed_loop():
    check_arrivals(None, 1.0)
