"""`python -m omnitrace.profile.runner --config JSON -- COMMAND ...`: run COMMAND with
every Python process it spawns sampled by py-spy, from its start to its end.

`omnitrace run --flame` starts this in place of the command. Each Python process of the
run announces itself from the bootstrap (``omnitrace.profile.inproc``: one datagram on
this runner's socket) and this runner at once starts ``py-spy record --pid PID --idle
--threads --format chrometrace`` for it, one py-spy per process. (One ``--subprocesses``
py-spy for the tree would be simpler, but it collects every process before stamping a
sample: with a few busy processes on 2 cores its stamps trail the reads by up to 10+ ms,
too coarse to put a sample inside a 150 us span; one py-spy per process stamps within
~0.1 ms.)

py-spy stamps samples in microseconds since its own start, an instant no other process
can read, so each process also runs a clock thread (``omnitrace.profile.clock``) whose
switches, on CLOCK_MONOTONIC, pin that zero (``chrometrace.calibrate``).

Every ``FlameConfig.rotate_s`` a process gets a fresh py-spy and the old one stops once the
new one samples: py-spy keeps its chrometrace in memory until it exits, rotation bounds it.
If py-spy cannot attach at all (no ptrace permission, a tool that fails: checked before the
command starts) the run goes on with one warning line, and the API server and stage
processes profile their main thread in-process with pyinstrument instead.

Each py-spy stays in the command's session (its own process group, so a terminal's Ctrl-C
does not reach it): on Linux a new session is a new scheduler autogroup
(``/proc/sys/kernel/sched_autogroup_enabled``, on by default), and beside a busy server a
py-spy in an autogroup of its own was left runnable but unscheduled for seconds at a time,
missing most of the stages' time (``benchmarks/flame_results.md``).

Exit status: the command's (128+N when it was killed by signal N, as a shell reports it).
"""
from __future__ import annotations

import os
import re
import secrets
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Callable

import orjson

from omnitrace.profile.config import ENV_FLAME, ENV_FLAME_INPROC, ENV_FLAME_SOCKET, FlameConfig
from omnitrace.record import clock_offset_ns
from omnitrace import childproc, console

READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 120.0
PREFLIGHT_TIMEOUT_S = 30.0
CUTOVER_S = 0.5  # a rotated process is sampled by both py-spys at least this long
# py-spy's sampling thread must run when it wakes: while every core is busy it otherwise
# waits for a CPU, longest when the target's threads burst, and reads after spans shorter
# than that wait (docs/flame-graphs.md). So its threads get the lowest real-time priority
# (SCHED_FIFO 1, as `perf record --realtime`) where allowed (CAP_SYS_NICE), else nice -10,
# else stay as they are. py-spy uses a few % of a core; one that cannot keep up (it says it
# is behind) drops to nice -10 rather than hold a core.
PYSPY_NICE = -10


def _why(text: str, tool: str, code: int | None) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and "py-spy>" not in ln
             and not ln.strip()[:1].isdigit() and not ln.startswith("Stack backtrace")]
    msg = lines[0] if lines else ""
    low = text.lower()
    if "permission denied" in low or "operation not permitted" in low:
        return (f"no ptrace permission ({os.path.basename(tool)}: permission denied); run as root "
                "or grant CAP_SYS_PTRACE (docker: --cap-add SYS_PTRACE)")
    return msg or f"{tool} exited with status {code}"


# what PySpy.counts reads from py-spy's stdout, as index.json names it
PYSPY_COUNTS = ("pyspy_samples", "pyspy_errors", "pyspy_behind", "pyspy_behind_max_s")
# py-spy's "2.31s behind in sampling" (Rust's Duration Debug format: s, ms, µs)
_BEHIND = re.compile(rb"([0-9.]+)(s|ms|\xc2\xb5s) behind in sampling")
_UNIT = {b"s": 1.0, b"ms": 1e-3, b"\xc2\xb5s": 1e-6}


