"""The package stays readable: no function over 80 lines (split it where it changes
subject, as analyze/report.py's phases are)."""
from __future__ import annotations

import ast
import os

from tests.support.sources import ROOT


MAX_LINES = 80


def test_no_function_over_80_lines():
    from tests.support.sources import modules
    long = []
    for path in modules().values():
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        long += [f"{os.path.relpath(path, ROOT)}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)"
                 for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and n.end_lineno - n.lineno + 1 > MAX_LINES]
    assert not long, long


def test_tests_share_helpers_one_way():
    """Helpers live in tests/support and are imported as ``tests.support.X``; a test file
    (tests/unit/..., tests/system/...) never imports another test file."""
    tests = os.path.join(ROOT, "tests")
    helpers = {n[:-3] for n in os.listdir(os.path.join(tests, "support")) if n.endswith(".py")}
    bad = []
    for path in _python_files(tests):
        name = os.path.relpath(path, tests)
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for m in mods:
                head = m.split(".")[0]
                if head.startswith("test_") or head in helpers | {"unit", "system"} or getattr(node, "level", 0) or (
                        m.startswith("tests.") and not m.startswith("tests.support")):
                    bad.append(f"{name}:{node.lineno} imports {'.' * getattr(node, 'level', 0)}{m}")
    assert not bad


def _python_files(top: str) -> list[str]:
    out = []
    for root, dirs, files in os.walk(top):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        out += [os.path.join(root, n) for n in files if n.endswith(".py")]
    return sorted(out)
