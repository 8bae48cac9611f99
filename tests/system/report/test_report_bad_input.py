"""`omnitrace report` on bad input: a clear message (and partial results, labelled), never a traceback.
A request id sent twice, in process: tests/unit/analyze/test_report_warnings.py."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from tests.support.event_fixture import (API, CODEC, CODEC_RECV, RING_RECORDS, TALKER, TALKER_RECV, TALKER_SEND,
                                         THINKER, THINKER_SEND, three_stage_events, write_event_run)


def _report(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "omnitrace", "report", *args], capture_output=True,
                       text=True, timeout=60)
    assert "Traceback" not in r.stderr + r.stdout
    return r


def test_missing_directory(tmp_path):
    r = _report(str(tmp_path / "nope"))
    assert r.returncode == 2 and "not a run directory" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_empty_directory(tmp_path):
    r = _report(str(tmp_path))
    assert r.returncode == 2 and "no omnitrace run files found" in r.stderr


def test_no_measured_requests(tmp_path):
    bench = {"requests": [{"id": "a", "warmup": True, "ttfp_s": 0.001}], "levels": []}
    d = write_event_run(str(tmp_path / "r"), three_stage_events("a"), bench=bench)
    r = _report(d)
    assert r.returncode == 3 and "no measured request could be attributed" in r.stdout
    r = _report(d, "--json")
    assert r.returncode == 3 and json.loads(r.stdout)["window"]["measured"] == 0
    r = _report(d, "--html", str(tmp_path / "x.html"))
    assert r.returncode == 3 and "nothing to plot" in (tmp_path / "x.html").read_text()


def test_bench_only_run_dir_all_failed(tmp_path):
    """Bench against a dead target: bench.json with errors and no spans."""
    d = tmp_path / "r"
    d.mkdir()
    (d / "bench.json").write_text(json.dumps({"status": "failed", "requests": [
        {"id": "x", "warmup": False, "error": "connection failed: Connection refused"}]}))
    r = _report(str(d))
    assert r.returncode == 3
    assert "events/ missing" in r.stdout and "1 measured request(s) FAILED: 1 connection failed" in r.stdout
    assert "no trace at all" not in r.stdout  # a failure, not a tracing gap


def test_drops_are_announced_first(tmp_path):
    """A ring written 7 events past its slots before the agent drained it: those 7 dropped."""
    from omnitrace import record
    from omnitrace.conventions import Ev
    flood = ("stage", 0, "flood")
    steps = RING_RECORDS - len(record.string_slots(1, "a")) // record.RECORD_SIZE + 7
    d = write_event_run(str(tmp_path / "r"), three_stage_events("a") + [
        (flood, Ev.STEP_BEGIN, "a", 0, -1, 1, 0, 1000 + i / 1000) for i in range(steps)])
    r = _report(d)
    assert r.returncode == 0
    assert r.stdout.splitlines()[0].startswith("!! WARNING: the recorder DROPPED 7 events")


def test_unreadable_bench_json_is_a_warning(tmp_path):
    d = write_event_run(str(tmp_path / "r"), three_stage_events("a"))
    (tmp_path / "r" / "bench.json").write_text("{broken")
    r = _report(d)
    assert r.returncode == 0 and "bench.json: unreadable" in r.stdout


def test_a_run_recorded_before_the_event_log_is_one_line_and_exit_2(tmp_path):
    """A run directory of an omnitrace before the event log (spans.jsonl, no events/):
    every command that reads a run says so in one line."""
    d = tmp_path / "old"
    d.mkdir()
    (d / "run.json").write_text('{"run_id": "old", "status": "complete", "exit_code": 0}')
    (d / "spans.jsonl").write_text('{"resourceSpans": [{"scopeSpans": [{"spans": []}]}]}\n')
    for cmd in (("report", str(d)), ("compare", str(d), str(d)), ("sql", str(d), "SELECT count(*) FROM requests"),
                ("export", str(d), "--otlp-json", str(tmp_path / "o.jsonl")),
                ("export", str(d), "--parquet", str(tmp_path / "pq"))):
        r = subprocess.run([sys.executable, "-m", "omnitrace", *cmd], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, (cmd, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "recorded before the event log" in lines[0], (cmd, r.stderr)
        assert "Traceback" not in r.stderr


def test_merge_two_run_dirs(tmp_path):
    """One deployment over two hosts: the API+stage 0 on one, stages 1-2 on the other."""
    events = three_stage_events("a")
    host_a = [e for e in events if e[0] in (API, THINKER, THINKER_SEND)]
    host_b = [e for e in events if e[0] in (TALKER, TALKER_RECV, TALKER_SEND, CODEC, CODEC_RECV)]
    assert len(host_a) + len(host_b) == len(events)
    a = write_event_run(str(tmp_path / "a"), host_a)
    b = write_event_run(str(tmp_path / "b"), host_b)
    r = _report(a, b, "--json")
    rep = json.loads(r.stdout)
    assert rep["window"]["attributed"] == 1 and rep["requests"][0]["missing_spans"] == []
    assert abs(rep["requests"][0]["ttfp_ms"] - 0.9) < 1e-9


@pytest.mark.parametrize("name,content,says", [
    ("bench.json", '{"levels": 5}', "'levels' is int"),
    ("bench.json", '{"requests": [1]}', "'requests' holds a non-object"),
    ("run.json", "[1,2,3]", "run.json: a JSON list"),
    ("agent.json", '"x"', "agent.json: a JSON str"),
])
def test_valid_json_of_the_wrong_shape_is_one_line_and_exit_2(tmp_path, name, content, says):
    d = write_event_run(str(tmp_path / "r"), three_stage_events("a"))
    with open(f"{d}/{name}", "w") as f:
        f.write(content + "\n")
    for cmd in (("report", d), ("compare", d, d)):
        r = subprocess.run([sys.executable, "-m", "omnitrace", *cmd], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2, (cmd, r.stdout, r.stderr)
        assert says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "Traceback" not in r.stderr


def test_corrupt_event_segment_is_one_line_and_exit_2(tmp_path):
    import os
    from omnitrace import eventlog
    d = tmp_path / "r"
    os.makedirs(d / eventlog.DIR)
    (d / "run.json").write_text("{}")
    (d / eventlog.DIR / "seg-000000.zst").write_bytes(b"\x28\xb5\x2f\xfd" + b"\xff" * 64)
    r = _report(str(d))
    assert r.returncode == 2 and "corrupt event segment" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def _mutated(src: str, dst: str, name: str, path: tuple, value) -> str:
    """A copy of run directory ``src`` with one field of ``name`` set to ``value``."""
    import shutil
    shutil.copytree(src, dst)
    with open(f"{dst}/{name}") as f:
        doc = json.load(f)
    cur = doc
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = value
    with open(f"{dst}/{name}", "w") as f:
        json.dump(doc, f)
    return dst


@pytest.mark.parametrize("name,path,value,says", [
    ("agent.json", ("events_read",), "x", "'events_read' is a string, not an integer"),
    ("agent.json", ("events_dropped",), [], "'events_dropped' is a list"),
    ("agent.json", ("spans_built",), "12", "'spans_built' is a string"),
    ("agent.json", ("rings",), 1.5, "'rings' is a number with a fraction, not a list"),
    ("agent.json", ("rings", 0, "dropped"), "x", "'rings[0].dropped' is a string"),
    ("agent.json", ("record",), [1], "'record' is a list, not an object"),
    ("agent.json", ("record", "events_not_recorded"), "x", "'record.events_not_recorded' is a string"),
    ("agent.json", ("exporters",), "x", "'exporters' is a string, not an object"),
    ("run.json", ("events_never_drained",), "x", "'events_never_drained' is a string"),
    ("run.json", ("status",), {"a": 1}, "'status' is an object, not a string"),
    ("run.json", ("rings_left",), 3, "'rings_left' is an integer, not a list"),
    ("bench.json", ("requests", 0, "concurrency"), "x", "'requests[0].concurrency' is a string"),
    ("bench.json", ("levels", 0, "measured_window"), [], "'levels[0].measured_window' is a list"),
])
def test_wrong_field_types_are_one_line_and_exit_2(real_run, tmp_path, name, path, value, says):
    """Issue 25 item 8: valid JSON, a field of the wrong type: named in one line, exit 2."""
    d = _mutated(real_run, str(tmp_path / "r"), name, path, value)
    for cmd in (("report", d), ("report", d, "--json"), ("compare", d, real_run)):
        r = subprocess.run([sys.executable, "-m", "omnitrace", *cmd], capture_output=True,
                           text=True, timeout=120)
        assert "Traceback" not in r.stderr, r.stderr
        assert r.returncode == 2, (cmd, r.stdout[-2000:], r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and name in lines[0] and says in lines[0], r.stderr


@pytest.mark.parametrize("value", [5, "x", {"a": 1}])
def test_export_ignores_agent_json_rings_that_are_not_a_list(real_run, tmp_path, value):
    """Issue 41: `export` crashed on an agent.json whose rings is not a list. Its counts
    are ignored with one warning line; every span is exported (as from the intact run)."""
    d = _mutated(real_run, str(tmp_path / "r"), "agent.json", ("rings",), value)
    spans = {}
    for run in (real_run, d):
        out = tmp_path / f"{len(spans)}.jsonl"
        r = subprocess.run([sys.executable, "-m", "omnitrace", "export", run, "--otlp-json", str(out)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        spans[run] = sum(len(ss["spans"]) for ln in out.read_text().splitlines()
                         for rs in json.loads(ln)["resourceSpans"] for ss in rs["scopeSpans"])
        warned = [ln for ln in r.stderr.splitlines() if "agent.json" in ln]
        assert len(warned) == (run == d) and (run != d or "'rings' is" in warned[0]), r.stderr
    assert spans[d] == spans[real_run] > 0


def test_the_real_run_itself_passes_the_type_checks(real_run):
    """The checks follow what omnitrace writes: its own files are never refused."""
    from omnitrace.runfiles import fieldtypes
    for name in ("run.json", "agent.json", "bench.json"):
        with open(f"{real_run}/{name}") as f:
            assert fieldtypes.check(name, json.load(f)) is None, name


@pytest.mark.parametrize("flag", ["--json", "--html"])
@pytest.mark.parametrize("where", ["missing-folder", "a-directory", "under-a-file"])
def test_unwritable_output_is_one_line_and_exit_2(real_run, tmp_path, flag, where):
    (tmp_path / "file").write_text("x")
    out = {"missing-folder": tmp_path / "nope" / "r.out", "a-directory": tmp_path,
           "under-a-file": tmp_path / "file" / "r.out"}[where]
    r = _report(real_run, flag, str(out))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot write" in lines[0] and str(out) in lines[0], r.stderr
