"""``vllm.general_plugins`` entry point (declared in pyproject.toml as ``omnitrace``).

vLLM calls ``load_general_plugins()`` in the API server, at the very start of every
EngineCore process (before the scheduler, and so the chunk adapter, is built) and in every
worker; vLLM-Omni's stage processes are spawned EngineCores, so this reaches all of them.
It may be called several times per process: :func:`omnitrace.inject.patching.apply` is
idempotent. Outside ``omnitrace run`` (no OMNITRACE_RUN_ID) it does nothing at all.

If you set ``VLLM_PLUGINS`` yourself, it filters plugins by name: ``omnitrace run`` appends
``omnitrace`` to it (see :func:`plugin_env`); the PYTHONPATH bootstrap is the fallback.
"""
from __future__ import annotations

import os
import re

PLUGIN_NAME = "omnitrace"
# vLLM-Omni names each stage process StageEngineCoreProc_stage{S}_replica{R}[_DP{k}]
_STAGE_PROC = re.compile(r"StageEngineCoreProc_stage(\d+)_replica(\d+)")


def _name_stage_process() -> None:
    # By the time vLLM loads plugins the spawned process has its name (at sitecustomize
    # time it has not), so even a stage without an async-chunk adapter is labelled.
    import multiprocessing

    name = multiprocessing.current_process().name
    m = _STAGE_PROC.match(name)
    if m:
        from omnitrace import record

        record.set_process_info(role="stage", stage=int(m.group(1)), replica=int(m.group(2)), name=name)


def register() -> None:
    try:
        from omnitrace import record
        from omnitrace.inject import patching

        if not record.enabled():
            return
        _name_stage_process()
        patching.apply()
    except Exception as exc:  # a plugin must never take the server down
        try:
            from omnitrace.inject.patching import warn

            warn(f"vllm plugin failed ({type(exc).__name__}: {exc}); running uninstrumented")
        except Exception:
            pass


def plugin_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The VLLM_PLUGINS value a run should pass on: a user's list plus ``omnitrace``.

    Unset stays unset (vLLM then loads every installed plugin, ours included); an explicit
    list gets ``omnitrace`` appended rather than replaced.
    """
    env = dict(os.environ if env is None else env)
    current = env.get("VLLM_PLUGINS")
    if current is None:
        return {}
    names = [n.strip() for n in current.split(",") if n.strip()]
    if PLUGIN_NAME not in names:
        names.append(PLUGIN_NAME)
    return {"VLLM_PLUGINS": ",".join(names)}
