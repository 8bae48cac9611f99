"""omnitrace.inject.patching with a user --patches dir on a small real package (no vLLM).

Each case runs in a fresh interpreter (apply() installs an import hook and keeps state),
with a real distribution record so the version comes from importlib.metadata as it does
for vLLM-Omni.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.sources import ROOT


TARGET_PKG = '''
class Thing:
    def work(self, x):
        return x + 1

    @staticmethod
    def snap(x):
        return [x]
'''

PATCHES = '''
from omnitrace.inject.patching import Hook

TARGET = "demo-target"
VERSIONS = ("1.2.",)
CALLS = []

def wrap_work(orig):
    def work(self, x):
        CALLS.append("work")
        return orig(self, x)
    return work

def wrap_snap(orig):
    def snap(x):
        CALLS.append("snap")
        return orig(x)
    return snap

def wrap_raising(orig):
    def work(self, x):
        return orig(self, x)
    return work

HOOKS = [
    Hook("work", "demo_target", "Thing.work", wrap_work),
    Hook("snapshot", "demo_target", "Thing.snap", wrap_snap, static=True),
    Hook("vanished method", "demo_target", "Thing.gone", wrap_raising),
    Hook("optional method", "demo_target", "Thing.maybe", wrap_raising, optional=True),
]
'''


@pytest.fixture()
def demo(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    (site / "demo_target").mkdir(parents=True)
    (site / "demo_target" / "__init__.py").write_text(TARGET_PKG)
    info = site / "demo_target-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: demo-target\nVersion: 1.2.3\n")
    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "demo.py").write_text(PATCHES)
    return tmp_path


def _run(demo: Path, code: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(demo / "site"), "OMNITRACE_RUN_ID": "patching-test",
            "OMNITRACE_PATCHES": str(demo / "patches"), **env}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=60, env=full, cwd=demo)


def test_user_patches_apply_on_import_warn_once_and_remove(demo: Path) -> None:
    proc = _run(demo, """
        from omnitrace.inject import patching
        ps = patching.apply(target="demo-target")
        assert ps is not None and ps.origin.endswith("demo.py"), ps
        import sys; assert "demo_target" not in sys.modules or True
        import demo_target                      # hooks land when the module is imported
        t = demo_target.Thing()
        assert t.work(1) == 2 and demo_target.Thing.snap(3) == [3] and t.snap(4) == [4]
        calls = sys.modules["omnitrace_user_patches.demo"].CALLS
        assert calls == ["work", "snap", "snap"], calls
        assert patching.apply(target="demo-target") is ps   # idempotent
        patching.remove()
        calls.clear()
        assert t.work(1) == 2 and demo_target.Thing.snap(3) == [3] and calls == []
        print("ok", sorted(patching.applied()))
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok []"
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("omnitrace: ")]
    assert len(lines) == 1, proc.stderr
    assert "demo-target 1.2.3: skipped hooks: vanished method" in lines[0]
    assert "maybe" not in lines[0]  # optional hooks are skipped silently


