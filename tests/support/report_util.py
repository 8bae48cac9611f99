"""Run the real reference pipeline + bench under `omnitrace run`, and report on it."""
from __future__ import annotations

import contextlib
import http.server
import json
import os
import shlex
import subprocess
import sys
from typing import Any, Iterator

import jsonschema  # at import: its optional format checkers import six, which hooks sys.meta_path
import yaml

from omnitrace.runtime import config

CHROMIUM = "/usr/bin/chromium"


def chromium() -> str:
    """Debian's Chromium (Playwright drives it); the test fails naming the package if missing."""
    from tests.support.system_deps import need
    return need("chromium", "chromium", CHROMIUM)
SPEEDSCOPE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                          "dashboards", "schema-check", "node_modules", "speedscope", "dist", "release")


def speedscope_release() -> str:
    """speedscope's own release (its viewer and file-format-schema.json), pinned in
    dashboards/schema-check; the test fails naming the install step if it is missing."""
    import pytest
    if not os.path.isfile(os.path.join(SPEEDSCOPE, "file-format-schema.json")):
        pytest.fail("needs speedscope's npm package: run scripts/test.sh, or "
                    "npm ci --prefix dashboards/schema-check", pytrace=False)
    return SPEEDSCOPE


def speedscope_errors(doc: dict) -> list[str]:
    """What speedscope's own file-format schema says is wrong with ``doc`` (none: valid)."""
    with open(os.path.join(speedscope_release(), "file-format-schema.json")) as f:
        schema = json.load(f)
    validator = jsonschema.validators.validator_for(schema)(schema)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def replay_timeline(prof: dict, frames: list[dict]) -> list[tuple[float, float, tuple[str, ...]]]:
    """An evented speedscope profile -> (start ms, end ms, stack of frame names) of each
    time between events with something open, as speedscope's time-order view draws it."""
    out, stack, last = [], [], None
    for ev in prof["events"]:
        if stack and last is not None and ev["at"] > last:
            out.append((last, ev["at"], tuple(frames[f]["name"] for f in stack)))
        if ev["type"] == "O":
            stack.append(ev["frame"])
        else:
            assert stack and stack[-1] == ev["frame"], "closed out of order"
            stack.pop()
        assert last is None or ev["at"] >= last
        last = ev["at"]
    assert not stack
    return out


@contextlib.contextmanager
def browser() -> Iterator[Any]:
    """Debian's Chromium, driven by Playwright, headless; closed afterwards."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def open_in_speedscope(paths: list[str]) -> dict[str, str]:
    """Each speedscope file opened by speedscope itself (its release, served on 127.0.0.1)
    in Chromium: file name -> the profile name its toolbar shows; raises on a page error."""
    import functools
    import shutil
    import tempfile
    import threading

    with tempfile.TemporaryDirectory() as d:
        app = os.path.join(d, "app")
        shutil.copytree(speedscope_release(), app)
        for p in paths:
            shutil.copy(p, app)
        handler = functools.partial(_QuietHandler, directory=app)
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        base = f"http://127.0.0.1:{srv.server_address[1]}"
        shown = {}
        try:
            with browser() as b:
                for p in paths:
                    page = b.new_page(viewport={"width": 1200, "height": 800})
                    errors: list[str] = []
                    page.on("pageerror", lambda e: errors.append(str(e)))
                    name = os.path.basename(p)
                    page.goto(f"{base}/index.html#profileURL={base}/{name}")
                    page.wait_for_function("document.title.endsWith(' - speedscope')", timeout=30_000)
                    if errors:
                        raise AssertionError(f"speedscope on {name}: {errors}")
                    shown[name] = page.inner_text("body")
                    page.close()
        finally:
            srv.shutdown()
    return shown


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # the test's output stays the test's
        pass


CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNITRACE_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def pipeline_file(path: str, **stage_overrides: dict) -> str:
    """The packaged pipeline with per-stage overrides, e.g. talker={"inject_put_delay_ms": 20}."""
    cfg = config.to_dict(config.load())
    for st in cfg["stages"]:
        st.update(stage_overrides.get(st["name"], {}))
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    return path


def run_pipeline(run_dir: str, bench_args: list[str], serve_args: str = "", timeout: float = 240) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "omnitrace", "run", "--run-dir", run_dir, "--",
           sys.executable, "-m", "omnitrace.bench.serve_and_bench", "--serve", serve_args, "--",
           "--no-progress", *bench_args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env())
    assert r.returncode == 0, f"omnitrace run failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r


def report_json(*run_dirs: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "omnitrace", "report", *run_dirs, "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def quote(args: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)


def rewrite_event_log(src: str, dst: str, windows: int, segment_raw_bytes: int = 1 << 16) -> int:
    """``src``'s event log re-written into ``dst`` in ``windows`` time windows (each ring's
    events of a window as one block), in segments of ``segment_raw_bytes``: a run whose
    report streams over many segments. The other run files are copied. Returns segments."""
    import shutil

    import numpy as np

    from omnitrace import eventlog
    from tests.support.event_fixture import write_log
    log = eventlog.read_event_log(src)
    assert log is not None, f"{src}: no event log"
    os.makedirs(dst, exist_ok=True)
    for name in ("run.json", "agent.json", "bench.json", "processes.jsonl"):
        if os.path.exists(os.path.join(src, name)):
            shutil.copy(os.path.join(src, name), dst)
    run_id = next(iter(log.run_ids), "rewritten")  # the same run, cut differently
    ev = log.events[np.argsort(log.events["t"], kind="stable")]
    return write_log(dst, run_id, log.offset_ns, log.rings, ev, log.requests.strings, windows,
                     segment_raw_bytes, log.died, log.accounts)
