"""The accounting rule (omnitrace.analyze.accounting) on hand-made inputs: where each
ring's final counts come from, and when the identity closes."""
from __future__ import annotations


from omnitrace.analyze.accounting import complete, headline, ledger

RINGS = {0: {"name": "omnitrace.r.1.1"}, 1: {"name": "omnitrace.r.2.2"}}
DONE = {"status": "complete"}


def test_account_blocks_close_a_clean_run() -> None:
    acc = {0: {"events_written": 70, "dropped": 0}, 1: {"events_written": 30, "dropped": 0}}
    led = ledger(100, RINGS, acc, False, {}, DONE)
    assert (led.events_written, led.lost, led.closes, complete(led)) == (100, 0, True, True)
    assert headline(led) == "events: 100 written = 100 recorded (100.0% recorded)"


def test_rings_left_by_a_dead_agent_win_over_its_account_blocks() -> None:
    acc = {0: {"events_written": 70, "dropped": 0}, 1: {"events_written": 10, "dropped": 0}}
    left = [{"name": "omnitrace.r.2.2", "events_written": 30, "dropped": 5, "never_drained": 12}]
    led = ledger(80, RINGS, acc, False, {}, {"status": "agent-killed", "rings_left": left})
    assert led.events_written == 100 and led.dropped_in_rings == 5 and led.never_drained == 12
    assert led.lost == 3 and led.lost_why == "agent died" and led.closes and not complete(led)


def test_a_loss_without_a_cause_does_not_close() -> None:
    acc = {0: {"events_written": 70, "dropped": 0}, 1: {"events_written": 30, "dropped": 0}}
    led = ledger(90, RINGS, acc, False, {}, DONE)
    assert led.lost == 10 and not led.closes
    assert "10 lost (UNEXPLAINED)" in headline(led) and "DOES NOT CLOSE" in headline(led)
    assert not ledger(110, RINGS, acc, False, {}, DONE).closes  # counted twice


def test_a_torn_segment_explains_a_loss_and_the_finished_agent_stands_in() -> None:
    agent = {"rings": [{"name": "omnitrace.r.1.1", "events_written": 70, "dropped": 0},
                       {"name": "omnitrace.r.2.2", "events_written": 30, "dropped": 0}],
             "record": {"events_not_recorded": 0}}
    led = ledger(60, RINGS, {}, True, agent, DONE)  # the ACCOUNT blocks were in the cut part
    assert led.known and led.lost == 40 and led.lost_why == "torn segment" and led.closes
    # a killed agent's agent.json is stale: never a stand-in
    assert not ledger(60, RINGS, {}, True, agent, {"status": "agent-killed"}).known


def test_rings_without_final_counts_leave_the_accounting_unknown() -> None:
    led = ledger(100, RINGS, {0: {"events_written": 70, "dropped": 0}}, False, {}, DONE)
    assert not led.known and not led.closes and led.rings_unknown == 1
    assert "accounting unknown" in headline(led)


def test_not_recorded_names_its_cause() -> None:
    acc = {0: {"events_written": 70, "dropped": 0}, 1: {"events_written": 30, "dropped": 0}}
    full = {"record": {"events_not_recorded": 40, "last_write_error": "No space left on device"}}
    led = ledger(60, RINGS, acc, False, full, DONE)
    assert led.closes and led.lost == 0 and led.not_recorded_why == "No space left on device"
    capped = {"record": {"events_not_recorded": 40, "capped": True}}
    assert ledger(60, RINGS, acc, False, capped, DONE).not_recorded_why == "max-run-bytes"