def behind_s(text: bytes) -> list[float]:
    """The delays (seconds) of py-spy's "behind in sampling" lines in ``text``."""
    return [float(m[1]) * _UNIT[m[2]] for m in _BEHIND.finditer(text)]


class PySpy:
    """One ``py-spy record`` of one process into one chrometrace chunk."""

    def __init__(self, cfg: FlameConfig, pid: int, index: int) -> None:
        self.cfg, self.pid, self.index = cfg, pid, index
        base = os.path.join(cfg.raw_dir, f"pyspy-{pid}-{index:03d}")
        self.path, self.err_path = base + ".json", base + ".log"
        self.proc: subprocess.Popen | None = None
        self.started_ns = self.ready_ns = self.stopped_ns = 0
        self.error: str | None = None
        self._said = b""  # the tail of py-spy's stdout: its last line counts samples and errors
        self._behind: list[float] = []  # seconds behind, each time it said so (at most 1/s)
        self._drainer: threading.Thread | None = None
        self.priority = "normal"  # what its threads got: "realtime", "nice" or "normal"

    def argv(self) -> list[str]:
        # --idle: every thread in every sample. chrometrace writes a thread's stack only
        # when it changes, so a thread left out of a sample would keep its last stack; for
        # the same reason no --gil. --threads: each stack's root names the native thread id.
        args = [self.cfg.tool, "record", "--idle", "--threads", "--format", "chrometrace",
                "--rate", str(self.cfg.rate), "--pid", str(self.pid), "-o", self.path]
        if self.cfg.mode == "nonblocking":
            args.append("--nonblocking")
        return args

    def start(self) -> bool:
        """Start and wait until it samples; False (and ``error``) if it cannot."""
        self.started_ns = time.perf_counter_ns()
        try:
            with open(self.err_path, "wb") as err:
                self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                             stderr=err, process_group=0)  # see the module docstring
        except OSError as exc:
            self.error = f"cannot run {self.cfg.tool!r}: {exc.strerror or exc}"
            return False
        assert self.proc.stdout is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        buf = b""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    break
                buf += chunk
                if b"Sampling process" in buf:  # its sampling thread exists: raise it too
                    self.ready_ns = time.perf_counter_ns()
                    self.priority = prioritize(self.proc.pid)
                    self._drainer = threading.Thread(target=self._drain, daemon=True)
                    self._drainer.start()
                    return True
            elif self.proc.poll() is not None:
                break
        self._kill()
        try:
            with open(self.err_path, "rb") as f:
                text = f.read().decode("utf-8", "replace")
        except OSError:
            text = ""
        self.error = _why(text + buf.decode("utf-8", "replace"), self.cfg.tool, self.proc.returncode) \
            if self.proc.returncode is not None else f"{self.cfg.tool} did not start sampling"
        return False

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        try:
            while chunk := self.proc.stdout.read(4096):
                self._said = (self._said + chunk)[-4096:]
                behind = behind_s(chunk)
                self._behind += behind
                if behind and self.priority == "realtime":  # its own cost, not the scheduler's
                    self.priority = prioritize(self.proc.pid, realtime=False)
        except (OSError, ValueError):
            pass

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """SIGINT: py-spy stops sampling and writes the chunk (waited for by ``wait``)."""
        if not self.alive():
            return
        self.stopped_ns = time.perf_counter_ns()
        try:
            self.proc.send_signal(signal.SIGINT)  # type: ignore[union-attr]
        except ProcessLookupError:
            pass

    def wait(self) -> None:
        if self.proc is None:
            return
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._kill()
            self.error = f"{self.cfg.tool} did not write its chunk within {STOP_TIMEOUT_S:.0f} s"
        if self._drainer is not None:
            self._drainer.join(2.0)
        self.compress()

    def compress(self) -> None:
        """chrometrace JSON is ~16 MB per minute at c=32: kept zstd-compressed (~15x smaller)
        until the run ends and the finalizer reads it."""
        if not os.path.exists(self.path):
            return
        import zstandard
        try:
            with open(self.path, "rb") as src, open(self.path + ".zst.tmp", "wb") as dst:
                zstandard.ZstdCompressor(level=3).copy_stream(src, dst)
            os.replace(self.path + ".zst.tmp", self.path + ".zst")
            os.unlink(self.path)
        except OSError:
            pass

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def meta(self) -> dict[str, Any]:
        path = self.path + ".zst" if os.path.exists(self.path + ".zst") else self.path
        return {"pid": self.pid, "index": self.index, "path": os.path.basename(path),
                "started_ns": self.started_ns, "ready_ns": self.ready_ns,
                "stopped_ns": self.stopped_ns, "error": self.error, "priority": self.priority, **self.counts()}

    def counts(self) -> dict[str, Any]:
        """py-spy's own count of the samples it took and of those it failed to read (its
        last line: "Samples: N Errors: M"; empty before it has said so), and how often and
        how far its sampling thread said it was behind."""
        m = re.search(rb"Samples: (\d+) Errors: (\d+)", self._said)
        out = {"pyspy_samples": int(m[1]), "pyspy_errors": int(m[2])} if m else {}
        if self._behind:  # its sampling thread ran late by more than a second this often
            out.update(pyspy_behind=len(self._behind), pyspy_behind_max_s=round(max(self._behind), 2))
        return out


