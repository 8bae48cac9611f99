"""--flame where py-spy cannot help, on the real reference pipeline:

* no ptrace permission: py-spy runs as user ``nobody`` (``setpriv``) against our root-owned
  processes, so the kernel refuses every attach, as in a container without SYS_PTRACE.
  One warning line, the run completes, the API server and stages are profiled in-process
  by pyinstrument instead, and the report says which py-spy profiles are missing and why;
* ``--flame-api pyinstrument``: the API server's asyncio loop profiled in-process, next to
  py-spy's profiles.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile

import pytest

from tests.support.flame_run import flame_run

SMALL = ["--no-progress", "--concurrency", "2", "--num-prompts", "4", "--warmup", "0",
         "--input-len", "100", "--output-len", "20"]
NAMES = {"api", "thinker", "talker", "code2wav"}


@pytest.fixture
def unprivileged_pyspy():
    """A --flame-tool that is the real py-spy, run as nobody (world-readable copy)."""
    setpriv = shutil.which("setpriv")
    real = os.path.join(sysconfig.get_path("scripts"), "py-spy")
    if not os.path.exists(real):
        real = shutil.which("py-spy") or ""
    if not setpriv or not os.path.exists(real):
        pytest.skip("needs setpriv (util-linux) and the py-spy binary")
    d = tempfile.mkdtemp(prefix="omnitrace-noptrace-", dir="/tmp")
    try:
        os.chmod(d, 0o755)
        binary = os.path.join(d, "py-spy-real")
        shutil.copy(real, binary)
        os.chmod(binary, 0o755)
        tool = os.path.join(d, "py-spy")
        with open(tool, "w") as f:
            f.write(f'#!/bin/sh\nexec {setpriv} --reuid=65534 --regid=65534 --clear-groups {binary} "$@"\n')
        os.chmod(tool, os.stat(tool).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        yield tool
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_no_ptrace_one_line_run_completes_pyinstrument_instead(tmp_path, unprivileged_pyspy):
    d = str(tmp_path / "run")
    r = flame_run(d, SMALL, "--snapshot copy", "--flame-tool", unprivileged_pyspy)
    warnings = [ln for ln in r.stderr.splitlines() if "warning" in ln and "flame" in ln]
    assert len(warnings) == 1, r.stderr
    assert "no ptrace permission" in warnings[0] and "pyinstrument" in warnings[0]
    assert "Traceback" not in r.stderr
    with open(os.path.join(d, "bench.json")) as f:
        assert json.load(f)["status"] == "complete"
    with open(os.path.join(d, "profiles", "index.json")) as f:
        index = json.load(f)
    assert {m["name"] for m in index["missing"]} == NAMES
    for m in index["missing"]:
        assert "ptrace" in m["reason"] and m["replaced_by"].startswith("pyinstrument"), m
    assert {p["name"]: p["tool"] for p in index["profiles"]} == {n: "pyinstrument" for n in NAMES}
    with open(os.path.join(d, "profiles", "thinker.svg")) as f:
        assert "_loop (stage.py)" in f.read()  # the scheduler loop, by pyinstrument
    # the report says which profiles are missing and why
    rep = subprocess.run([sys.executable, "-m", "omnitrace", "report", d, "--json"], capture_output=True,
                         text=True, timeout=120)
    assert rep.returncode == 0, rep.stderr
    warns = [w for w in json.loads(rep.stdout)["warnings"] if w.startswith("flame graph of")]
    assert len(warns) == 4 and all("missing: no ptrace permission" in w for w in warns), warns
    listing = subprocess.run([sys.executable, "-m", "omnitrace", "flame", d], capture_output=True,
                             text=True, timeout=60)
    assert listing.returncode == 0 and listing.stdout.count("MISSING") == 4, listing.stdout


def test_api_event_loop_with_pyinstrument_in_the_measured_window(tmp_path):
    d = str(tmp_path / "run")
    flame_run(d, SMALL, "--snapshot copy", "--flame-api", "pyinstrument", "--flame-window", "measured")
    pdir = os.path.join(d, "profiles")
    with open(os.path.join(pdir, "index.json")) as f:
        index = json.load(f)
    # --flame-window measured: py-spy's samples are only those of the bench's measured window
    with open(os.path.join(d, "bench.json")) as f:
        win = json.load(f)["levels"][0]["measured_window"]
    from omnitrace.profile.store import Store
    store = Store.load(os.path.join(pdir, "samples.npz"))
    assert index["window"] == "measured" and len(store.stretches) > 0
    assert store.stretches["t"].min() >= win["start_unix_ns"] and store.stretches["end"].max() <= win["end_unix_ns"]
    api = next(p for p in index["profiles"] if p["name"] == "api")
    assert api["tool"] == "py-spy" and api.get("extra") == ["api.pyinstrument"], api
    with open(os.path.join(pdir, "api.pyinstrument.speedscope.json")) as f:
        doc = json.load(f)
    assert doc["exporter"].startswith("pyinstrument")
    names = {fr["name"] for fr in doc["shared"]["frames"]}
    # the loop and the server coroutine it runs, as pyinstrument saw them in-process
    assert {"run_forever", "_serve"} <= names, sorted(names)[:40]
    with open(os.path.join(pdir, "api.pyinstrument.svg")) as f:
        assert "run_forever" in f.read()
    # only the API server was profiled in-process
    assert not [n for n in os.listdir(pdir) if n.endswith(".pyinstrument.svg") and not n.startswith("api")]
