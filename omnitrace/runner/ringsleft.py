"""What the agent left in the rings: once it is gone, each ring of the run still in
/dev/shm is counted (its writer's counts, the events never drained) into run.json's
``rings_left`` and removed; an agent that died marks the run agent-killed."""
from __future__ import annotations

import os

from omnitrace import console, record
from omnitrace.runfiles import names
from omnitrace.runfiles.write import mark_status, release_reserve, update_run


def rings_left(run_id: str) -> list[dict]:
    """The run's rings still in /dev/shm once its agent is gone (it unlinks every ring it
    read to the end): for each, its writer's counts from the header and the events never
    drained (the slots between its read and write cursors, decoded), for run.json's
    ``rings_left`` (the report's accounting reads them)."""
    out = []
    for name in record.discover(run_id):
        try:
            reader = record.RingReader(name)
        except (OSError, ValueError):
            continue
        try:
            h = reader.header()
            dec = record.SlotDecoder(record.RequestIds())
            never = 0
            while True:
                raw = reader.read_raw()
                if not raw:
                    break
                never += len(dec.decode(raw))
            out.append({"name": name, "events_written": h.events_written, "dropped": h.dropped,
                        "never_drained": never})
        finally:
            reader.close()
    return out


def count_rings_left(run_dir: str, run_id: str, rc: int, agent_rc: int) -> None:
    """After the agent exited: rings it did not read to the end (it was killed, or its
    drain thread failed) are counted into run.json and removed (shared memory outlives
    processes); an agent that died says so (status agent-killed)."""
    release_reserve(run_dir)  # a killed agent could not give back the space it held
    left = rings_left(run_id)
    if not left and agent_rc == 0:
        return
    never = sum(r["never_drained"] for r in left)
    if agent_rc != 0:
        console.say("run", f"the agent died before its final flush; {never} events were never "
                    "drained (run.json: status agent-killed)")
    elif never:
        console.say("run", f"the agent did not drain {never} events (run.json: rings_left)")
    for r in left:
        try:
            os.unlink(os.path.join(record.SHM_DIR, r["name"]))
        except OSError:
            pass
    counts = dict(events_never_drained=never, events_dropped_in_rings=sum(r["dropped"] for r in left),
                  rings_left=left)
    try:
        if agent_rc != 0:  # exit_code stays the command's
            mark_status(run_dir, "agent-killed", rc, **counts)
        else:
            update_run(run_dir, lambda meta: meta.update(counts))
    except OSError as exc:
        console.say("run", f"cannot write {names.path(run_dir, names.RUN)} ({exc.strerror or exc}): "
                    "the report will count these events as unaccounted")
