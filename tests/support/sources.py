"""The package's source files by module name, as an installed omnitrace imports them:
``omnitrace/`` and the hook definitions at the top of the repository (``patches/``,
installed as ``omnitrace.patches``: setup.py's ``package_dir``)."""
from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# source folder -> the package name it installs as
TREES = {os.path.join(ROOT, "omnitrace"): "omnitrace", os.path.join(ROOT, "patches"): "omnitrace.patches"}


def modules() -> dict[str, str]:
    """Module name -> path of every .py file of the package."""
    out = {}
    for top, pkg in TREES.items():
        for root, dirs, files in os.walk(top):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in files:
                if name.endswith(".py"):
                    rel = os.path.relpath(os.path.join(root, name), top)[:-3].split(os.sep)
                    parts = [pkg, *(rel[:-1] if rel[-1] == "__init__" else rel)]
                    out[".".join(p for p in parts if p)] = os.path.join(root, name)
    return out
