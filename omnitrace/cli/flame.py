"""`omnitrace flame RUN`: flame graphs of a run recorded with `omnitrace run --flame`.

Without a selection it lists the run's profiles (and the missing ones, with why). With
``--category`` (and optionally ``--stage``, ``--thread``, ``--request``) it keeps only the
samples taken on the working thread while the chosen spans were open
(``omnitrace.profile.linked``), and writes them as speedscope JSON and an SVG flame graph.
With only ``--stage``/``--thread`` it draws that process / thread over the whole run.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import numpy as np
import orjson
from omnitrace import console
from omnitrace.cli.helpformat import OneLineParser
from omnitrace.runfiles.read import read_profiles_index


def _parser() -> argparse.ArgumentParser:
    from omnitrace.profile.linked import CATEGORIES, THREADS
    p = OneLineParser(prog="omnitrace flame", description=__doc__.split("\n")[0])
    p.add_argument("run_dir", metavar="RUN")
    p.add_argument("--stage", help="api, a stage name (thinker) or id (0, stage0)")
    p.add_argument("--thread", choices=THREADS, help="the thread whose samples to keep (default: "
                   "the one that does the category's work)")
    p.add_argument("--category", choices=CATEGORIES,
                   help="keep the samples inside these spans' intervals (attribution categories)")
    p.add_argument("--request", metavar="ID", help="only this request's spans (x-request-id)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="FILE.svg and FILE.speedscope.json (default: flame-<selection> in the "
                        "current directory)")
    p.add_argument("--top", type=int, default=12, help="functions listed on the console")
    p.add_argument("--json", action="store_true", help="the summary as JSON on stdout")
    return p


def _outputs(out: str | None, label: str) -> tuple[str, str]:
    base = out or f"flame-{label}"
    for ext in (".svg", ".speedscope.json", ".json"):
        if base.endswith(ext):
            base = base[:-len(ext)]
            break
    return base + ".svg", base + ".speedscope.json"


def _top(stacks: dict[tuple[str, ...], float], n: int) -> list[tuple[str, float, float]]:
    """(function, inclusive share, self share), by self share."""
    total = sum(stacks.values()) or 1.0
    incl: dict[str, float] = {}
    self_: dict[str, float] = {}
    for stack, sec in stacks.items():
        for label in set(stack):
            incl[label] = incl.get(label, 0.0) + sec
        if stack:
            self_[stack[-1]] = self_.get(stack[-1], 0.0) + sec
    leaf_first = sorted(incl, key=lambda k: (-self_.get(k, 0.0), -incl[k]))[:n]
    return [(k, incl[k] / total, self_.get(k, 0.0) / total) for k in leaf_first]


def _linked(run: str, store: Any, index: dict, args: argparse.Namespace
            ) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """A span-linked selection: (stretch indices, seconds each sample stands for, scaled
    to the spans' own time, summary fields)."""
    from omnitrace.profile import linked
    iv, _ = linked.intervals(run, args.category, args.stage, args.request, args.thread)
    idx, sampled = linked.select_time(store, iv)
    covered_s, unsampled_s = linked.covered_ns(iv) / 1e9, linked.unsampled_ns(store, iv) / 1e9
    err = linked.sampling_error_pct(sampled)
    split = linked.split_error_pp(sampled)
    return idx, linked.exact_split(sampled, covered_s), {
        "spans": iv.spans, "intervals": int(len(iv.start)), "interval_s": round(covered_s, 6),
        "seconds": round(covered_s, 6), "sampled_s": round(float(sampled.sum()), 6),
        "sampling_error_pct": None if err is None else round(err, 1),
        "split_error_pp": None if split is None else round(split, 1),
        "unsampled_s": round(unsampled_s, 6),
        "title": linked.selection_title(sampled, covered_s, iv.spans, 1e9 / store.period_ns, unsampled_s),
        "notes": iv.notes + linked.uncalibrated(index.get("clock") or [], store, idx)
        + linked.unsampled_note(unsampled_s, covered_s)}


def _usage(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Selections that mean nothing, and outputs with nowhere to go: one line, exit 2."""
    if args.request is not None and args.category is None:
        p.error("--request needs --category (a request's spans of one category; without "
                "one, --stage/--thread draw the whole profile)")
    folder = os.path.dirname(os.path.abspath(args.output)) if args.output else None
    if folder and not (os.path.isdir(folder) and os.access(folder, os.W_OK)):
        p.error(f"-o {args.output}: {folder} is not a folder that can be written")


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    _usage(p, args)
    from omnitrace.profile import linked, render
    from omnitrace.profile.store import collapsed, in_order
    run = args.run_dir
    if not os.path.isdir(run):
        console.say("flame", f"{run}: not a run directory")
        return 2
    try:
        store = linked.profiles_store(run)
    except linked.SelectError as exc:
        console.say("flame", f"{exc}")
        return 2
    index = read_profiles_index(run) or {"profiles": [], "missing": []}
    if args.category is None and args.stage is None and args.thread is None:
        return _list(run, index, store, args.json)
    summary: dict[str, Any] = {"run": run, "category": args.category, "stage": args.stage,
                               "thread": args.thread, "request": args.request}
    try:
        if args.category is not None:
            idx, secs, found = _linked(run, store, index, args)
            summary.update(found)
            n_samples, sub = len(idx), summary.pop("title")
        else:
            n_samples, idx, secs = _whole(run, store, args.stage, args.thread)
            summary.update(seconds=round(float(secs.sum()), 3))
            sub = f"{float(secs.sum()):.3f} s sampled ({n_samples} samples at {1e9 / store.period_ns:.0f} Hz)"
    except linked.SelectError as exc:
        console.say("flame", f"{exc}")
        return 2
    label = "-".join(x for x in (args.stage, args.category, args.thread, args.request) if x)
    stacks = collapsed(store, idx, secs)
    svg_path, ss_path = _outputs(args.output, label)
    title = f"omnitrace flame: {label}"
    try:
        with open(svg_path, "w", encoding="utf-8") as f:
            f.write(render.svg(stacks, title, sub))
        with open(ss_path, "wb") as f:
            f.write(orjson.dumps(render.speedscope([(label, in_order(store, idx, secs) if args.category
                                                     else stacks)], title)))
    except OSError as exc:
        console.say("flame", f"cannot write {exc.filename or svg_path}: {exc.strerror or exc}")
        return 2
    summary.update(samples=int(n_samples), svg=svg_path, speedscope=ss_path,
                   top=[{"function": k, "inclusive": round(i, 4), "self": round(s, 4)}
                        for k, i, s in _top(stacks, args.top)])
    if args.json:
        sys.stdout.write(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    print(f"{title}: {sub}")
    for note in summary.get("notes") or ():
        print(f"  note: {note}")
    if not len(idx):
        print("  no samples in these intervals (spans shorter than the sampling period, or the "
              "window/thread has no profile)")
    print(f"  {'self':>6} {'incl':>6}  function")
    for row in summary["top"]:
        print(f"  {row['self'] * 100:5.1f}% {row['inclusive'] * 100:5.1f}%  {row['function']}")
    print(f"wrote {svg_path} and {ss_path}")
    return 0


def _whole(run: str, store: Any, stage: str | None,
           thread: str | None) -> tuple[int, np.ndarray, np.ndarray]:
    """A stage's process (or one of its threads) over the whole profile: (samples, stretch
    indices, seconds), each stretch weighted by its duration (what was sampled)."""
    from omnitrace.profile import linked
    st = store.stretches
    mask = np.ones(len(st), bool)
    if stage is not None or thread is not None:
        rt = linked.open_index(run).threads
        pids = {int(i.get("pid", 0)) for i in rt.rings.values()}
        if stage is not None:
            sid = linked.resolve_stage(stage, rt)
            pids = {int(i.get("pid", 0)) for i in rt.rings.values() if int(i.get("stage", -9)) == sid}
        mask &= np.isin(st["pid"], np.fromiter(pids, np.int64, len(pids)))
        if thread is not None:
            k = linked.THREADS.index(thread)
            tids = {rt.thread_of(p, k) for p in pids} - {None}
            mask &= np.isin(st["tid"], np.fromiter(tids, np.int64, len(tids)))
    idx = np.flatnonzero(mask)
    return len(store.samples(mask)[0]), idx, (st["end"][idx] - st["t"][idx]) / 1e9


def _list(run: str, index: dict, store: Any, as_json: bool) -> int:
    if as_json:
        sys.stdout.write(orjson.dumps(index, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    print(f"profiles of {run} (py-spy {index.get('rate', '?')} Hz, {index.get('mode', '?')}, "
          f"window {index.get('window', 'run')}):")
    for p in index.get("profiles", []):
        extra = ""
        if p.get("rounds_known") is not None:
            extra += f" {p['rounds_known']:.0%} of nominal rounds written"
        if p.get("unsampled_s", 0) >= 0.05:
            extra += f", not sampled for {p['unsampled_s']:.1f} s (py-spy fell behind)"
        if p.get("pyspy_behind"):
            extra += f", py-spy ran behind {p['pyspy_behind']} times (up to {p['pyspy_behind_max_s']} s)"
        if p.get("pyspy_errors"):
            extra += f", {p['pyspy_errors']} of py-spy's {p['pyspy_samples']} samples unreadable"
        extra += f" [{p['note']}]" if p.get("note") else ""
        print(f"  {p['name']:<12} pid {p['pid']:<7} {p.get('tool', '?'):<12} {p.get('seconds', 0):8.1f} s "
              f"profiles/{p['name']}.svg{extra}")
    for m in index.get("missing", []):
        print(f"  {m['name']:<12} pid {m['pid']:<7} MISSING: {m['reason']}")
    if any(c.get("pyspy_priority") in ("nice", "normal") for c in index.get("clock", [])):
        print("  py-spy did not run at real-time priority throughout (it needs CAP_SYS_NICE, and drops "
              "it when behind): on busy cores, spans shorter than ~1 ms can read low (docs/flame-graphs.md)")
    by_pid: dict[int, list[dict]] = {}
    for c in index.get("clock", []):
        by_pid.setdefault(int(c.get("pid", 0)), []).append(c)
    names = {p["pid"]: p["name"] for p in index.get("profiles", [])}
    for pid, chunks in sorted(by_pid.items()):
        ok = [c for c in chunks if c.get("calibrated")]
        line = f"  clock of {names.get(pid, pid)}: {len(ok)}/{len(chunks)} py-spy chunks calibrated"
        if ok:
            agree = [c["agreeing"] / max(c["clock_samples"], 1) for c in ok]
            line += (f", {min(agree):.0%}-{max(agree):.0%} of clock samples agree, "
                     f"{sum(c.get('late_rounds', 0) for c in ok)} late-stamped rounds left out of selections")
        bad = [c for c in chunks if not c.get("calibrated")]
        if bad:
            line += f"; not calibrated: {bad[0].get('error', 'no clock samples')}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
