"""`omnitrace hooks` on the real vLLM-Omni venvs: vLLM-Omni's own deploy files, read by its
own loader, select the paths their comments describe; every hook of the installed release
is found; a hook whose target vanished is reported missing (exit 1). In process:
tests/unit/inject/test_coverage.py."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from omnitrace import conventions as cv
from tests.support.vllm_venvs import ROOT, _venvs, hooked_paths


# --------------------------------------------------------------------------- real venvs
def _in_venv(venv: Path, *args: str, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / "python"), *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def _mrv2_venv_params() -> list:
    """Venvs whose release omnitrace hooks on the MRv2 path (0.30 on)."""
    found = [v for v in _venvs() if cv.PATH_MRV2 in hooked_paths(v)]
    if not found:
        why = "no vLLM-Omni venv with MRv2 hooks (0.30+): run scripts/install-vllm-omni.sh"
        return [pytest.param(None, marks=pytest.mark.skip(reason=why))]
    return [pytest.param(v, id=v.name) for v in found]


def _newest() -> Path:
    venvs = _venvs()
    if not venvs:
        pytest.skip("no vLLM-Omni venv")
    return venvs[-1]


def _deploys(venv: Path) -> Path:
    (d,) = venv.glob("lib/python*/site-packages/vllm_omni/deploy")
    return d


@pytest.mark.vllm
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("venv", _mrv2_venv_params())
def test_every_hook_of_the_installed_release_is_found_on_an_mrv2_deploy(venv: Path) -> None:
    """``qwen3_tts.yaml`` (``model_runner: v2``, both releases): the MRv2 hooks are on its
    path and, like every other hook of the release's set, found."""
    r = _in_venv(venv, "-m", "omnitrace", "hooks", "--deploy", "qwen3_tts.yaml", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert doc["complete"] and doc["counts"]["missing"] == 0, [s for s in doc["sites"] if s["status"] != "found"]
    assert doc["deploy"]["file"] == "qwen3_tts.yaml" and cv.PATH_MRV2 in doc["deploy"]["paths"]
    assert doc["deploy"]["stages"] and all(s["model_runner"] == "v2" for s in doc["deploy"]["stages"])
    assert doc["unhooked_paths"] == []
    mrv2 = [s for s in doc["sites"] if s["path"] == cv.PATH_MRV2]
    assert mrv2 and all(s["status"] == "found" for s in mrv2)
    assert any(s["target"].endswith("OmniRunnerDataPlane.complete_outputs") for s in mrv2)
    first_audio = [s for s in doc["sites"] if s["path"] == cv.PATH_TALKER_FIRST_AUDIO]
    has_sender = any(_deploys(venv).parent.glob("worker_v2/first_audio_sender.py"))
    assert bool(first_audio) == has_sender  # talker-first audio exists (and is hooked) from 0.32 on
    assert (cv.PATH_TALKER_FIRST_AUDIO in doc["deploy"]["paths"]) == has_sender


_PATHS_OF_DEPLOYS = r'''
import json, sys
from omnitrace.inject import coverage
out = {}
for label, name, platform, model in json.loads(sys.argv[1]):
    d = coverage.deploy_paths(coverage.deploy_file(name), platform, model)
    out[label] = {"paths": sorted(d.paths), "stages": d.stages, "notes": d.notes,
                  "connectors": d.connectors}
print(json.dumps(out))
'''


@pytest.mark.vllm
@pytest.mark.timeout(1200)
def test_deploy_files_select_the_paths_their_comments_describe(tmp_path: Path) -> None:
    """vLLM-Omni's own deploy files, read by its loader in one process: the base Qwen3-Omni
    deploy stays on V1; its MRv2 profile puts all three stages on v2 with talker-first audio
    (the tiny Qwen3-Omni's pipeline says each is native); Qwen3-TTS's ROCm section keeps V1
    (its comment: "keep V1 on NPU, XPU, ROCm and MUSA"); a Mooncake connector is named as
    unseen."""
    venv = _newest()
    tiny = venv / "tiny-qwen3-omni" / "model"
    mooncake = tmp_path / "mooncake.yaml"
    mooncake.write_text(f"base_config: {_deploys(venv) / 'qwen3_omni_moe.yaml'}\nconnectors:\n"
                        "  connector_of_shared_memory:\n    name: MooncakeConnector\n")
    cases = [("v1", "qwen3_omni_moe.yaml", "cuda", None), ("mrv2", "qwen3_omni_moe_mrv2.yaml", "cuda", None),
             ("tts-rocm", "qwen3_tts.yaml", "rocm", None), ("mooncake", str(mooncake), "cuda", None)]
    if tiny.is_dir():
        cases.append(("mrv2-model", "qwen3_omni_moe_mrv2.yaml", "cuda", str(tiny)))
    r = _in_venv(venv, "-c", _PATHS_OF_DEPLOYS, json.dumps(cases))
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    v1, mrv2, fa, shm = cv.PATH_V1_ADAPTER, cv.PATH_MRV2, cv.PATH_TALKER_FIRST_AUDIO, cv.PATH_SHM_CONNECTOR
    assert got["v1"]["paths"] == sorted({v1, shm}) and [s[1] for s in got["v1"]["stages"]] == ["v1"] * 3
    assert got["mrv2"]["paths"] == sorted({mrv2, v1, fa, shm}) and [s[1] for s in got["mrv2"]["stages"]] == ["v2"] * 3
    assert got["tts-rocm"]["paths"] == sorted({v1, shm})
    assert any("talker_first_audio is asked for but off" in n for n in got["tts-rocm"]["notes"])
    assert got["mooncake"]["paths"] == [v1] and got["mooncake"]["connectors"] == ["MooncakeConnector"]
    assert any("no omnitrace hooks for MooncakeConnector" in n for n in got["mooncake"]["notes"])
    if "mrv2-model" in got:  # the pipeline says every stage is native: the V1 adapter is off the path
        assert got["mrv2-model"]["paths"] == sorted({mrv2, fa, shm})
        assert [s[2] for s in got["mrv2-model"]["stages"]] == [True] * 3


@pytest.mark.vllm
@pytest.mark.timeout(1200)
def test_bad_input_in_a_real_venv_is_one_line_and_exit_2(tmp_path: Path) -> None:
    venv = _newest()
    broken = tmp_path / "broken.yaml"
    broken.write_text("stages: [\n")
    r = _in_venv(venv, "-m", "omnitrace", "hooks", "--deploy", str(broken))
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("omnitrace hooks:")]
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith(
        f"omnitrace hooks: cannot read deploy file {broken}: "), r.stderr[-2000:]
    assert "Traceback" not in r.stderr and r.stdout == ""
    r = _in_venv(venv, "-m", "omnitrace", "hooks", "--deploy", "no_such_deploy.yaml")
    assert r.returncode == 2 and "omnitrace hooks: no such deploy file: no_such_deploy.yaml" in r.stderr
    # a release omnitrace has no hook set for (a real distribution record, first on the path)
    site = tmp_path / "site"
    (site / "vllm_omni-0.99.0.dist-info").mkdir(parents=True)
    (site / "vllm_omni-0.99.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vllm-omni\nVersion: 0.99.0\n")
    r = _in_venv(venv, "-m", "omnitrace", "hooks", env={"PYTHONPATH": f"{site}{os.pathsep}{ROOT}"})
    assert r.returncode == 2 and r.stderr.strip().startswith(
        "omnitrace hooks: vllm-omni 0.99.0 is not a known version (known: "), r.stderr[-2000:]
    assert r.stderr.strip().endswith("omnitrace has no hooks for it") and "Traceback" not in r.stderr


