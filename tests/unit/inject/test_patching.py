"""omnitrace.inject in process: the built-in patch sets ship with the package, one per
release line, and ``VLLM_PLUGINS`` is appended to. Patches applied in fresh interpreters:
tests/system/inject/test_patching.py."""
from __future__ import annotations


def test_vllm_plugins_env_is_appended_not_replaced() -> None:
    from omnitrace.inject.vllm_plugin import plugin_env

    assert plugin_env({}) == {}
    assert plugin_env({"VLLM_PLUGINS": "lora_resolver"}) == {"VLLM_PLUGINS": "lora_resolver,omnitrace"}
    assert plugin_env({"VLLM_PLUGINS": "omnitrace,x"}) == {"VLLM_PLUGINS": "omnitrace,x"}
    assert plugin_env({"VLLM_PLUGINS": ""}) == {"VLLM_PLUGINS": "omnitrace"}
def test_builtin_patch_sets_ship_with_the_package() -> None:
    from omnitrace.inject.patching import load_patch_sets

    sets = [s for s in load_patch_sets() if s.target == "vllm-omni"]
    # one set per supported release line, chosen by PEP 440 specifier (pre-releases included)
    for version in ("0.26.0", "0.28.0", "0.30.0", "0.32.0rc1"):
        assert len([s for s in sets if s.matches(version)]) == 1, version
    for version in ("0.24.0", "0.31.0rc1", "0.33.0rc1", "0.33.0"):
        assert not [s for s in sets if s.matches(version)], version
