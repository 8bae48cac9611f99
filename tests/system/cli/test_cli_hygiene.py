"""CLI hygiene a user meets first: help shows defaults and starts nothing, a dropped client
is one line (no traceback), a bench result with nowhere to go says so, the port a server
cannot bind is named with the flag that changes it."""
from __future__ import annotations

import http.client
import re
import socket
import subprocess
import sys
import time

import pytest
import yaml

from tests.support.runtime_server import Server, chat_body, fast_pipeline


from tests.support.otlp_receiver import free_port

COMMANDS = ("run", "serve", "bench", "report", "compare", "export", "top", "loadtest", "sql", "hooks")


def _omni(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "omnitrace", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("cmd", COMMANDS)
def test_help_shows_defaults_and_starts_nothing(cmd, tmp_path):
    r = subprocess.run([sys.executable, "-m", "omnitrace", cmd, "--help"], capture_output=True,
                       text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "usage:" in r.stdout and "Traceback" not in r.stderr
    assert "(default: None)" not in r.stdout and "(default: False)" not in r.stdout
    if cmd not in ("report", "compare", "export"):  # these take only paths and switches
        assert "(default: " in r.stdout, r.stdout
    assert list(tmp_path.iterdir()) == []  # no run directory, no file


def _help_defaults(cmd: str) -> dict[str, str]:
    """--flag -> its shown default, read off `omnitrace CMD --help` as a user reads it."""
    blocks: list[str] = []
    for line in _omni(cmd, "--help").stdout.splitlines():
        if line.startswith("  -"):
            blocks.append(line.strip())
        elif line.startswith("   ") and blocks:
            blocks[-1] += " " + line.strip()
        elif not line.strip() and blocks:
            blocks.append("")
    found = {}
    for b in blocks:
        flag = next((w.rstrip(",") for w in b.split() if w.startswith("--")), None)
        m = re.search(r"\(default: ([^)]*)\)$", b)
        if flag and m:
            found[flag] = m[1]
    return found


def test_bench_help_says_where_loadtest_defaults_differ():
    """Issue 41: `bench` alone had other defaults than `loadtest` and said so nowhere."""
    bench, loadtest = _help_defaults("bench"), _help_defaults("loadtest")
    differ = {f: v for f, v in loadtest.items() if f in bench and bench[f] != v}
    assert {"--concurrency", "--num-prompts", "--input-len", "--output-len"} <= set(differ), (bench, loadtest)
    said = " ".join(_omni("bench", "--help").stdout.split())
    for flag, value in differ.items():
        assert f"{flag} {value}" in said.split("other defaults:")[1], (flag, value, said[-400:])


def test_dropped_client_is_one_line_not_a_traceback(tmp_path):
    # 20 ms steps: 400 tokens take seconds, so the stream is still going when we hang up
    path = fast_pipeline(tmp_path)
    d = yaml.safe_load(open(path))
    for st in d["stages"]:
        st["cost"]["base_ms"] = 20.0
    with open(path, "w") as f:
        yaml.safe_dump(d, f)
    srv = Server(path)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
        conn.request("POST", "/v1/chat/completions", chat_body(400, prompt_tokens=500),
                     {"x-request-id": "hygiene-drop", "Content-Type": "application/json"})
        resp = conn.getresponse()
        seen = b""
        while b'"modality":"audio"' not in seen:
            seen += resp.read1(65536)
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and srv.health()[1]["in_flight"]:
            time.sleep(0.05)
    finally:
        out = srv.stop()
    assert "request hygiene-drop: client disconnected" in out, out[-2000:]
    assert "Traceback" not in out and "Error handling request" not in out, out[-3000:]


def test_bench_without_a_destination_says_so():
    r = _omni("bench", "--base-url", f"http://127.0.0.1:{free_port()}", "--num-prompts", "1",
              "--concurrency", "1", "--no-progress")
    assert r.returncode == 1
    assert "not written" in r.stderr and "--out" in r.stderr and "Traceback" not in r.stderr


def test_serve_port_in_use_names_the_port_and_the_flag():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = _omni("serve", "--port", str(port), timeout=120)
    assert r.returncode != 0
    assert str(port) in r.stderr and "--port" in r.stderr and "Traceback" not in r.stderr, r.stderr


# what a served model's venv may lack: omnitrace goes in there beside vLLM-Omni with the
# packages its hooks and the OTLP path need, not the tables' (pyarrow, DuckDB)
WITHOUT_TABLES = ("import sys, runpy\n"
                  "for m in ('pyarrow', 'duckdb'):\n"
                  "    sys.modules[m] = None  # importing it raises\n"
                  "sys.argv = ['omnitrace', *sys.argv[1:]]\n"
                  "runpy.run_module('omnitrace', run_name='__main__')\n")


@pytest.mark.parametrize("cmd", [["export", "{run}", "--otlp-json", "{run}/spans.json"],
                                 ["report", "{run}", "--json", "{run}/report.json"]])
def test_report_and_otlp_export_need_no_tables_packages(cmd, tmp_path):
    """The real-server tier runs `report` and `export --otlp-json` in vLLM-Omni's venv, which
    has no pyarrow: neither may import the tables (it did once, through the accounting note)."""
    import shutil
    from tests.support import golden_inputs as gi
    run = tmp_path / "hol"
    shutil.copytree(f"{gi.RUNS}/hol", run)
    args = [a.format(run=run) for a in cmd]
    proc = subprocess.run([sys.executable, "-c", WITHOUT_TABLES, *args], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode in (0, 3), proc.stderr[-2000:]
    assert "pyarrow" not in proc.stderr and "duckdb" not in proc.stderr, proc.stderr[-2000:]
