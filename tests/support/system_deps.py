"""System packages the tests drive for real. A missing one fails the test that needs it
with the package's name and how to get it (scripts/test.sh installs them as root), never
a skip that hides it or a traceback from deep inside the test."""
from __future__ import annotations

import os
import shutil

import pytest


def need(tool: str, package: str, path: str | None = None) -> str:
    """The tool's path; fails the calling test when it is missing."""
    found = path if path and os.path.exists(path) else shutil.which(tool)
    if not found:
        pytest.fail(f"needs `{tool}` from the Debian package {package}: run scripts/test.sh as root, "
                    f"or sudo apt-get install --no-install-recommends {package}", pytrace=False)
    return found
