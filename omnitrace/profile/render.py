"""Collapsed stacks -> speedscope JSON and a flame-graph SVG; stretches of one stack in
time order -> a speedscope timeline.

The SVG is written here rather than by py-spy (``--format flamegraph``) because py-spy
draws only what it recorded itself, while omnitrace draws *selections* of samples (a
stage, a thread, the intervals of some spans); no maintained Python package renders
collapsed stacks to SVG. A ``<title>`` tooltip per frame, and a small inline script for
click-to-zoom and search (as flamegraph.pl's); nothing is fetched, so it works offline,
standalone and embedded in the HTML report.
"""
from __future__ import annotations

import hashlib
import html
from typing import Iterable

Collapsed = dict[tuple[str, ...], float]  # stack of frame labels (root first) -> seconds

SCHEMA = "https://www.speedscope.app/file-format-schema.json"


Ordered = list[tuple[tuple[str, ...], float]]  # (stack, seconds) in time order


def speedscope(profiles: Iterable[tuple[str, Collapsed | Ordered]], name: str) -> dict:
    """A speedscope file with one sampled profile per (name, stacks); weights in
    milliseconds. Collapsed stacks (a dict) are merged, one entry per distinct stack: read
    them in Left Heavy or Sandwich. An ordered list keeps its order, so speedscope's time
    order shows the samples as they came (a selection: the spans' time, the gaps between
    them left out)."""
    frames: list[dict] = []
    index: dict[str, int] = {}
    out = []
    for pname, stacks in profiles:
        samples, weights = [], []
        for stack, sec in (sorted(stacks.items()) if isinstance(stacks, dict) else stacks):
            ids = []
            for label in stack:
                i = index.get(label)
                if i is None:
                    i = index[label] = len(frames)
                    fname, _, file = label.partition(" (")
                    frames.append({"name": fname, "file": file[:-1]} if file else {"name": label})
                ids.append(i)
            samples.append(ids)
            weights.append(round(sec * 1e3, 3))
        total = round(sum(weights), 3)
        out.append({"type": "sampled", "name": pname, "unit": "milliseconds", "startValue": 0,
                    "endValue": total, "samples": samples, "weights": weights})
    return {"$schema": SCHEMA, "shared": {"frames": frames}, "profiles": out, "name": name,
            "activeProfileIndex": 0, "exporter": "omnitrace"}


Stretch = tuple[int, int, tuple[str, ...]]  # (start ns, end ns, stack of labels, root first)


def speedscope_timeline(threads: Iterable[tuple[str, list[Stretch]]], name: str) -> dict:
    """A speedscope file whose time-order view is what happened: one evented profile per
    thread, each stretch of one stack opened at its first sample and closed at its end,
    nothing open between stretches (the thread was not seen on a stack then). Times in
    milliseconds since the file's first stretch, so every thread shares one time axis."""
    threads = [(n, st) for n, st in threads]
    origin = min((st[0][0] for _, st in threads if st), default=0)
    frames: list[dict] = []
    index: dict[str, int] = {}

    def fid(label: str) -> int:
        i = index.get(label)
        if i is None:
            i = index[label] = len(frames)
            fname, _, file = label.partition(" (")
            frames.append({"name": fname, "file": file[:-1]} if file else {"name": label})
        return i

    def ms(t: int) -> float:
        return round((t - origin) / 1e6, 3)

    out = []
    for tname, stretches in threads:
        events: list[dict] = []
        open_: list[int] = []
        last = origin
        for start, end, stack in stretches:
            ids = [fid(x) for x in stack]
            start = max(start, last)
            if open_ and start > last:  # a gap: nothing was seen running in it
                events += [{"type": "C", "at": ms(last), "frame": f} for f in reversed(open_)]
                open_ = []
            k = 0
            while k < min(len(open_), len(ids)) and open_[k] == ids[k]:
                k += 1
            events += [{"type": "C", "at": ms(start), "frame": f} for f in reversed(open_[k:])]
            events += [{"type": "O", "at": ms(start), "frame": f} for f in ids[k:]]
            open_, last = ids, max(end, start)
        events += [{"type": "C", "at": ms(last), "frame": f} for f in reversed(open_)]
        begin = ms(stretches[0][0]) if stretches else 0.0
        out.append({"type": "evented", "name": tname, "unit": "milliseconds", "startValue": begin,
                    "endValue": ms(last) if stretches else 0.0, "events": events})
    return {"$schema": SCHEMA, "shared": {"frames": frames}, "profiles": out, "name": name,
            "activeProfileIndex": 0, "exporter": "omnitrace"}


class _Node:
    __slots__ = ("name", "total", "children")

    def __init__(self, name: str) -> None:
        self.name, self.total, self.children = name, 0.0, {}


