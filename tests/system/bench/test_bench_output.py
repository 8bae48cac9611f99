"""`omnitrace bench` never replaces or loses results (issue 25, items 3 and 1): a file
already at --out is refused (one line, exit 2, nothing sent) unless --overwrite; a
destination that cannot be written is refused before the load; a disk that fills during
the load leaves the results in $TMPDIR (or, if that fails too, on stdout), and says so."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.report_util import report_json, run_pipeline
from tests.support.sse_server import _serve

SMALL = ["--concurrency", "2", "--warmup", "0", "--num-prompts", "12", "--input-len", "20",
         "--output-len", "4", "--no-progress"]


def _bench(port: int, out, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "omnitrace", "bench", "--base-url",
                           f"http://127.0.0.1:{port}", "--out", str(out), *SMALL, *extra],
                          capture_output=True, text=True, timeout=120, env=env)


def _one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.fixture
def server():
    port, seen, stop = _serve("ok")
    yield port, seen
    stop.set()


def test_existing_results_are_refused_unless_overwrite(tmp_path, server):
    port, seen = server
    out = tmp_path / "bench.json"
    assert _bench(port, out).returncode == 0
    first = out.read_bytes()
    sent = len(seen)
    r = _bench(port, out)
    assert r.returncode == 2
    assert "already holds bench results" in _one_line(r.stderr) and "--overwrite" in r.stderr
    assert out.read_bytes() == first and len(seen) == sent  # untouched, and no load was sent
    r = _bench(port, out, "--overwrite")
    assert r.returncode == 0, r.stderr
    ids = {x["id"] for x in json.loads(out.read_text())["requests"]}
    assert ids and not ids & {x["id"] for x in json.loads(first)["requests"]}


def test_bench_into_a_finished_run_keeps_its_results(tmp_path, server):
    """The issue's case: a second bench into a finished run's directory."""
    d = str(tmp_path / "run")
    run_pipeline(d, ["--concurrency", "2", "--num-prompts", "6", "--input-len", "100",
                     "--output-len", "12"])
    before = report_json(d)["window"]["attributed"]
    assert before == 6
    port, seen = server
    r = _bench(port, os.path.join(d, "bench.json"))
    assert r.returncode == 2 and "already holds" in _one_line(r.stderr)
    assert report_json(d)["window"]["attributed"] == before and not seen


@pytest.mark.parametrize("where", ["missing-folder", "under-a-file", "a-directory"])
def test_unwritable_destination_is_refused_before_the_load(tmp_path, server, where):
    port, seen = server
    (tmp_path / "file").write_text("x")
    out = {"missing-folder": tmp_path / "nope" / "bench.json",
           "under-a-file": tmp_path / "file" / "bench.json",
           "a-directory": tmp_path}[where]
    r = _bench(port, out)
    assert r.returncode == 2
    line = _one_line(r.stderr)
    assert str(out) in line and ("cannot write" in line or "is a directory" in line), line
    assert not seen


@pytest.fixture
def full_disk(tmp_path):
    """A 64 KiB tmpfs filled to one free page: room for an empty file, not for results."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], check=True)
    try:
        st = os.statvfs(mnt)
        with open(mnt / "filler", "wb") as f:
            f.write(b"\0" * (st.f_bavail * st.f_frsize - st.f_frsize))
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


@pytest.mark.parametrize("tmpdir_ok", [True, False], ids=["copy-in-tmpdir", "copy-on-stdout"])
def test_disk_full_keeps_the_results(tmp_path, server, full_disk, tmpdir_ok):
    port, seen = server
    safe = tmp_path / "safe"
    safe.mkdir()
    # the full disk as $TMPDIR: the copy fails too
    env = dict(os.environ, TMPDIR=str(safe if tmpdir_ok else full_disk))
    out = full_disk / "bench.json"
    r = _bench(port, out, env=env)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "No space left on device" in r.stderr and str(out) in r.stderr, r.stderr
    assert sorted(os.listdir(full_disk)) == ["filler"]  # no partial file left behind
    if tmpdir_ok:
        copies = list(safe.iterdir())
        assert len(copies) == 1 and str(copies[0]) in r.stderr
        doc = json.loads(copies[0].read_text())
    else:
        assert "stdout" in r.stderr
        lines = [x for x in r.stdout.splitlines() if x.startswith("{")]
        assert len(lines) == 1, r.stdout
        doc = json.loads(lines[0])
    assert doc["status"] == "complete"
    assert {x["id"] for x in doc["requests"]} == {x["id"] for x in seen}
