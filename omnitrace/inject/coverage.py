"""Which of omnitrace's hooks an installed vLLM-Omni, and the deploy file it will serve,
will see: checked before a load test is spent on a path nothing records (``omnitrace hooks``).

For the vLLM-Omni of this Python: the hook set :func:`patching.apply` would choose, and each
hook's target resolved the way ``apply`` resolves it (its module imported, the attribute
looked up): **found**, or **missing** with why. With a deploy file, read by vLLM-Omni's own
loader (``base_config`` inheritance, the platform's overrides), the data paths it takes
(``conventions.PATH_*``); a hook of a path it does not take is **not on this path**:

* ``mrv2``: a stage on ``model_runner: v2`` (top level or per stage, after the platform's
  section) whose pipeline declares ``supports_native_mrv2_data_plane``. The pipeline is
  the model's: known with ``model`` (vLLM-Omni resolves it), else a v2 stage may take
  either path and both count.
* ``v1-adapter``: a stage on v1, or on v2 without the native data plane, unless the
  deploy sets ``async_chunk: false`` (unset: the pipeline decides, so it counts).
* ``talker-first-audio``: a connector's ``extra`` sets ``talker_first_audio``, on MRv2
  with async chunks, on CUDA, and ``VLLM_OMNI_TALKER_FIRST_AUDIO`` is not ``0``.
* ``shm-connector``: a connector named SharedMemoryConnector (or none named: the default).
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Iterable

from omnitrace import conventions as cv
from omnitrace.inject import patching

FOUND, MISSING, OFF_PATH = "found", "missing", "not on this path"
SHM_CONNECTOR = "SharedMemoryConnector"
ENV_TALKER_FIRST_AUDIO = "VLLM_OMNI_TALKER_FIRST_AUDIO"
ALL_PATHS = (cv.PATH_V1_ADAPTER, cv.PATH_MRV2, cv.PATH_TALKER_FIRST_AUDIO, cv.PATH_SHM_CONNECTOR)


class CoverageError(Exception):
    """Input the check cannot work from: one line for the user."""


@dataclass
class Site:
    """One hook site: what it wraps, the path it instruments, and what was found."""

    name: str
    target: str  # module.qualname
    path: str
    status: str
    why: str = ""
    optional: bool = False


@dataclass
class DeployPaths:
    """What one deploy file selects, as vLLM-Omni reads it."""

    file: str
    platform: str
    # (stage id or "all", model runner, native MRv2 data plane: None = unknown without --model)
    stages: list[tuple[int | str, str, bool | None]]
    async_chunk: bool | None  # None: not set, the model's pipeline decides
    connectors: list[str]
    talker_first_audio: bool
    paths: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)


@dataclass
class Coverage:
    target: str
    version: str
    python: str
    hook_set: str
    versions: tuple[str, ...]
    sites: list[Site]
    deploy: DeployPaths | None = None

    @property
    def missing(self) -> list[Site]:
        """Hooks on this deploy's paths (all, without one) that will not be applied."""
        return [s for s in self.sites if s.status == MISSING and not s.optional]

    @property
    def unhooked(self) -> list[str]:
        """Paths the deploy takes that this release's hook set has no hook for."""
        if self.deploy is None:
            return []
        return sorted(self.deploy.paths - {s.path for s in self.sites})

    def counts(self) -> dict[str, int]:
        out = {FOUND: 0, MISSING: 0, OFF_PATH: 0}
        for s in self.sites:
            out[s.status] += 1
        return out


def _one_line(exc: BaseException) -> str:
    """``Type: first line of the message`` (vLLM's validation errors run to many lines)."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


# --------------------------------------------------------------------------- deploy files
def deploy_file(name: str) -> str:
    """A path, or the name of one of the installed vLLM-Omni's ``deploy/`` files."""
    if os.path.exists(name):
        return name
    spec = importlib.util.find_spec("vllm_omni")
    roots = list(spec.submodule_search_locations or ()) if spec is not None else []
    if os.sep not in name:
        for root in roots:
            for cand in (name, name + ".yaml"):
                path = os.path.join(root, "deploy", cand)
                if os.path.isfile(path):
                    return path
    raise CoverageError(f"no such deploy file: {name} (neither a path nor one of vLLM-Omni's deploy/ files)")


def _load_deploy(path: str, platform: str) -> Any:
    try:
        from vllm_omni.config import stage_config as sc
    except Exception as exc:
        raise CoverageError(f"this vLLM-Omni cannot read deploy files ({_one_line(exc)})") from None
    try:
        deploy = sc.load_deploy_config(path)
        overrides = getattr(sc, "_apply_platform_overrides", None)  # vLLM-Omni's own platform rule
        return overrides(deploy, platform) if overrides is not None else deploy
    except Exception as exc:
        raise CoverageError(f"cannot read deploy file {path}: {_one_line(exc)}") from None


