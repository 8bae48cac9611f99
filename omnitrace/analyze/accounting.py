"""Every event accounted for: the run's accounting identity, stated once, then applied.

The rule. An event written at a hook site ends in exactly one of these places::

    events_written = recorded + dropped_in_rings + never_drained + not_recorded + lost

* ``events_written``: from each ring's header (``write cursor - string slots + dropped``,
  ``omnitrace.record``), taken once nobody writes or reads it any more: the agent's
  ``ACCOUNT`` block in the event log after its last read of the ring, or, for a ring the
  agent did not finish (killed, drain failed), ``omnitrace run``'s ``rings_left`` in
  run.json; where a torn segment lost the block, the finished agent's last agent.json.
  These counts are independent of the event log they check.
* ``recorded``: the events decoded from the event log (what the report reads).
* ``dropped_in_rings``: the ring was full (the writer counts each one, exactly).
* ``never_drained``: still in a ring when the agent was gone (``rings_left``).
* ``not_recorded``: drained, then not written: ``--max-run-bytes`` reached, or the disk
  full / a write error (agent.json ``record``).
* ``lost``: the rest. A torn or corrupt segment explains it (events that were written and
  cannot be read back), and so does an agent that died (events it had read and not yet
  written); otherwise it is a defect and the identity *does not close*, and so does any
  ring whose final counts are nowhere (recorded by an older omnitrace, or run.json lost).

One home for this rule: the report, ``--json``, the HTML banner and ``omnitrace export``
read :func:`ledger`'s result; the agent's live figures (agent.json ``accounting``) are
the same terms as far as a running agent knows them.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any



@dataclass
class Ledger:
    events_written: int = 0
    recorded: int = 0
    dropped_in_rings: int = 0
    never_drained: int = 0
    not_recorded: int = 0
    not_recorded_why: str = ""  # "max-run-bytes", or the write error
    rings: int = 0
    rings_unknown: int = 0  # rings with no final counts anywhere
    torn: bool = False  # some segment is torn or ends early
    agent_died: bool = False
    live: bool = False  # the run's agent is still running: rings not final yet
    notes: list[str] = field(default_factory=list)

    @property
    def lost(self) -> int:
        return (self.events_written - self.recorded - self.dropped_in_rings - self.never_drained
                - self.not_recorded)

    @property
    def known(self) -> bool:
        return self.rings > 0 and self.rings_unknown == 0

    @property
    def lost_why(self) -> str:
        why = [w for w, on in (("torn segment", self.torn), ("agent died", self.agent_died)) if on]
        return " / ".join(why)

    @property
    def closes(self) -> bool:
        """Every event written is in one named place (a loss only with its cause)."""
        return self.known and (self.lost == 0 or (self.lost > 0 and bool(self.lost_why)))

    @property
    def share_recorded(self) -> float | None:
        return self.recorded / self.events_written if self.known and self.events_written else None

    def merged(self, other: Ledger) -> Ledger:
        out = Ledger()
        for k in ("events_written", "recorded", "dropped_in_rings", "never_drained",
                  "not_recorded", "rings", "rings_unknown"):
            setattr(out, k, getattr(self, k) + getattr(other, k))
        out.not_recorded_why = self.not_recorded_why or other.not_recorded_why
        out.torn, out.agent_died = self.torn or other.torn, self.agent_died or other.agent_died
        out.live = self.live or other.live
        out.notes = self.notes + other.notes
        return out

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(lost=self.lost, lost_why=self.lost_why, known=self.known, closes=self.closes,
                 share_recorded=self.share_recorded)
        return d


def _int(d: dict, key: str) -> int:
    try:
        return int(d.get(key) or 0)
    except (TypeError, ValueError):
        return 0


def ledger(recorded: int, rings: dict[int, dict], accounts: dict[int, dict], torn: bool,
           agent: dict[str, Any] | None, run_json: dict[str, Any] | None) -> Ledger:
    """One run directory's identity: ``rings``/``accounts`` are the event log's RING and
    ACCOUNT blocks by ring index, ``recorded`` its decoded events, ``torn`` whether a
    segment of it is torn; ``agent`` and ``run_json`` the directory's files."""
    agent, run_json = agent or {}, run_json or {}
    final: dict[str, dict] = {}  # ring name -> its final counts
    names = {str(info.get("name") or f"ring {i}") for i, info in rings.items()}
    for i, counts in accounts.items():
        final[str(rings.get(i, {}).get("name") or f"ring {i}")] = counts
    left = [r for r in run_json.get("rings_left") or () if isinstance(r, dict)]
    for r in left:  # not finished by the agent: these counts are the later ones
        final[str(r.get("name"))] = r
    finished = run_json.get("status") not in (None, "running", "agent-killed")
    for r in agent.get("rings") or ():  # rings the agent saw but the log never described
        if isinstance(r, dict) and r.get("name"):
            names.add(str(r["name"]))
            # the agent finished: its last agent.json holds every ring's final counts too
            # (they stand in for ACCOUNT blocks a torn last segment lost)
            if finished and "events_written" in r and str(r["name"]) not in final:
                final[str(r["name"])] = r
    names |= set(final)
    led = Ledger(recorded=recorded, rings=len(names), torn=torn)
    led.rings_unknown = sum(1 for n in names if n not in final)
    for counts in final.values():
        led.events_written += _int(counts, "events_written")
        led.dropped_in_rings += _int(counts, "dropped")
    led.never_drained = sum(_int(r, "never_drained") for r in left)
    restarts = [r for r in run_json.get("agent_restarts") or () if isinstance(r, dict)]
    # each agent's own write counters: the one that finished, and every one that died
    # and was replaced (its last agent.json, kept in run.json by its successor)
    recs = [agent.get("record")] + [r.get("record") for r in restarts]
    for rec in (r for r in recs if isinstance(r, dict)):
        led.not_recorded += _int(rec, "events_not_recorded")
        if _int(rec, "events_not_recorded") and not led.not_recorded_why:
            led.not_recorded_why = str(rec.get("last_write_error") or "") or (
                "max-run-bytes" if rec.get("capped") else "write error")
    led.agent_died = run_json.get("status") == "agent-killed" or bool(restarts)
    if led.rings_unknown:
        led.notes.append(f"{led.rings_unknown} of {led.rings} ring(s) have no final counts "
                         "(recorded by an older omnitrace, or run.json was not written)")
    return led


