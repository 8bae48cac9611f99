"""`omnitrace hooks` in process: the check resolves each hook as ``patching.apply`` does, on
a small real package with a distribution record; bad input is one line and exit 2. On the
real vLLM-Omni venvs: tests/system/vllm/test_hooks_coverage.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from omnitrace import conventions as cv
from omnitrace.cli import hooks as hooks_cli
from omnitrace.inject import coverage

DEMO_PKG = '''
class Thing:
    def work(self, x):
        return x + 1

    @staticmethod
    def snap(x):
        return [x]
'''

DEMO_PATCHES = '''
from omnitrace.inject.patching import Hook

TARGET = "demo-target"
VERSIONS = ("1.2.",)

def wrap(orig):
    return orig

HOOKS = [
    Hook("work", "demo_target", "Thing.work", wrap, path="v1-adapter"),
    Hook("snapshot", "demo_target", "Thing.snap", wrap, static=True, path="mrv2"),
    Hook("static no more", "demo_target", "Thing.work", wrap, static=True),
    Hook("vanished method", "demo_target", "Thing.gone", wrap),
    Hook("optional method", "demo_target", "Thing.maybe", wrap, optional=True),
    Hook("vanished module", "demo_target_gone", "Thing.work", wrap),
]
'''


@pytest.fixture()
def demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A real package with a distribution record (demo-target 1.2.3) and a hook set for it."""
    site = tmp_path / "site"
    (site / "demo_target").mkdir(parents=True)
    (site / "demo_target" / "__init__.py").write_text(DEMO_PKG)
    info = site / "demo_target-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: demo-target\nVersion: 1.2.3\n")
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "demo.py").write_text(DEMO_PATCHES)
    monkeypatch.syspath_prepend(str(site))
    return tmp_path
def test_each_hook_is_resolved_as_apply_resolves_it(demo: Path) -> None:
    cov = coverage.check(patch_dirs=[str(demo / "patches")], target="demo-target")
    status = {s.name: (s.status, s.why) for s in cov.sites}
    assert cov.version == "1.2.3" and cov.hook_set == "demo.py"
    assert status["work"] == (coverage.FOUND, "") and status["snapshot"] == (coverage.FOUND, "")
    assert status["static no more"] == (coverage.MISSING, "no longer a staticmethod")
    assert status["vanished method"] == (coverage.MISSING, "demo_target.Thing.gone does not exist")
    assert status["optional method"][0] == coverage.MISSING
    assert status["vanished module"][0] == coverage.MISSING
    assert status["vanished module"][1].startswith("module does not import (ModuleNotFoundError")
    # an optional hook may be absent: the check is incomplete only for the others
    assert [s.name for s in cov.missing] == ["static no more", "vanished method", "vanished module"]
    text = coverage.render(cov)
    assert "optional method" in text and "missing (optional)" in text
    assert text.endswith("6 hooks: 2 found, 4 missing, 0 not on this path")
    doc = coverage.as_json(cov)
    assert doc["complete"] is False and doc["counts"] == {"found": 2, "missing": 4, "not on this path": 0}
def test_a_version_without_hooks_is_one_clear_line(demo: Path) -> None:
    (demo / "patches" / "demo.py").write_text(DEMO_PATCHES.replace('("1.2.",)', '(">=2.0,<3",)'))
    with pytest.raises(coverage.CoverageError) as err:
        coverage.check(patch_dirs=[str(demo / "patches")], target="demo-target")
    assert str(err.value) == ("demo-target 1.2.3 is not a known version (known: >=2.0,<3): "
                              "omnitrace has no hooks for it")
def test_bad_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture) -> None:
    import importlib.util

    if importlib.util.find_spec("vllm_omni") is not None:
        pytest.skip("vllm_omni is importable by this interpreter")
    assert hooks_cli.main(["--deploy", "qwen3_tts.yaml"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("omnitrace hooks: vllm-omni is not installed in this Python")
    assert hooks_cli.main(["--model", "some/model"]) == 2
    assert capsys.readouterr().err.strip() == "omnitrace hooks: --model needs --deploy"
def test_an_unknown_platform_is_refused_before_anything_is_read(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        hooks_cli.main(["--platform", "cdua"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and "invalid choice: 'cdua'" in err[0]
def test_a_v2_stage_takes_the_native_plane_only_where_its_pipeline_has_one() -> None:
    mrv2, v1 = cv.PATH_MRV2, cv.PATH_V1_ADAPTER
    assert coverage._stage_paths("v1", None) == {v1}
    assert coverage._stage_paths("v2", True) == {mrv2}
    assert coverage._stage_paths("v2", False) == {v1}
    assert coverage._stage_paths("v2", None) == {mrv2, v1}  # pipeline unknown: either