def _connectors(deploy: Any) -> tuple[list[str], bool]:
    """The connector classes the deploy names, and whether one asks for talker-first audio."""
    names, first_audio = [], False
    for spec in (getattr(deploy, "connectors", None) or {}).values():
        if not isinstance(spec, dict):
            continue
        names.append(str(spec.get("name", "?")))
        extra = spec.get("extra") or {}
        first_audio = first_audio or bool(isinstance(extra, dict) and extra.get("talker_first_audio"))
    return sorted(set(names)), first_audio


def _native_stages(model: str, path: str, deploy: Any) -> dict[int, bool]:
    """Stage id -> whether the model's pipeline declares the native MRv2 data plane for it,
    as vLLM-Omni resolves the pipeline (from the model's config and the deploy file)."""
    try:
        from vllm_omni.config.config_factory import StageConfigFactory

        pc = StageConfigFactory.get_pipeline_config(
            model, trust_remote_code=bool(getattr(deploy, "trust_remote_code", False)), deploy_config_path=path)
    except Exception as exc:
        raise CoverageError(f"cannot resolve the pipeline of {model}: {_one_line(exc)}") from None
    if pc is None:
        raise CoverageError(f"vLLM-Omni has no pipeline for {model}")
    return {int(st.stage_id): bool(getattr(st, "supports_native_mrv2_data_plane", False)) for st in pc.stages}


def _stage_paths(runner: str, native: bool | None) -> set[str]:
    """A stage's chunk paths: MRv2's data plane where its runner is v2 and its pipeline has
    one (unknown: either), the V1 adapter otherwise."""
    if runner != "v2" or native is False:
        return {cv.PATH_V1_ADAPTER}
    return {cv.PATH_MRV2} if native else {cv.PATH_MRV2, cv.PATH_V1_ADAPTER}


def deploy_paths(path: str, platform: str = "cuda", model: str | None = None) -> DeployPaths:
    """The data paths the deploy file ``path`` takes on ``platform`` (with ``model``: its
    pipeline's stages, so each v2 stage's data plane is known, not assumed)."""
    deploy = _load_deploy(path, platform)
    default = str(getattr(deploy, "model_runner", "v1") or "v1")
    runner_of = {s.stage_id: str(getattr(s, "model_runner", None) or default) for s in getattr(deploy, "stages", ())}
    native = _native_stages(model, path, deploy) if model else {}
    stages = [(sid, runner_of.get(sid, default), native.get(sid)) for sid in sorted(set(runner_of) | set(native))]
    stages = stages or [("all", default, None)]
    async_chunk = getattr(deploy, "async_chunk", None)
    connectors, asks_first_audio = _connectors(deploy)
    d = DeployPaths(os.path.basename(path), platform, stages, async_chunk, connectors, asks_first_audio)
    for _, runner, nat in stages:
        d.paths |= _stage_paths(runner, nat)
    if any(runner == "v2" and nat is None for _, runner, nat in stages):
        d.notes.append("a v2 stage uses MRv2's native data plane where the model's pipeline declares "
                       "supports_native_mrv2_data_plane, else the V1 chunk adapter (--model tells which)")
    if async_chunk is False:
        d.paths.discard(cv.PATH_V1_ADAPTER)  # whole payloads once a stage is done: no chunk FIFO
        d.notes.append("async_chunk off: stages hand over whole payloads once done")
    elif async_chunk is None:
        d.notes.append("async_chunk is not set: the model's pipeline decides")
    mrv2 = cv.PATH_MRV2 in d.paths
    if asks_first_audio:
        off = os.environ.get(ENV_TALKER_FIRST_AUDIO) == "0"
        if mrv2 and platform == "cuda" and not off and async_chunk is not False:
            d.paths.add(cv.PATH_TALKER_FIRST_AUDIO)
        else:
            d.notes.append("talker_first_audio is asked for but off: it needs MRv2 with async chunks on CUDA"
                           + (f", and {ENV_TALKER_FIRST_AUDIO} is 0" if off else ""))
    if not connectors or SHM_CONNECTOR in connectors:
        d.paths.add(cv.PATH_SHM_CONNECTOR)
    others = [c for c in connectors if c != SHM_CONNECTOR]
    if others:
        d.notes.append(f"no omnitrace hooks for {', '.join(others)}: its puts and gets are not seen")
    return d


# --------------------------------------------------------------------------- hook sites
def _resolve(hook: patching.Hook) -> tuple[str, str]:
    """(status, why) of one hook's target, resolved as ``patching.apply`` resolves it."""
    try:
        module = importlib.import_module(hook.module)
    except Exception as exc:
        return MISSING, f"module does not import ({_one_line(exc)})"
    try:
        owner, attr = patching.resolve(module, hook.qualname)
    except AttributeError as exc:
        return MISSING, str(exc)
    raw = owner.__dict__.get(attr) if isinstance(owner, type) else None
    if hook.static and not isinstance(raw, staticmethod):
        return MISSING, "no longer a staticmethod"
    return FOUND, ""