def _tree(stacks: Collapsed) -> _Node:
    root = _Node("all")
    for stack, sec in stacks.items():
        root.total += sec
        node = root
        for label in stack:
            child = node.children.get(label)
            if child is None:
                child = node.children[label] = _Node(label)
            child.total += sec
            node = child
    return root


def _color(name: str) -> str:
    h = hashlib.md5(name.encode()).digest()
    return f"rgb({205 + h[0] % 50},{80 + h[1] % 130},{h[2] % 55})"  # flamegraph.pl's warm hues


def _layout(stacks: Collapsed, width: int, min_px: float) -> tuple[list[tuple[float, float, int, _Node]], _Node]:
    """Frames as (x, width, depth, node), root first; those narrower than ``min_px`` left out."""
    root = _tree(stacks)
    rects: list[tuple[float, float, int, _Node]] = []

    def walk(node: _Node, x: float, depth: int) -> None:
        w = node.total / root.total * width if root.total else 0.0
        if w < min_px:
            return
        rects.append((x, w, depth, node))
        cx = x
        for child in sorted(node.children.values(), key=lambda n: n.name):
            walk(child, cx, depth + 1)
            cx += child.total / root.total * width

    if root.total > 0:
        walk(root, 0.0, 0)
    return rects, root


def svg(stacks: Collapsed, title: str, subtitle: str = "", width: int = 1200,
        min_px: float = 0.5, hidden: Collapsed | None = None, hidden_name: str = "waiting") -> str:
    """A flame graph (root at the bottom); frames narrower than ``min_px`` are left out.
    ``hidden``: more stacks (threads waiting), drawn only on request: a "Show waiting"
    control switches to the graph of both."""
    row, pad_top, pad_bot = 16, 44, 8
    layouts = [_layout(stacks, width, min_px)]
    if hidden:
        layouts.append(_layout({**stacks, **hidden}, width, min_px))
    depth_max = max((d for rects, _ in layouts for _, _, d, _ in rects), default=0)
    height = pad_top + (depth_max + 1) * row + pad_bot
    total = layouts[0][1].total
    svg_id = "flame-" + hashlib.md5(repr((title, subtitle, sorted(stacks.items()),
                                          sorted((hidden or {}).items()))).encode()).hexdigest()[:12]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" id="{svg_id}" class="omnitrace-flame" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}" font-family="Verdana,sans-serif" '
           f'font-size="11" data-total-s="{total:.6f}">',
           '<rect width="100%" height="100%" fill="#fafafa"/>',
           f'<text x="{width / 2}" y="18" text-anchor="middle" font-size="15">{html.escape(title)}</text>',
           f'<text x="{width / 2}" y="34" text-anchor="middle" fill="#555">{html.escape(subtitle)}</text>']
    if not layouts[0][0]:
        out.append(f'<text x="{width / 2}" y="{pad_top + 12}" text-anchor="middle" fill="#777">'
                   'no samples</text>')
    for i, (rects, root) in enumerate(layouts):
        out.append(f'<g class="layout" data-total-s="{root.total:.6f}"' + (' style="display:none">' if i else '>'))
        out.extend(_frame(x, w, depth, node, root.total, height - pad_bot - (depth + 1) * row, row)
                   for x, w, depth, node in rects)
        out.append("</g>")
    if layouts[0][0] or len(layouts) > 1:
        ctl = ""
        if len(layouts) > 1:
            sec = sum(hidden.values())  # type: ignore[union-attr]
            ctl = (f'<text class="ctl" id="SVG_ID-hidden" x="110" y="18" fill="#36c" style="cursor:pointer" '
                   f'data-show="Show {hidden_name} ({sec:.1f} s)" data-hide="Hide {hidden_name}">'
                   f'Show {hidden_name} ({sec:.1f} s)</text>\n')
        out.append((ctl + _ZOOM).replace("SVG_ID", svg_id).replace("WIDTH", str(width)))
    out.append("</svg>")
    return "\n".join(out)


def _frame(x: float, w: float, depth: int, node: _Node, total: float, y: float, row: int) -> str:
    pct = node.total / total * 100
    label = html.escape(node.name)
    tip = f"{label} — {node.total * 1e3:.1f} ms ({pct:.2f}%)"
    fill = "#d0d0d0" if depth == 0 else _color(node.name)
    text = ""
    if w > 30:
        chars = int((w - 6) / 6.5)
        shown = node.name if len(node.name) <= chars else node.name[:max(chars - 2, 1)] + ".."
        text = f'<text x="{x + 3:.1f}" y="{y + 11.5}">{html.escape(shown)}</text>'
    return (f'<g class="f" data-x="{x:.2f}" data-w="{w:.2f}" data-d="{depth}" data-n="{label}">'
            f'<title>{tip}</title><rect x="{x:.2f}" y="{y}" width="{w:.2f}" '
            f'height="{row - 1}" fill="{fill}" rx="2"/>{text}</g>')


