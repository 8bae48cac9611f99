"""`omnitrace top [RUN_DIR | URL]`: the load test, live, in a terminal.

Refreshing tables and sparklines of request rate, TTFP p50/p99, where TTFP goes (live
attribution), FIFO residence and depth per stage, the head-of-line leaderboard and the
recorder's and exporters' losses. On a terminal it redraws in place (alternate screen) and
exits on ``q`` or Ctrl-C; otherwise (a pipe, a file) it prints plain tables, one per
refresh, ``-n`` times.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import select
import sys
import time
from collections import deque
from typing import Any, Iterator

from omnitrace.cli.helpformat import DefaultsFormatter
from omnitrace.top import model
from omnitrace.top.source import DEFAULT_URL, RunDirSource, Sample, SourceError, open_source
from omnitrace import console

_SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float]) -> str:
    vals = [x for x in values if x is not None]
    if not vals:
        return ""
    hi = max(vals) or 1.0
    return "".join(_SPARK[min(len(_SPARK) - 1, int(x / hi * (len(_SPARK) - 1)))] if x is not None else " "
                   for x in values)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f}"


def render(v: model.View, history: dict[str, deque], width: int = 100, height: int = 0) -> str:
    """The screen; with ``height``, the longest lists (attribution, culprits) are cut to
    fit it (an 80x24 terminal keeps every section)."""
    rows, culprits = 10, 5
    while True:
        out = _lines(v, history, rows, culprits)
        if not height or len(out) <= height or rows + culprits <= 4:
            return "\n".join(line[:width] for line in out[:height or None])
        if rows > culprits + 1 or culprits <= 1:
            rows -= 1
        else:
            culprits -= 1


def _lines(v: model.View, history: dict[str, deque], rows: int, culprits: int) -> list[str]:
    out = []
    when = (f"whole run, {v.whole_run_s:.1f} s" if v.whole_run_s else
            f"last {v.window_s:.1f} s" if v.window_s else "whole run")
    # the source last: a long run directory's path is what a narrow terminal cuts
    out.append(f"omnitrace top — {when}" + (f" — {v.note}" if v.note else "") + f" — {v.source}")
    out.append("")
    if v.window_s:
        flow = f"{v.started_per_s:6.2f}/s in  {v.finished_per_s:6.2f}/s out"
    elif v.whole_run_s:
        flow = f"{v.finished:.0f} measured"
    else:
        flow = f"{v.started:.0f} in  {v.finished:.0f} out"
    out.append(f"requests  {flow}  in flight {v.in_flight:.0f}  failed {v.failed:.0f}   "
               f"{sparkline(list(history['rate']))}")
    out.append(f"TTFP      p50 {_ms(v.ttfp[0]):>8} ms  p99 {_ms(v.ttfp[1]):>8} ms   "
               f"{sparkline(list(history['ttfp_p99']))}")
    if not v.whole_run_s:  # the report has no TTFT quantiles
        out.append(f"TTFT      p50 {_ms(v.ttft[0]):>8} ms  p99 {_ms(v.ttft[1]):>8} ms")
    out.append("")
    out.append(f"Where TTFP goes ({v.attributed:.0f} requests attributed; mean ms per request)")
    if v.attribution:
        out.append(f"  {'stage':<14} {'category':<14} {'ms':>9} {'share':>7}")
        for stage, cat, ms, share in v.attribution[:rows]:
            bar = "█" * max(1, int(share * 30))
            out.append(f"  {stage:<14} {cat:<14} {ms:9.2f} {share * 100:6.1f}% {bar}")
    else:
        out.append("  (no request finished in this window)")
    out.append("")
    out.append("FIFO residence per stage")
    if v.fifo:
        out.append(f"  {'stage':<14} {'p50 ms':>9} {'p99 ms':>9} {'depth max' if v.whole_run_s else 'depth p99':>10} "
                   f"{'blocked':>8} {'tasks/s' if v.window_s else 'tasks':>9}")
        for st, (p50, p99, depth, blocked, tps) in v.fifo.items():
            d = "-" if depth is None else f"{depth:.0f}"
            b = "-" if blocked is None else f"{blocked * 100:.1f}%"
            out.append(f"  {st:<14} {p50:9.3f} {p99:9.3f} {d:>10} {b:>8} "
                       + (f"{tps:9.1f}" if v.window_s else f"{tps:9.0f}"))
    else:
        out.append("  (no FIFO task yet)")
    if v.snapshot:
        out.append("  snapshot p50/p99 ms: " + ", ".join(f"{st} {a:.3f}/{b:.3f}"
                                                        for st, (a, b) in v.snapshot.items()))
    out.append("")
    out.append("Head-of-line: whose tasks others' first packets waited behind"
               + (f" ({v.culprits_note})" if v.culprits_note else ""))
    if v.culprits:
        for c in v.culprits[:culprits]:
            over = f" over {c['victims']} request(s)" if c.get("victims") is not None else ""
            out.append(f"  {c['culprit'][:48]:<48} {c['blocked_s'] * 1e3:9.2f} ms{over}")
    else:
        out.append("  (none yet)")
    out.append("")
    out.append(f"recorder: events {v.events:.0f}, dropped {v.dropped:.0f}   agent lag {v.lag_s:.2f} s   "
               f"exporters lost {v.export_lost:.0f} spans, sampled out {v.sampled_out:.0f}")
    a = v.accounting
    if a:  # the run's identity as the agent knows it now (the report closes it at the end)
        terms = [(a["dropped_in_rings"], "dropped"), (a["not_drained_yet"], "in rings"),
                 (a["in_flight"], "in flight"), (a["not_recorded"], "not recorded")]
        out.append(f"events: {a['events_written']} written = {a['recorded']} recorded"
                   + "".join(f" + {n} {what}" for n, what in terms if n))
    return out


def _show_finished(src: RunDirSource, history: dict[str, deque], tty: bool) -> int:
    """A finished run: its whole window as the report computes it, shown once (on a
    terminal until q)."""
    from omnitrace.analyze.report import build_report
    from omnitrace.analyze.rundir import RunDirError, load_run
    try:
        v = model.from_report(build_report(load_run([src.path])), src.label)
    except RunDirError as exc:
        console.say("top", f"{exc}")
        return 2
    if not tty:
        print(render(v, history, 120), flush=True)
        return 0
    with _fullscreen() as keys:
        size = os.get_terminal_size()
        _draw(render(v, history, size.columns, size.lines - 2), "\r\n(q quits)")
        while not keys.wait(3600).lower().startswith("q"):
            pass
    return 0


class _Keys:
    """Single keys from a terminal without echo (q quits), restored on exit."""

    def __init__(self) -> None:
        import termios
        import tty
        self.fd = sys.stdin.fileno()
        self.saved = termios.tcgetattr(self.fd)
        tty.setcbreak(self.fd)

    def wait(self, timeout: float) -> str:
        r, _, _ = select.select([self.fd], [], [], timeout)
        return os.read(self.fd, 16).decode(errors="ignore") if r else ""

    def restore(self) -> None:
        import termios
        termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)


@contextlib.contextmanager
def _fullscreen() -> Iterator[_Keys]:
    """The alternate screen without a cursor, keys without echo; all restored on exit
    (Ctrl-C ends it quietly)."""
    keys = _Keys()
    sys.stdout.write("\x1b[?1049h\x1b[?25l")
    try:
        yield keys
    except KeyboardInterrupt:
        pass
    finally:
        keys.restore()
        sys.stdout.write("\x1b[?25h\x1b[?1049l")
        sys.stdout.flush()


def _draw(text: str, footer: str) -> None:
    sys.stdout.write("\x1b[H\x1b[2J" + text.replace("\n", "\r\n") + footer)
    sys.stdout.flush()


def _loop(src: Any, prev: Sample | None, history: dict[str, deque], tty: bool, keys: _Keys | None,
          iterations: int | None, interval: float) -> int:
    """Redraw every ``interval`` s (on a terminal, in place until q)."""
    shown = 0
    while iterations is None or shown < iterations:
        try:
            cur = src.read()
            if prev is not None and prev.live != cur.live:
                prev = None
            v = model.build(cur, prev, src.label)
            history["rate"].append(v.started_per_s)
            history["ttfp_p99"].append(v.ttfp[1])
            size = os.get_terminal_size() if tty else None
            text = render(v, history, size.columns if size else 120, size.lines - 2 if size else 0)
            if cur.live or prev is None:
                prev = cur
        except SourceError as exc:
            if not tty:
                console.say("top", f"{exc}")
                return 1
            text = f"omnitrace top — {src.label}\n\n{exc} (retrying; q quits)"
        shown += 1
        if keys is not None:
            _draw(text, "\r\n\r\n(q quits)")
            if keys.wait(interval).lower().startswith("q"):
                break
        else:
            print(text + "\n", flush=True)
            if iterations is None or shown < iterations:
                time.sleep(interval)
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="omnitrace top", description=__doc__.split("\n\n")[0],
                                formatter_class=DefaultsFormatter)
    p.add_argument("source", nargs="?", default=DEFAULT_URL,
                   help="a run directory, or the agent's metrics URL")
    p.add_argument("-i", "--interval", type=float, default=2.0, help="seconds between refreshes")
    p.add_argument("-n", "--iterations", type=int, default=argparse.SUPPRESS,
                   help="refreshes before exiting (on a terminal: until q / Ctrl-C; otherwise 1)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.interval <= 0:
        console.say("top", "--interval must be > 0")
        return 2
    try:
        src = open_source(args.source)
    except SourceError as exc:
        console.say("top", f"{exc}")
        return 2
    tty = sys.stdout.isatty() and sys.stdin.isatty()
    iterations = getattr(args, "iterations", None if tty else 1)
    if iterations is not None and iterations < 1:
        console.say("top", "--iterations must be >= 1")
        return 2
    history = {"rate": deque(maxlen=40), "ttfp_p99": deque(maxlen=40)}
    if isinstance(src, RunDirSource) and src.finished():
        return _show_finished(src, history, tty)
    prev: Sample | None = None
    if isinstance(src, RunDirSource):  # rates between its last two messages until live
        try:
            samples = src.file_samples()
            prev = samples[0] if len(samples) > 1 else None
        except SourceError:
            pass
    rc = 0
    with _fullscreen() if tty else contextlib.nullcontext() as keys:
        try:
            rc = _loop(src, prev, history, tty, keys, iterations, args.interval)
        except KeyboardInterrupt:
            pass
    return rc