def test_already_imported_module_is_patched_at_once(demo: Path) -> None:
    proc = _run(demo, """
        import demo_target
        from omnitrace.inject import patching
        patching.apply(target="demo-target")
        print(sorted(patching.applied()))
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['demo_target.Thing.snap', 'demo_target.Thing.work']"


def test_unknown_version_and_bad_patch_dir(demo: Path) -> None:
    proc = _run(demo, """
        from omnitrace.inject import patching
        assert patching.apply(target="demo-target") is None
        import demo_target
        assert demo_target.Thing().work(1) == 2 and patching.applied() == []
    """, OMNITRACE_PATCHES="")
    assert proc.returncode == 0, proc.stderr
    assert [ln for ln in proc.stderr.splitlines() if ln.startswith("omnitrace: ")] == [
        "omnitrace: demo-target 1.2.3 is not a known version (known: none); running uninstrumented"]
    proc = _run(demo, """
        from omnitrace.inject import patching
        assert patching.apply(target="demo-target") is None
    """, OMNITRACE_PATCHES=str(demo / "nope"))
    assert proc.returncode == 0, proc.stderr
    assert "not a directory" in proc.stderr and proc.stderr.count("omnitrace: ") == 1


def test_nothing_happens_without_a_run(demo: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OMNITRACE_RUN_ID"}
    proc = subprocess.run([sys.executable, "-c", "from omnitrace.inject import vllm_plugin, patching;"
                           "vllm_plugin.register(); print(patching.apply(target='demo-target'))"],
                          capture_output=True, text=True, timeout=60, cwd=demo,
                          env={**env, "PYTHONPATH": str(demo / "site"),
                               "OMNITRACE_PATCHES": str(demo / "patches")})
    assert proc.returncode == 0 and proc.stdout.strip() == "None" and not proc.stderr, proc.stderr


def test_api_stream_wrapper_stamps_arrival_first_text_first_audio_end(tmp_path: Path) -> None:
    """The API-server wrappers on an async generator that yields vLLM-Omni's SSE lines
    (``data: {json}`` lines, top-level ``modality`` text/audio, ``data: [DONE]`` last). The
    real OmniOpenAIServingChat cannot be imported in the CPU venv (see test_vllm_omni), so
    this checks our stream handling."""
    code = """
        import asyncio, json, os
        from omnitrace import record
        from omnitrace.conventions import Ev
        from omnitrace.patches.vllm_omni import wrappers

        def sse(modality, **delta):
            return "data: " + json.dumps({"id": "x", "choices": [{"index": 0, "delta": delta}],
                                          "modality": modality}, separators=(",", ":")) + "\\n\\n"

        class Chat:
            async def create_chat_completion(self, request, raw_request=None):
                return self.chat_completion_stream_generator(request, None, "chatcmpl-abc_1", "m")
            async def chat_completion_stream_generator(self, request, result_generator, request_id, model):
                yield sse("text", role="assistant", content="")
                yield sse("text", content="Hi")
                yield sse("audio", content="UklGRg==")
                yield sse("text", content=" there")
                yield "data: [DONE]\\n\\n"

        Chat.create_chat_completion = wrappers.wrap_create_chat(Chat.create_chat_completion)
        Chat.chat_completion_stream_generator = wrappers.wrap_stream(Chat.chat_completion_stream_generator)

        async def main():
            req = type("R", (), {"max_tokens": 77})()
            gen = await Chat().create_chat_completion(req)
            return [item async for item in gen]
        items = asyncio.run(main())
        assert len(items) == 5 and items[-1] == "data: [DONE]\\n\\n"
        (name,) = record.discover(os.environ["OMNITRACE_RUN_ID"])
        r = record.RingReader(name)
        evs = [(Ev(k).name, req, st, a, b) for k, req, st, ch, a, b, t in r.drain()]
        r.close(unlink=True)
        print(json.dumps(evs))
    """
    env = {**os.environ, "OMNITRACE_RUN_ID": "apitest" + os.urandom(3).hex()}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=60, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    import json

    evs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [e[0] for e in evs] == ["REQUEST_ARRIVE", "REQUEST_FIRST_TEXT", "REQUEST_FIRST_AUDIO", "REQUEST_END"], evs
    assert all(e[1] == "abc_1" and e[2] == -1 for e in evs)  # the id the client named it by
    assert evs[0][4] == 77 and evs[-1][3] == 0 and evs[-1][4] > 100  # b = bytes sent


def test_a_raising_hook_warns_once_and_leaves_the_call_alone(tmp_path: Path) -> None:
    code = """
        import os
        from omnitrace import record
        from omnitrace.patches.vllm_omni import wrappers

        class Conn:
            def get(self, from_stage, to_stage, get_key, metadata=None):
                return ({"payload": 1}, 10)

        Conn.get = wrappers.wrap_get(Conn.get)
        c = Conn()
        # a key the hook cannot parse: its own code raises, the call's result is untouched
        assert c.get("0", "1", "no-underscores") == ({"payload": 1}, 10)
        assert c.get("0", "1", "still-bad") == ({"payload": 1}, 10)
        assert c.get("0", "1", "req_0_3") == ({"payload": 1}, 10)
        for name in record.discover(os.environ["OMNITRACE_RUN_ID"]):
            record.RingReader(name).close(unlink=True)
        print("ok")
    """
    env = {**os.environ, "OMNITRACE_RUN_ID": "hooktest" + os.urandom(3).hex()}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=60, env=env, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("omnitrace: ")]
    assert len(lines) == 1 and "hook 'connector get' raised ValueError" in lines[0], proc.stderr


def test_omnitrace_run_patches_option_and_vllm_plugins(demo: Path) -> None:
    code = ("import os, sys, demo_target\n"
            "print(demo_target.Thing().work(1), sys.modules['omnitrace_user_patches.demo'].CALLS,"
            " os.environ.get('VLLM_PLUGINS'))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("OMNITRACE_PATCHES", "OMNITRACE_RUN_ID")}
    env.update({"PYTHONPATH": str(demo / "site"), "VLLM_PLUGINS": "lora_resolver",
                "OMNITRACE_TARGET": "demo-target"})
    # the bootstrap applies the vllm-omni target; apply the demo target the same way
    script = demo / "app.py"
    script.write_text("from omnitrace.inject import patching\n"
                      "patching.remove(); patching.apply(target='demo-target')\n" + code)
    proc = subprocess.run([sys.executable, "-m", "omnitrace", "run", "--run-dir", str(demo / "run"),
                           "--patches", str(demo / "patches"), "--", sys.executable, str(script)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[0] == "2 ['work'] lora_resolver,omnitrace", proc.stdout