# Click a frame: it and its descendants fill the width, its ancestors span it, the rest is
# hidden; click the background (or "Reset zoom") to go back. "Search" highlights frames
# whose name matches a regular expression and says what share of the time they hold. As
# flamegraph.pl does, in the SVG itself, so it works standalone and inside the HTML report.
_ZOOM = """<text class="ctl" id="SVG_ID-reset" x="6" y="18" fill="#36c" style="cursor:pointer">Reset zoom</text>
<text class="ctl" id="SVG_ID-search" x="WIDTH" dx="-6" y="18" text-anchor="end" fill="#36c" style="cursor:pointer">Search</text>
<script><![CDATA[(function () {
  var svg = document.getElementById("SVG_ID"), W = WIDTH;
  var layouts = svg.querySelectorAll("g.layout"), frames;
  function show(i) {  // one layout at a time: the working stacks, or with the hidden ones
    for (var j = 0; j < layouts.length; j++) layouts[j].style.display = i === j ? "" : "none";
    frames = Array.prototype.slice.call(layouts[i].querySelectorAll("g.f"));
  }
  show(0);
  function label(f, x, w) {
    var r = f.querySelector("rect"), t = f.querySelector("text"), n = f.getAttribute("data-n");
    r.setAttribute("x", x.toFixed(2)); r.setAttribute("width", w.toFixed(2));
    if (w <= 30) { if (t) t.textContent = ""; return; }
    if (!t) { t = document.createElementNS("http://www.w3.org/2000/svg", "text"); f.appendChild(t);
              t.setAttribute("y", (+r.getAttribute("y") + 11.5).toString()); }
    var chars = Math.floor((w - 6) / 6.5);
    t.setAttribute("x", (x + 3).toFixed(2));
    t.textContent = n.length <= chars ? n : n.slice(0, Math.max(chars - 2, 1)) + "..";
  }
  function zoom(g) {
    var x0 = g ? +g.getAttribute("data-x") : 0, w0 = g ? +g.getAttribute("data-w") : W;
    var d0 = g ? +g.getAttribute("data-d") : -1, k = W / w0, eps = 1e-3;
    frames.forEach(function (f) {
      var x = +f.getAttribute("data-x"), w = +f.getAttribute("data-w"), d = +f.getAttribute("data-d");
      if (d >= d0 && x >= x0 - eps && x + w <= x0 + w0 + eps) {
        f.style.display = ""; label(f, (x - x0) * k, w * k);
      } else if (d < d0 && x <= x0 + eps && x + w >= x0 + w0 - eps) {
        f.style.display = ""; label(f, 0, W);
      } else { f.style.display = "none"; }
    });
  }
  svg.addEventListener("click", function (e) {
    var t = e.target;
    if (t.id === "SVG_ID-hidden") {
      var on = layouts[1].style.display === "none";
      show(on ? 1 : 0); zoom(null);
      t.textContent = t.getAttribute(on ? "data-hide" : "data-show");
      return;
    }
    if (t.id === "SVG_ID-search") {
      var q = window.prompt("Search frames (regular expression)");
      if (q === null) return;
      var re = new RegExp(q), hit = 0;
      frames.forEach(function (f) {
        var r = f.querySelector("rect"), m = q !== "" && re.test(f.getAttribute("data-n"));
        if (!r.hasAttribute("data-fill")) r.setAttribute("data-fill", r.getAttribute("fill"));
        r.setAttribute("fill", m ? "rgb(230,0,230)" : r.getAttribute("data-fill"));
        if (m) {  // count a frame once, not again under a matching ancestor
          var outer = frames.some(function (a) {
            return a !== f && +a.getAttribute("data-d") < +f.getAttribute("data-d") &&
              re.test(a.getAttribute("data-n")) && +a.getAttribute("data-x") <= +f.getAttribute("data-x") &&
              +a.getAttribute("data-x") + +a.getAttribute("data-w") >= +f.getAttribute("data-x") + +f.getAttribute("data-w");
          });
          if (!outer) hit += +f.getAttribute("data-w");
        }
      });
      t.textContent = q === "" ? "Search" : "Matched: " + (hit / W * 100).toFixed(1) + "%";
      return;
    }
    var g = t.closest ? t.closest("g.f") : null;
    zoom(t.id === "SVG_ID-reset" ? null : g);
  });
})();]]></script>"""


def share(stacks: Collapsed, frame_name: str) -> float:
    """Fraction of the weight whose stack contains a frame whose function is ``frame_name``
    (a label ``name (file)`` matches on ``name``, or on the last dotted part of it)."""
    total = sum(stacks.values())
    if not total:
        return 0.0
    hit = 0.0
    for stack, sec in stacks.items():
        for label in stack:
            fn = label.partition(" (")[0]
            if fn == frame_name or fn.rsplit(".", 1)[-1] == frame_name:
                hit += sec
                break
    return hit / total