@pytest.mark.vllm
@pytest.mark.timeout(1200)
def test_a_hook_whose_target_vanished_is_missing_and_exit_1(tmp_path: Path) -> None:
    """A hook set (yours, ``--patches``) for the installed release naming a method it no
    longer has: reported missing, named on stderr, exit 1; the one that exists is found."""
    venv = _newest()
    version = _in_venv(venv, "-c", "import importlib.metadata as m; print(m.version('vllm-omni'))").stdout.strip()
    (tmp_path / "mine.py").write_text(
        "from omnitrace.inject.patching import Hook\nTARGET = 'vllm-omni'\n"
        f"VERSIONS = ({version!r},)\n"
        "HOOKS = [Hook('timeout', 'vllm_omni.worker_v2.delivery', 'OmniDeliveryManager._timeout', lambda f: f),\n"
        "         Hook('renamed', 'vllm_omni.worker_v2.delivery', 'OmniDeliveryManager._expire', lambda f: f)]\n")
    r = _in_venv(venv, "-m", "omnitrace", "hooks", "--patches", str(tmp_path))
    assert r.returncode == 1, r.stderr[-2000:]
    assert "timeout" in r.stdout and "renamed" in r.stdout and "2 hooks: 1 found, 1 missing" in r.stdout
    assert "omnitrace hooks: 1 hook(s) on this deploy's paths are missing: renamed" in r.stderr