def prioritize(pid: int, realtime: bool = True) -> str:
    """Raise every thread of process ``pid`` as far as allowed (``PYSPY_NICE``'s comment);
    "realtime", "nice" or "normal": what it got."""
    if realtime and _each_thread(pid, lambda t: os.sched_setscheduler(t, os.SCHED_FIFO, os.sched_param(1))):
        return "realtime"

    def nice(tid: int) -> None:
        os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
        os.setpriority(os.PRIO_PROCESS, tid, PYSPY_NICE)
    return "nice" if _each_thread(pid, nice) else "normal"


def _each_thread(pid: int, apply: Callable[[int], None]) -> bool:
    """``apply`` to every thread of ``pid`` (scheduling is per thread on Linux); False where
    not allowed. Listed again until no new thread shows: one started meanwhile took its
    starter's setting as it was then."""
    done: set[str] = set()
    for _ in range(5):
        try:
            tids = set(os.listdir(f"/proc/{pid}/task")) - done
        except OSError:
            return bool(done)
        if not tids:
            break
        for tid in tids:
            try:
                apply(int(tid))
            except PermissionError:
                return False
            except ProcessLookupError:  # a thread that ended meanwhile
                pass
        done |= tids
    return True


class Supervisor(threading.Thread):
    """Starts a py-spy for each process that announces itself; rotates them."""

    def __init__(self, cfg: FlameConfig) -> None:
        super().__init__(name="omnitrace-flame", daemon=True)
        self.cfg = cfg
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.address = f"\0omnitrace-flame-{os.getpid()}-{secrets.token_hex(4)}"  # abstract: no file
        self.sock.bind(self.address)
        self.current: dict[int, PySpy] = {}
        self.chunks: list[PySpy] = []
        self.failed: dict[int, str] = {}
        self.lock = threading.Lock()
        self.done = threading.Event()

    def run(self) -> None:
        starters: list[threading.Thread] = []
        rotation = threading.Thread(target=self._rotation, name="omnitrace-flame-rotation", daemon=True)
        rotation.start()
        while not self.done.is_set():
            ready, _, _ = select.select([self.sock], [], [], 0.5)
            if not ready:
                continue
            data = self.sock.recv(64)
            try:
                pid = int(data)
            except ValueError:
                continue
            with self.lock:
                known = pid in self.current or pid in self.failed
            if not known:  # started at once, off this loop: py-spy takes ~0.1 s to attach
                t = threading.Thread(target=self._begin, args=(pid,), daemon=True)
                t.start()
                starters.append(t)
        rotation.join()
        for t in starters:
            t.join(READY_TIMEOUT_S)

    def _rotation(self) -> None:
        while not self.done.wait(1.0):
            self._rotate()

    def _begin(self, pid: int, index: int = 0) -> PySpy | None:
        spy = PySpy(self.cfg, pid, index)
        with self.lock:
            if self.done.is_set():
                return None
            if index == 0:
                self.current[pid] = spy
            self.chunks.append(spy)
        if not spy.start():
            with self.lock:
                if index == 0 and os.path.exists(f"/proc/{pid}"):
                    self.failed[pid] = spy.error or "py-spy could not attach"
            return None
        return spy

    def _rotate(self) -> None:
        now = time.perf_counter_ns()
        with self.lock:
            due = [s for s in self.current.values()
                   if s.alive() and s.ready_ns and now - s.ready_ns >= self.cfg.rotate_s * 1e9]
        for old in due:
            new = self._begin(old.pid, old.index + 1)
            if new is None:
                continue
            with self.lock:
                self.current[old.pid] = new
            self.done.wait(CUTOVER_S)
            old.stop()
            threading.Thread(target=old.wait, daemon=True).start()  # then compress its chunk

    def finish(self) -> list[PySpy]:
        self.done.set()
        self.join()
        with self.lock:
            chunks = list(self.chunks)
        for c in chunks:
            c.stop()
        for c in chunks:
            c.wait()
        self.sock.close()
        return chunks