@contextlib.contextmanager
def _quiet_imports() -> Any:
    """vLLM's and vLLM-Omni's import-time log lines go to stdout: below WARNING they are left
    out (unless the user set VLLM_LOGGING_LEVEL), the rest goes to stderr, off the result."""
    key = "VLLM_LOGGING_LEVEL"
    had = key in os.environ
    os.environ.setdefault(key, "WARNING")
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        if not had:
            os.environ.pop(key, None)


def check(deploy: str | None = None, platform: str = "cuda", patch_dirs: Iterable[str] = (),
          model: str | None = None, target: str = "vllm-omni") -> Coverage:
    """Every hook site of the installed ``target``'s hook set, against ``deploy``'s paths
    (``model``: the model it serves, whose pipeline says which v2 stages are native)."""
    version = patching.installed_version(target)
    if version is None:
        raise CoverageError(f"{target} is not installed in this Python ({sys.executable}): run the check "
                            "with the Python that serves")
    try:
        sets = patching.load_patch_sets(list(patch_dirs))
    except Exception as exc:
        raise CoverageError(f"cannot load hook definitions ({_one_line(exc)})") from None
    chosen = patching.choose(sets, target, version)
    if chosen is None:
        raise CoverageError(patching.unknown_version(sets, target, version) + ": omnitrace has no hooks for it")
    with _quiet_imports():
        paths = deploy_paths(deploy_file(deploy), platform, model) if deploy else None
        sites = []
        for hook in chosen.hooks:
            site = Site(hook.name, f"{hook.module}.{hook.qualname}", hook.path, OFF_PATH, optional=hook.optional)
            if paths is None or not hook.path or hook.path in paths.paths:
                site.status, site.why = _resolve(hook)
            sites.append(site)
    return Coverage(target, version, sys.executable, os.path.basename(chosen.origin), chosen.versions, sites,
                    paths)


def as_json(cov: Coverage) -> dict[str, Any]:
    d = cov.deploy
    return {"target": cov.target, "version": cov.version, "python": cov.python, "hook_set": cov.hook_set,
            "versions": list(cov.versions), "counts": cov.counts(),
            "complete": not cov.missing and not cov.unhooked, "unhooked_paths": cov.unhooked,
            "deploy": None if d is None else {
                "file": d.file, "platform": d.platform,
                "stages": [{"stage": sid, "model_runner": runner, "native_data_plane": nat}
                           for sid, runner, nat in d.stages],
                "async_chunk": d.async_chunk, "connectors": d.connectors,
                "talker_first_audio": d.talker_first_audio, "paths": sorted(d.paths),
                "not_on_paths": sorted(set(ALL_PATHS) - d.paths), "notes": d.notes},
            "sites": [{"name": s.name, "target": s.target, "path": s.path or "all", "status": s.status,
                       "why": s.why, "optional": s.optional} for s in cov.sites]}


def _native_label(runner: str, native: bool | None) -> str:
    if runner != "v2" or native is None:
        return ""
    return " (native data plane)" if native else " (V1 adapter: no native data plane)"


def render(cov: Coverage) -> str:
    """The check as text: what was read, then one line per hook site."""
    lines = [f"{cov.target} {cov.version} ({cov.python}): hook set {cov.hook_set} ({', '.join(cov.versions)})"]
    d = cov.deploy
    if d is not None:
        stages = ", ".join(f"stage {sid} {runner}" + _native_label(runner, nat) for sid, runner, nat in d.stages)
        chunk = {True: "on", False: "off", None: "not set"}[d.async_chunk]
        lines.append(f"deploy {d.file} on {d.platform}: {stages}; async_chunk {chunk}; talker_first_audio "
                     f"{'on' if d.talker_first_audio else 'off'}; connectors {', '.join(d.connectors) or 'none named'}")
        off = sorted(set(ALL_PATHS) - d.paths)
        lines.append(f"paths: {', '.join(sorted(d.paths)) or 'none'}" + (f" (not: {', '.join(off)})" if off else ""))
        lines += [f"note: {n}" for n in d.notes]
        if cov.unhooked:
            lines.append(f"NOT INSTRUMENTED in {cov.version}: {', '.join(cov.unhooked)} (no hooks for "
                         "this path in its hook set)")
    lines.append("")
    width = max(len(s.name) for s in cov.sites) if cov.sites else 4
    lines.append(f"{'PATH':<19} {'HOOK':<{width}} {'STATUS':<17} TARGET")
    for s in cov.sites:
        status = s.status + (" (optional)" if s.optional and s.status == MISSING else "")
        why = f"  [{s.why}]" if s.why else ""
        lines.append(f"{s.path or 'all':<19} {s.name:<{width}} {status:<17} {s.target}{why}")
    c = cov.counts()
    lines.append("")
    lines.append(f"{len(cov.sites)} hooks: {c[FOUND]} found, {c[MISSING]} missing, {c[OFF_PATH]} not on this path")
    return "\n".join(lines)
