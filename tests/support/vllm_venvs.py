"""The vLLM-Omni venvs the tests run the real classes in, and the driver they run."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path


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
