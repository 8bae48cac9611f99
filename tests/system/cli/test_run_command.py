"""`omnitrace run`: bad input fails before anything starts; exit status like a shell."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.agent_util import clean_env, omnitrace_run, read_json, read_spans


def _one_line_error(res: subprocess.CompletedProcess, needle: str) -> None:
    assert res.returncode == 2, res
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and needle in lines[0], res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("args, needle", [
    (["--exporter", "zipkin"], "unknown exporter 'zipkin'"),
    (["--exporter", "otlp-grpc", "--otlp-endpoint", "localhost:notaport"], "malformed OTLP endpoint"),
    (["--exporter", "otlp-http", "--otlp-endpoint", "ftp://x:1"], "malformed OTLP endpoint"),
    (["--exporter", "otlp-grpc", "--otlp-endpoint", "http://:4317"], "malformed OTLP endpoint"),
    (["--prometheus-port", "99999", "--exporter", "prometheus"], "bad Prometheus port"),
    (["--ring-records", "1000"], "bad ring size"),
    (["--run-id", "../x"], "bad run id"),
    (["--otlp-timeout", "abc"], "invalid float value"),
    (["--otlp-timeout", "0"], "--otlp-timeout must be > 0"),
    (["--max-run-bytes", "lots"], "bad --max-run-bytes"),
])
def test_bad_options_one_line_error_before_start(tmp_path, args, needle):
    marker = tmp_path / "started"
    res = omnitrace_run(["--run-dir", str(tmp_path / "run"), *args, "--", "python", "-c",
                         f"open({str(marker)!r}, 'w')"])
    _one_line_error(res, needle)
    assert not marker.exists()  # the command never started


def test_malformed_endpoint_from_otel_env(tmp_path):
    env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT="not a url")
    res = omnitrace_run(["--run-dir", str(tmp_path / "run"), "--exporter", "otlp-http", "--",
                         "true"], env=env)
    _one_line_error(res, "malformed OTLP endpoint")


def test_unwritable_run_dir(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "file").write_text("x")
    # a path under a regular file cannot be created, even by root
    res = omnitrace_run(["--run-dir", str(ro / "file" / "run"), "--", "true"])
    _one_line_error(res, "cannot write run directory")


def test_busy_prometheus_port_is_an_error_before_start(tmp_path):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    marker = tmp_path / "started"
    try:
        res = omnitrace_run(["--run-dir", str(tmp_path / "run"), "--exporter", "prometheus",
                             "--prometheus-port", str(s.getsockname()[1]), "--", "python", "-c",
                             f"open({str(marker)!r}, 'w')"])
    finally:
        s.close()
    _one_line_error(res, "cannot start")
    assert not marker.exists()


def test_command_not_found_is_127(tmp_path):
    res = omnitrace_run(["--run-dir", str(tmp_path / "run"), "--", "no-such-command-xyz"])
    assert res.returncode == 127
    assert "no-such-command-xyz: command not found" in res.stderr
    res = omnitrace_run(["--run-dir", str(tmp_path / "run"), "--", "./no/such/file"])
    assert res.returncode == 127


def test_exit_status_and_signal_status_pass_through(tmp_path):
    res = omnitrace_run(["--run-dir", str(tmp_path / "a"), "--", "python", "-c",
                         "import sys; sys.exit(7)"])
    assert res.returncode == 7
    run = read_json(str(tmp_path / "a"), "run.json")
    assert run["exit_code"] == 7 and run["status"] == "complete"
    res = omnitrace_run(["--run-dir", str(tmp_path / "b"), "--", "python", "-c",
                         "import os; os.kill(os.getpid(), 9)"])
    assert res.returncode == 128 + 9


def test_children_are_instrumented_and_sitecustomize_chains(tmp_path):
    # a pre-existing sitecustomize on PYTHONPATH must still run under the bootstrap
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITE_RAN'] = '1'\n")
    script = ("import os, subprocess, sys\n"
              "from omnitrace import record\n"
              "assert os.environ.get('OTHER_SITE_RAN') == '1'\n"
              "record.emit(20, 'child-req', 3)\n"
              "if len(sys.argv) == 1:\n"
              "    subprocess.check_call([sys.executable, __file__, 'child'])\n")
    (tmp_path / "s.py").write_text(script)
    env = clean_env(PYTHONPATH=str(other))
    res = omnitrace_run(["--run-dir", str(tmp_path / "run"), "--", "python",
                         str(tmp_path / "s.py")], env=env)
    assert res.returncode == 0, res.stderr
    agent = read_json(str(tmp_path / "run"), "agent.json")
    assert len({r["pid"] for r in agent["rings"]}) == 2  # parent and spawned child
    assert agent["events_read"] == 2
    run = read_json(str(tmp_path / "run"), "run.json")
    assert run["command"][-1].endswith("s.py")


def test_default_run_dir_layout(tmp_path):
    res = omnitrace_run(["--run-id", "myrun-1", "--", "true"], cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    d = tmp_path / "omnitrace-runs" / "myrun-1"
    for name in ("run.json", "processes.jsonl", "events", "metrics.jsonl", "agent.json"):
        assert (d / name).exists(), name
    assert read_json(str(d), "run.json")["run_id"] == "myrun-1"


def test_agent_killed_is_recorded_and_rings_removed(tmp_path):
    script = ("import json, os, signal, time\n"
              "from omnitrace import record\n"
              "record.emit(20, 'r', 0)\n"
              "time.sleep(0.3)\n"
              f"pid = json.load(open({str(tmp_path / 'run' / 'run.json')!r}))['agent_pid']\n"
              "os.kill(pid, signal.SIGKILL)\n"
              "time.sleep(0.3)\n"
              "record.emit(21, 'r', 0)\n")
    res = omnitrace_run(["--run-dir", str(tmp_path / "run"), "--run-id", f"killed-{os.getpid()}",
                         "--agent-restarts", "0", "--", "python", "-c", script])
    assert res.returncode == 0, res.stderr
    run = read_json(str(tmp_path / "run"), "run.json")
    assert run["status"] == "agent-killed" and run["exit_code"] == 0
    assert "agent died" in res.stderr
    assert not [n for n in os.listdir("/dev/shm") if f"killed-{os.getpid()}" in n]
    # by default a new agent takes over: the event after the kill is in the record, the
    # spare agent kept for that is gone with the run
    run_id = f"taken-{os.getpid()}"
    res = omnitrace_run(["--run-dir", str(tmp_path / "run2"), "--run-id", run_id, "--", "python", "-c",
                         script.replace("'run', 'run.json'", "'run2', 'run.json'").replace(
                             str(tmp_path / "run" / "run.json"), str(tmp_path / "run2" / "run.json"))])
    assert res.returncode == 0 and "took over its rings" in res.stderr, res.stderr
    from omnitrace import eventlog
    from tests.support.proctree import cmdline
    assert sorted(eventlog.read_event_log(str(tmp_path / "run2")).events["kind"].tolist()) == [20, 21]
    assert read_json(str(tmp_path / "run2"), "run.json")["status"] == "complete"
    assert not [n for n in os.listdir("/dev/shm") if run_id in n]
    assert not [p for p in os.listdir("/proc") if p.isdigit() and run_id.encode() in cmdline(int(p))]


def test_a_run_dir_holding_a_run_is_refused_unless_overwrite(tmp_path):
    """Two runs are never mixed: the second is refused with one line and the first run's
    files are untouched; --overwrite replaces them."""
    from tests.support.agent_util import WRITER
    d = tmp_path / "run"
    first = omnitrace_run(["--run-dir", str(d), "--", sys.executable, WRITER, str(tmp_path / "a.json"),
                           "--requests", "2", "--chunks", "2"])
    assert first.returncode == 0, first.stderr
    before = {p.name: p.stat().st_mtime_ns for p in d.rglob("*") if p.is_file()}
    again = omnitrace_run(["--run-dir", str(d), "--", sys.executable, WRITER, str(tmp_path / "b.json"),
                           "--requests", "3", "--chunks", "2"])
    _one_line_error(again, "already holds a run")
    assert {p.name: p.stat().st_mtime_ns for p in d.rglob("*") if p.is_file()} == before
    assert not (tmp_path / "b.json").exists()  # the command never ran
    over = omnitrace_run(["--run-dir", str(d), "--overwrite", "--", sys.executable, WRITER,
                          str(tmp_path / "c.json"), "--requests", "3", "--chunks", "2"])
    assert over.returncode == 0, over.stderr
    spans = read_spans(str(d))
    assert len({s["attrs"]["omni.request.id"] for s in spans}) == 3  # only the new run's


def test_max_run_bytes_stops_recording_loudly_and_counts(tmp_path):
    from tests.support.agent_util import WRITER
    d = tmp_path / "run"
    res = omnitrace_run(["--run-dir", str(d), "--max-run-bytes", "1k", "--", sys.executable, WRITER,
                         str(tmp_path / "w.json"), "--requests", "40", "--chunks", "20"])
    assert res.returncode == 0, res.stderr
    assert "reached --max-run-bytes" in res.stderr
    agent = read_json(str(d), "agent.json")
    rec = agent["record"]
    assert rec["capped"] and rec["events_not_recorded"] > 0
    assert rec["events_recorded"] + rec["events_not_recorded"] == agent["events_read"]
    rep = subprocess.run([sys.executable, "-m", "omnitrace", "report", str(d)], capture_output=True,
                         text=True, timeout=60)
    assert f"{rec['events_not_recorded']} events were not recorded" in rep.stdout


def test_prometheus_port_in_use_names_the_port_and_the_flag(tmp_path):
    """One line naming the port and --prometheus-port; the failed start leaves no run
    behind, so the same --run-dir works on the next try."""
    import socket
    d = tmp_path / "run"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = omnitrace_run(["--run-dir", str(d), "--exporter", "prometheus",
                             "--prometheus-port", str(port), "--", "true"])
        _one_line_error(res, f"127.0.0.1:{port}")
        assert "--prometheus-port" in res.stderr
    again = omnitrace_run(["--run-dir", str(d), "--exporter", "prometheus", "--prometheus-port", "0",
                           "--", "true"])
    assert again.returncode == 0, again.stderr


def test_no_arguments_is_usage_on_stderr_and_exit_2():
    r = subprocess.run([sys.executable, "-m", "omnitrace"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == "" and "usage: omnitrace COMMAND" in r.stderr
    h = subprocess.run([sys.executable, "-m", "omnitrace", "--help"], capture_output=True, text=True,
                       timeout=60)
    assert h.returncode == 0 and "usage: omnitrace COMMAND" in h.stdout


def test_serve_help_starts_nothing(tmp_path):
    d = tmp_path / "run"
    res = omnitrace_run(["--run-dir", str(d), "serve", "--help"])
    assert res.returncode == 0 and "usage: omnitrace serve" in res.stdout
    assert not d.exists()  # no agent, no run directory


def test_a_failing_command_is_reported_as_failed(tmp_path):
    res = omnitrace_run(["--run-dir", str(tmp_path / "run"), "--", sys.executable, "-c",
                         "raise SystemExit(3)"])
    assert res.returncode == 3
    assert "the command failed (exit status 3)" in res.stderr and "done;" not in res.stderr

