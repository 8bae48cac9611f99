"""The vLLM-Omni venvs the tests run the real classes in, and the drivers they run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


ROOT = Path(__file__).resolve().parents[2]


DRIVER = ROOT / "tests" / "support" / "vllm_driver.py"
MRV2_DRIVER = ROOT / "tests" / "support" / "vllm_mrv2_driver.py"


DEFAULT_VENVS = [ROOT / ".venv-vllm", ROOT / ".venv-vllm-032"]
# venvs of older releases than the newest: the tests parametrized with them are marked
# vllm_older (conftest), run by .ci/run beside the default suite, not in it
OLDER_VENVS = {".venv-vllm"}


def _venvs() -> list[Path]:
    raw = os.environ.get("OMNITRACE_VLLM_VENVS")
    paths = [Path(p) for p in raw.split(os.pathsep) if p] if raw else DEFAULT_VENVS
    return [p for p in paths if (p / "bin" / "python").exists()]


def _omni_version(venv: Path) -> str:
    out = subprocess.run([str(venv / "bin" / "python"), "-c",
                          "import importlib.metadata as m; print(m.version('vllm-omni'))"],
                         capture_output=True, text=True, timeout=60)
    return out.stdout.strip()


def run_driver(venv: Path, run_dir: Path, *args: str, driver: Path = DRIVER, env: dict[str, str] | None = None,
               timeout: int = 240) -> tuple[subprocess.CompletedProcess, dict | None]:
    """``driver`` in ``venv``'s Python under ``omnitrace run``; its last JSON line."""
    cmd = [sys.executable, "-m", "omnitrace", "run", "--run-dir", str(run_dir), "--",
           str(venv / "bin" / "python"), str(driver), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, **(env or {})})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return proc, (json.loads(lines[-1]) if lines else None)


def omnitrace_warnings(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("omnitrace: ")]


def hooked_paths(venv: Path) -> set[str]:
    """The data paths omnitrace's hook set for the venv's vLLM-Omni instruments (its version
    read from the distribution record: no process started, so it can run at collection)."""
    from omnitrace.inject import patching

    infos = sorted((venv / "lib").glob("python*/site-packages/vllm_omni-*.dist-info"))
    if not infos:
        return set()
    version = infos[-1].name[len("vllm_omni-"):-len(".dist-info")]
    chosen = patching.choose(patching.load_patch_sets(), "vllm-omni", version)
    return {h.path for h in chosen.hooks} if chosen is not None else set()


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
