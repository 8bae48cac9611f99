"""Started from the folder that holds a checkout named ``omnitrace`` (``~`` after cloning
into ``~/omnitrace``), no child process omnitrace starts may import that folder instead
of the installed package (issue 25, item 7). The folder here is a decoy whose
``__init__.py`` raises: any child that imports it prints a traceback and fails."""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

from omnitrace.childproc import module_of, python_module
from tests.support.report_util import _env

DECOY = 'raise ImportError("the decoy checkout in the current directory was imported")\n'


@pytest.fixture
def decoy_cwd(tmp_path):
    """A working directory with a broken ``omnitrace`` (and ``json``) package in it."""
    for name in ("omnitrace", "json"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(DECOY)
    return tmp_path


def _console_script() -> str:
    # what a user types: the entry point pip installed beside this interpreter (its own
    # directory, not the cwd, is first on its sys.path)
    path = os.path.join(os.path.dirname(sys.executable), "omnitrace")
    assert os.access(path, os.X_OK), f"{path} missing: install the package (pip install -e .)"
    return path


def test_python_m_from_the_decoy_folder_does_import_it(decoy_cwd):
    """The failure this file guards against is real: plain ``python -m`` takes the decoy."""
    r = subprocess.run([sys.executable, "-m", "omnitrace", "--version"], cwd=decoy_cwd,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "decoy checkout" in r.stderr


@pytest.mark.parametrize("safe_flag", [True, False], ids=["-P", "3.10-form"])
def test_child_command_ignores_the_cwd(decoy_cwd, safe_flag):
    if safe_flag and sys.version_info < (3, 11):
        pytest.skip("-P needs Python >= 3.11")
    cmd = python_module("omnitrace", "--version", safe_flag=safe_flag)
    r = subprocess.run(cmd, cwd=decoy_cwd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("omnitrace "), r.stderr
    assert module_of(cmd) == "omnitrace"
    # arguments and __main__ reach the module as with -m (json.tool: the decoy json too)
    (decoy_cwd / "in.json").write_text('{"b": 1, "a": 2}')
    r = subprocess.run(python_module("json.tool", "--sort-keys", "in.json", safe_flag=safe_flag),
                       cwd=decoy_cwd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert list(json.loads(r.stdout)) == ["a", "b"]


def test_the_310_form_on_python_310(decoy_cwd):
    """The form for interpreters without -P, on a real 3.10 (stdlib json as the module)."""
    found = [shutil.which("python3.10"), *glob.glob(os.path.expanduser("~/.pyenv/versions/3.10*/bin/python3.10"))]
    py310 = next((p for p in found if p and subprocess.run([p, "-c", ""], capture_output=True).returncode == 0), None)
    if py310 is None:
        pytest.skip("no python3.10 on this machine")
    cmd = [py310, *python_module("json.tool", "--sort-keys", "in.json", safe_flag=False)[1:]]
    (decoy_cwd / "in.json").write_text('{"b": 1, "a": 2}')
    r = subprocess.run(cmd, cwd=decoy_cwd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert list(json.loads(r.stdout)) == ["a", "b"]


def test_run_from_the_decoy_folder(decoy_cwd, tmp_path_factory):
    d = str(tmp_path_factory.mktemp("run") / "r")
    r = subprocess.run([_console_script(), "run", "--run-dir", d, "--",
                        sys.executable, "-c", "print('child ran')"],
                       cwd=decoy_cwd, capture_output=True, text=True, timeout=120, env=_env())
    assert r.returncode == 0 and "child ran" in r.stdout, r.stderr
    assert "Traceback" not in r.stderr and "decoy" not in r.stderr, r.stderr
    assert json.load(open(os.path.join(d, "run.json")))["exit_code"] == 0


def test_loadtest_from_the_decoy_folder(decoy_cwd, tmp_path_factory):
    """agent, server (and its spawned stages), bench and report: every child."""
    d = str(tmp_path_factory.mktemp("lt") / "lt")
    r = subprocess.run([_console_script(), "loadtest", "--run-dir", d, "--concurrency", "2",
                        "--num-prompts", "4", "--input-len", "100", "--output-len", "8"],
                       cwd=decoy_cwd, capture_output=True, text=True, timeout=300, env=_env())
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "decoy" not in r.stderr, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == d
    names = {json.loads(line)["name"] for line in open(os.path.join(d, "processes.jsonl"))}
    assert {"api", "thinker", "talker", "code2wav"} <= names, names
