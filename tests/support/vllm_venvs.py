"""The vLLM-Omni venvs the tests run the real classes in, and the driver they run."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest


ROOT = Path(__file__).resolve().parents[2]


DRIVER = ROOT / "tests" / "support" / "vllm_driver.py"


DEFAULT_VENVS = [ROOT / ".venv-vllm", ROOT / ".venv-vllm-032"]


def _venvs() -> list[Path]:
    raw = os.environ.get("OMNITRACE_VLLM_VENVS")
    paths = [Path(p) for p in raw.split(os.pathsep) if p] if raw else DEFAULT_VENVS
    return [p for p in paths if (p / "bin" / "python").exists()]


def _omni_version(venv: Path) -> str:
    out = subprocess.run([str(venv / "bin" / "python"), "-c",
                          "import importlib.metadata as m; print(m.version('vllm-omni'))"],
                         capture_output=True, text=True, timeout=60)
    return out.stdout.strip()


def _serving(venv: Path) -> bool:
    stamp = venv / "omnitrace-install.txt"
    return stamp.exists() and "serving layer yes" in stamp.read_text()


def serving_params() -> list[Any]:
    """One pytest param per venv whose vLLM-Omni serving layer imports (a skip if none)."""
    found = _venvs()
    ok = [v for v in found if _serving(v)]
    if not ok:
        why = (f"no venv with vLLM-Omni's serving layer (have: {', '.join(v.name for v in found) or 'none'}); "
               "run VLLM_OMNI_TORCH=pypi scripts/install-vllm-omni.sh .venv-vllm 0.30.0")
        return [pytest.param(None, marks=pytest.mark.skip(reason=why))]
    return [pytest.param(v, id=v.name) for v in ok]