def preflight(cfg: FlameConfig) -> str | None:
    """Can the tool sample a process of ours? (``py-spy dump`` of this one.) None if so."""
    try:
        r = subprocess.run([cfg.tool, "dump", "--pid", str(os.getpid())], capture_output=True,
                           timeout=PREFLIGHT_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except OSError as exc:
        return f"cannot run {cfg.tool!r}: {exc.strerror or exc}"
    except subprocess.TimeoutExpired:
        return f"{cfg.tool} dump did not answer within {PREFLIGHT_TIMEOUT_S:.0f} s"
    if r.returncode != 0:
        return _why((r.stderr + r.stdout).decode("utf-8", "replace"), cfg.tool, r.returncode)
    return None


def _write_json(path: str, obj: Any) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(orjson.dumps(obj))
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 4 or argv[0] != "--config" or argv[2] != "--":
        console.text("usage: python -m omnitrace.profile.runner --config JSON -- COMMAND ...")
        return 2
    cfg = FlameConfig.from_json(argv[1])
    cmd = argv[3:]
    os.makedirs(cfg.raw_dir, exist_ok=True)
    env = dict(os.environ)
    env[ENV_FLAME] = cfg.to_json()
    status: dict[str, Any] = {"tool": cfg.tool, "mode": cfg.mode, "rate": cfg.rate,
                              "config": orjson.loads(cfg.to_json()), "offset_ns": clock_offset_ns()}
    sup: Supervisor | None = None
    why = preflight(cfg)
    if why is None:
        sup = Supervisor(cfg)
        sup.start()
        env[ENV_FLAME_SOCKET] = sup.address[1:]
        if cfg.api == "pyinstrument":
            env[ENV_FLAME_INPROC] = "api"
    else:
        status["error"] = why
        env[ENV_FLAME_INPROC] = "all"
        console.say("run", f"warning: flame graphs: py-spy cannot sample ({why}); the API server "
                    "and stage processes profile their main thread in-process with pyinstrument instead "
                    "(slower, no sender/receiver threads)")
    try:
        child: subprocess.Popen | None = subprocess.Popen(cmd, env=env)
    except OSError as exc:
        console.say("run", f"{cmd[0]}: {exc.strerror}")
        child = None

    def forward(signum: int, _frame: object) -> None:
        if child is not None:
            try:
                child.send_signal(signum)
            except ProcessLookupError:
                pass

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, forward)
    rc = 127 if child is None else childproc.shell_status(child.wait())
    chunks = sup.finish() if sup is not None else []
    status["chunks"] = [c.meta() for c in chunks]
    status["failed"] = {str(k): v for k, v in (sup.failed.items() if sup else ())}
    _write_json(os.path.join(cfg.raw_dir, "runner.json"), status)
    return rc


if __name__ == "__main__":
    sys.exit(main())
