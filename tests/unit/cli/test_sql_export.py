"""`omnitrace sql` and `omnitrace export --parquet/--perfetto`, in process, on the golden
runs: answers in each format, one-line errors with exit 2, Parquet files equal to the
tables, a Perfetto trace that decodes (the perfetto package's protos) into properly nested
slices whose counts are the scripts' own span counts, FIFO depth counters and py-spy
samples as nested frame slices."""
from __future__ import annotations

import csv
import io
import json
import os
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest

from omnitrace.cli import export as export_cli
from omnitrace.cli import sql as sql_cli
from omnitrace.conventions import Ev
from omnitrace.profile.chrometrace import STRETCH_DTYPE
from omnitrace.profile.store import FILE, ROUND_DTYPE, Store
from omnitrace.tables import schema
from omnitrace.tables import run as tables_run
from tests.support import golden_inputs as gi
from tests.support.perfetto_check import decode, script_slices

HOL = os.path.join(gi.RUNS, "hol")


def _sql(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = sql_cli.main(list(argv))
    except SystemExit as exc:  # a usage mistake: argparse's exit
        code = int(exc.code)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_sql_answers_in_each_format(capsys):
    q = "SELECT r.request, count(*) AS tasks FROM fifo_tasks f JOIN requests r USING (request_id) GROUP BY ALL ORDER BY 1"
    code, text, _ = _sql(capsys, HOL, q)
    assert code == 0 and text.splitlines()[-1] == "(4 rows)"
    _, as_csv, _ = _sql(capsys, HOL, q, "--format", "csv")
    _, as_json, _ = _sql(capsys, HOL, q, "--format", "json")
    assert _sql(capsys, HOL, "--format", "json", q)[1] == as_json  # a flag between run and query
    rows = [{"request": r["request"], "tasks": int(r["tasks"])} for r in csv.DictReader(io.StringIO(as_csv))]
    # the script: v's four chunks, one task each of x, y and z
    assert rows == json.loads(as_json) == [{"request": "v", "tasks": 4}, {"request": "x", "tasks": 1},
                                            {"request": "y", "tasks": 1}, {"request": "z", "tasks": 1}]


@pytest.mark.parametrize("argv,says", [
    ((HOL, "SELEC 1"), "Parser Error"),
    ((HOL, "SELECT * FROM no_such_table"), "no_such_table"),
    ((HOL, "SELECT no_such_column FROM requests"), "no_such_column"),
    (("/no/such/run", "SELECT * FROM requests"), "not a run directory"),
    (("/no/such/run",), "a run directory is needed"),
    ((HOL, HOL + "/", "SELECT 1"), "the same run directory"),
])
def test_a_bad_query_is_one_line_and_exit_2(capsys, argv, says):
    code, out, err = _sql(capsys, *argv)
    assert code == 2 and out == "" and says in err and len(err.strip().splitlines()) == 1


WORKED = os.path.join(gi.RUNS, "worked")
PER_REQUEST = ("SELECT {} r.request, count(*) AS tasks, sum(f.blocked_ns) AS ns FROM fifo_tasks f "
               "JOIN requests r USING (request_id) JOIN senders s USING (sender_id) GROUP BY ALL ORDER BY {} request")


def test_several_runs_are_one_set_of_tables_whose_joins_stay_within_a_run(capsys):
    """Each run's answer, asked alone, is its rows of the answer over both: the ids are
    numbered on across runs, so a join written for one run reads several unchanged."""
    alone = []
    for run in (HOL, WORKED):
        code, text, _ = _sql(capsys, run, PER_REQUEST.format("", ""), "--format", "json")
        assert code == 0
        alone.append(json.loads(text))
    code, text, _ = _sql(capsys, HOL, WORKED, PER_REQUEST.format("f.run,", "run,"), "--format", "json")
    both = json.loads(text)
    assert code == 0 and alone[0] and alone[1]
    for run, rows in enumerate(alone):
        assert [{k: v for k, v in r.items() if k != "run"} for r in both if r["run"] == run] == rows
    code, text, _ = _sql(capsys, HOL, WORKED, "SELECT run, path FROM runs ORDER BY run", "--format", "json")
    assert json.loads(text) == [{"run": 0, "path": HOL}, {"run": 1, "path": WORKED}]


def test_a_run_ids_are_numbered_on_alike_whichever_tables_a_load_makes():
    """The shell loads tables as its statements need them: a table loaded later must join
    with one loaded earlier."""
    from omnitrace.analyze import report_tables
    alone = report_tables.load_runs([WORKED, HOL], {"stage_visits"}).tables["stage_visits"]
    with_requests = report_tables.load_runs([WORKED, HOL], {"stage_visits", "requests"}).tables
    assert set(with_requests) == {"stage_visits", "requests"}
    assert alone.column("request_id").equals(with_requests["stage_visits"].column("request_id"))



def test_a_load_takes_only_the_key_tables_its_ids_need_and_later_loads_join_it():
    """Requests alone need no senders (whose ids come from the chunk pairing): a later load
    of FIFO tasks still joins the requests loaded before, and its own senders."""
    from omnitrace.analyze import report_tables
    from omnitrace.tables import combine
    assert combine.with_key_tables({"requests"}) == {"requests", "threads"}
    assert "senders" in combine.with_key_tables({"fifo_tasks"})
    requests = report_tables.load_runs([WORKED, HOL], {"requests"}).tables["requests"]
    later = report_tables.load_runs([WORKED, HOL], {"fifo_tasks", "senders"}).tables
    fifo, senders = later["fifo_tasks"], later["senders"]
    by_id = dict(zip(requests.column("request_id").to_pylist(), zip(requests.column("run").to_pylist(),
                                                                    requests.column("request").to_pylist())))
    assert fifo.num_rows and set(fifo.column("request_id").to_pylist()) <= set(by_id)
    assert {by_id[r][0] for r in fifo.column("request_id").to_pylist()} == {0, 1}
    assert [by_id[r][0] for r in fifo.column("request_id").to_pylist()] == fifo.column("run").to_pylist()
    sender_run = dict(zip(senders.column("sender_id").to_pylist(), senders.column("run").to_pylist()))
    assert [sender_run[s] for s in fifo.column("sender_id").to_pylist()] == fifo.column("run").to_pylist()

def test_without_a_query_the_shell_answers_each_statement(capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("SELECT count(*) AS n\n  FROM requests;\n.tables\n"
                                                 "SELECT 2 AS two;\n"))
    code, text, _ = _sql(capsys, HOL, "--format", "csv")
    assert code == 0
    n = tables_run.load(HOL, {"requests"}).tables["requests"].num_rows
    assert text.startswith(f'"n"\n{n}\n') and text.endswith('"two"\n2\n') and "fifo_tasks:" in text


def test_sql_tables_lists_every_table_and_column(capsys):
    code, text, _ = _sql(capsys, HOL, "--tables")
    assert code == 0 and text == schema.describe()
    for t in schema.TABLES.values():
        assert f"{t.name}: {t.doc}" in text
        assert all(f"  {c.name} " in text for c in t.columns)


def test_parquet_export_writes_every_table_as_it_is(tmp_path):
    out = str(tmp_path / "pq")
    assert export_cli.main([HOL, "--parquet", out]) == 0
    assert sorted(os.listdir(out)) == sorted(f"{n}.parquet" for n in schema.TABLES)
    tables = tables_run.load(HOL).tables
    for name, t in tables.items():
        assert pq.read_table(os.path.join(out, f"{name}.parquet")).equals(t), name
    seg = pq.read_table(os.path.join(out, "segments.parquet"))
    assert seg.num_rows > 0 and sum(seg.column("dur_ns").to_pylist()) == 1000 * 1000  # v's TTFP: 1000 us


def _perfetto(tmp_path, run: str) -> tuple[dict, object]:
    path = str(tmp_path / "trace.pftrace")
    assert export_cli.main([run, "--perfetto", path]) == 0
    with open(path, "rb") as f:
        return decode(f.read()), path


@pytest.mark.parametrize("name,script", [("hol", gi.hol_script), ("worked", gi.worked_script)])
def test_the_perfetto_trace_has_a_slice_per_span(tmp_path, name, script):
    d, _ = _perfetto(tmp_path, os.path.join(gi.RUNS, name))
    assert d.errors == []
    assert dict(d.slices) == script_slices(script())
    threads = {t.thread.thread_name for t in d.tracks.values() if t.HasField("thread")}
    assert {"api", "scheduler", "sender", "receiver"} <= threads
    assert all(a["request"] for *_, a in d.rows)


def test_fifo_depth_counters_follow_the_simulated_queue(tmp_path, synthetic_run):
    """Per stage, the depth after every enqueue and dequeue, from the simulation's own
    stamps: +1 at each enqueue, -1 at each dequeue."""
    d, _ = _perfetto(tmp_path, synthetic_run)
    assert d.errors == []
    events, _ = gi.synthetic_events()
    want = {}
    for stage in (0, 1):
        t = np.array([e[0] for e in events if e[4] == stage and e[2] in (Ev.FIFO_ENQUEUE, Ev.FIFO_DEQUEUE)])
        step = np.array([1 if e[2] == Ev.FIFO_ENQUEUE else -1 for e in events
                         if e[4] == stage and e[2] in (Ev.FIFO_ENQUEUE, Ev.FIFO_DEQUEUE)])
        o = np.lexsort((step, t))
        depth = np.cumsum(step[o])
        last = np.append(t[o][1:] != t[o][:-1], True)
        want[gi.STAGE_NAMES[stage]] = [int(x) for x in depth[last]]
    got = {d.track_name(k).split()[-1]: [int(v) for _, v in vals] for k, vals in d.counters.items()}
    assert got == want and max(max(v) for v in want.values()) >= 3


def test_py_spy_samples_become_nested_frame_slices(tmp_path):
    """A thread's stretches [0, 10] (a, b), [10, 20] (a, c), [30, 40] (a): a stays open over
    the first two (one slice), then a second a; b and c nested in the first."""
    run = str(tmp_path / "run")
    shutil.copytree(HOL, run)
    th = tables_run.load(run, {"threads"}).tables["threads"].to_pylist()[0]
    t0 = 1_000_000
    st = np.zeros(3, STRETCH_DTYPE)
    for i, (a, b, stack) in enumerate(((0, 10, 0), (10, 20, 1), (30, 40, 2))):
        st[i] = (t0 + a, t0 + b, th["pid"], th["tid"], stack)
    os.makedirs(os.path.join(run, "profiles"))
    Store(st, np.zeros(0, ROUND_DTYPE), [("a", "x.py", 1), ("b", "x.py", 2), ("c", "x.py", 3)],
          [(0, 1), (0, 2), (0,)], 10, {}).save(os.path.join(run, "profiles", FILE))
    d, _ = _perfetto(tmp_path, run)
    assert d.errors == []
    frames = sorted((n, t - t0, e - t0, depth) for n, track, t, e, depth, _ in d.rows
                    if d.track_name(track) == "py-spy")
    assert frames == [("a (x.py)", 0, 20, 0), ("a (x.py)", 30, 40, 0), ("b (x.py)", 0, 10, 1),
                      ("c (x.py)", 10, 20, 1)]
    (track,) = {track for _, track, *_ in d.rows if d.track_name(track) == "py-spy"}
    assert d.tracks[d.tracks[track].parent_uuid].thread.tid == th["tid"]  # under the sampled thread


def test_export_of_a_directory_without_an_event_log_is_one_line(tmp_path, capsys):
    os.makedirs(tmp_path / "empty")
    assert export_cli.main([str(tmp_path / "empty"), "--perfetto", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert "no event log" in err and len(err.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "t")
