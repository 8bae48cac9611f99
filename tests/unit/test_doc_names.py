"""The docs name only code that exists: every omnitrace module, file, class, function or
attribute that README.md and docs/*.md cite in backticks or in a diagram (``spantable.SpanBuilder``,
``agent/recorder.py``, ``Collector.read_raw``) resolves in the source (read with ast; nothing
is imported). Names of other projects (vLLM-Omni's ``delivery.py``) are not checked: a
dotted name is checked when its head is one of omnitrace's modules or classes, a file name
when its path starts with one of omnitrace's folders."""
from __future__ import annotations

import ast
import glob
import os
import re
from functools import cache

import pytest

from tests.support.sources import ROOT, TREES, modules

DOCS = [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]
DOTTED = re.compile(r"(?<![\w./-])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?![\w/(*-]|\.[\w*])")
# a file's name, not a module's member (``bench.json``, ``report.html``)
EXTENSIONS = {"json", "jsonl", "html", "yaml", "yml", "md", "zst", "npz", "svg", "txt", "bin", "csv",
              "parquet", "toml", "sh", "log", "gz", "pb", "perfetto"}
# `agent.json: record.events_not_recorded`, `--json: recorder.accounting`: a path into a JSON file
JSON_PATH = re.compile(r"^(?:[\w.-]+\.jsonl?|--json):\s")
FILE = re.compile(r"(?<![\w./-])((?:[\w-]+/)+[\w-]+\.py|[\w-]+\.py)\b")


@cache
def _members() -> dict[str, dict[str, set[str]]]:
    """module name -> {"": top-level names, class name: its attribute names}."""
    out = {}
    for mod, path in modules().items():
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        names: dict[str, set[str]] = {"": set()}
        for node in tree.body:
            names[""].update(_defined(node))
            if isinstance(node, ast.ClassDef):
                names[node.name] = {n for item in node.body for n in _defined(item)}
        out[mod] = names
    return out


def _defined(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    return set()


def _modules_named(head: str) -> list[str]:
    """The modules a doc may mean by ``head`` (``walk``, ``agent.views``, ``omnitrace.record``);
    the hook definitions only by their package's name (``vllm_omni.X`` is vLLM-Omni's)."""
    return [m for m in _members() if m == head or m.endswith("." + head)
            and (not m.startswith("omnitrace.patches") or head.startswith("patches"))]


def _classes_named(name: str) -> list[tuple[str, str]]:
    return [(m, name) for m, names in _members().items() if name in names and name != ""]


def resolves(dotted: str) -> bool | None:
    """True/False when ``dotted`` is an omnitrace name that exists / does not; None when it
    is not omnitrace's (its head is no module or class of the package)."""
    parts = dotted.split(".")
    candidates = []
    for cut in range(len(parts), 0, -1):
        for mod in _modules_named(".".join(parts[:cut])):
            candidates.append((mod, parts[cut:]))
    if not candidates and parts[0][:1].isupper():
        candidates = [(m, parts) for m, _ in _classes_named(parts[0])]
    if not candidates:
        return None
    return any(_has(mod, rest) for mod, rest in candidates)


def _has(mod: str, rest: list[str]) -> bool:
    names = _members()[mod]
    if not rest:
        return True
    if rest[0] not in names[""]:
        return False
    return len(rest) == 1 or rest[0] in names and rest[1] in names[rest[0]]  # Class.member


@cache
def _folders() -> frozenset[str]:
    """The package's top folders (``agent``, ``analyze``, ...) and the repository's own."""
    return frozenset({os.path.relpath(os.path.dirname(p), tree).split(os.sep)[0]
                      for tree in TREES for p in modules().values() if p.startswith(tree + os.sep)}
                     | {"patches", "benchmarks", "scripts", "tests"})


def _file_exists(path: str) -> bool | None:
    path = path.removeprefix("omnitrace/")
    if "/" not in path or path.split("/")[0] not in _folders():
        return None
    return any(os.path.exists(os.path.join(base, path))
               for base in (*TREES, ROOT, os.path.join(ROOT, "omnitrace")))


@cache
def _literals() -> frozenset[str]:
    """Every string constant of the package: names of metrics, attributes, SSE events and
    vLLM-Omni's modules that docs cite are values, not code."""
    out = set()
    for path in modules().values():
        with open(path) as f:
            out.update(n.value for n in ast.walk(ast.parse(f.read(), path))
                       if isinstance(n, ast.Constant) and isinstance(n.value, str))
    # metrics.jsonl names its counters after the Prometheus families: omnitrace_a_b -> omnitrace.a.b
    return frozenset(out | {s.replace("_", ".") for s in out if s.startswith("omnitrace_")})


def cited(text: str) -> set[str]:
    """The code names a doc cites: in backticks, and in the fenced diagrams."""
    spans = re.findall(r"`([^`\n]+)`", text) + re.findall(r"```\n(.*?)```", text, re.S)
    names = {m for s in spans if not JSON_PATH.match(s) for m in DOTTED.findall(s) + FILE.findall(s)}
    return {n for n in names if n.rsplit(".", 1)[-1] not in EXTENSIONS and not _is_value(n)
            and not any(part.isupper() for part in re.split(r"[/.]", n))}  # NAME.py: a placeholder


def _is_value(name: str) -> bool:
    return any(lit == name or lit.startswith(name + ".") for lit in _literals())


def missing(text: str) -> list[str]:
    out = []
    for name in sorted(cited(text)):
        ok = _file_exists(name) if name.endswith(".py") else resolves(name)
        if ok is False:
            out.append(name)
    return out


@pytest.mark.parametrize("path", DOCS, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_name_a_doc_cites_exists(path):
    with open(path, encoding="utf-8") as f:
        assert missing(f.read()) == []


def test_the_checker_finds_names_that_do_not_exist():
    text = ("`Collector.read_raw` `spantable.NoSuchBuilder` `agent/nosuch.py` "
            "`spantable.SpanBuilder` `agent/recorder.py` `vllm_omni.delivery` `delivery.py`")
    assert missing(text) == ["Collector.read_raw", "agent/nosuch.py", "spantable.NoSuchBuilder"]