def headline(led: Ledger) -> str:
    """The one line the report header, the HTML banner and `omnitrace export` print."""
    if not led.rings:
        return "events: none written"
    if led.live:
        return f"events: {led.recorded} recorded so far (the run is live: accounted when it ends)"
    if not led.known:
        return f"events: {led.recorded} recorded; accounting unknown ({led.notes[0]})"
    parts = [f"{led.recorded} recorded"]
    for label, n in (("dropped in rings (full)", led.dropped_in_rings),
                     ("never drained (agent gone)", led.never_drained),
                     (f"not recorded ({led.not_recorded_why})", led.not_recorded)):
        if n:
            parts.append(f"{n} {label}")
    if led.lost > 0:
        parts.append(f"{led.lost} lost ({led.lost_why or 'UNEXPLAINED'})")
    elif led.lost < 0:
        parts.append(f"{led.lost} (counted twice: a defect)")
    share = led.share_recorded
    tail = f"{share:.1%} recorded" if share is not None else "nothing written"
    verdict = "" if led.closes else "; THE ACCOUNTING DOES NOT CLOSE"
    return f"events: {led.events_written} written = " + " + ".join(parts) + f" ({tail}{verdict})"


def of_run_dir(run_dir: str, log: Any, recorded: int, warnings: list[str] | None = None) -> Ledger:
    """The identity of a run directory whose event log a reader other than the report
    loaded (``omnitrace export``): ``log`` its ``eventlog.EventLog`` (events not kept),
    ``recorded`` the events decoded. A run.json or agent.json with a field of the wrong
    type is left out, with a line in ``warnings``."""
    from omnitrace.runfiles import names, read

    def load(name: str) -> dict | None:
        try:
            return read.read(run_dir, name)
        except read.UnreadableFile:
            return None
        except read.RunFileError as exc:
            if warnings is not None:
                warnings.append(f"{exc}: its counts are ignored")
            return None

    return ledger(recorded, log.rings, log.accounts, log.torn_segments > 0,
                  load(names.AGENT), load(names.RUN))


def notes_of_load(run_dir: str, log: Any, recorded: int) -> list[str]:
    """What a reader other than the report (``export``, ``sql``) says of what it loaded:
    :func:`of_run_dir`'s warnings, and a line when not every event is in the record."""
    notes: list[str] = []
    led = of_run_dir(run_dir, log, recorded, notes)
    if not complete(led):
        notes.append(f"the spans are built from part of the run: {headline(led)}")
    return notes


def complete(led: Ledger) -> bool:
    """Every event written is in the record, and the books say so."""
    return led.known and led.closes and led.recorded == led.events_written
