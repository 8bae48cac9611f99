"""The package stays readable: no function over 100 lines (split it where it changes
subject, as analyze/report.py's phases are)."""
from __future__ import annotations

import ast
import os

import pytest

pytestmark = pytest.mark.unit

PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "omnitrace")
MAX_LINES = 100


def test_no_function_over_100_lines():
    long = []
    for root, dirs, files in os.walk(PKG):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                with open(path) as f:
                    tree = ast.parse(f.read(), path)
                long += [f"{os.path.relpath(path, PKG)}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)"
                         for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                         and n.end_lineno - n.lineno + 1 > MAX_LINES]
    assert not long, long
