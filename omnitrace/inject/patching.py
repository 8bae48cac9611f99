"""Apply omnitrace's hook definitions (``patches/``) to the target library in this process.

The bootstrap (``sitecustomize``) and the ``vllm.general_plugins`` entry point both call
:func:`apply`. It is cheap and safe to call in every Python process of a run:

* nothing happens unless recording is on (``OMNITRACE_RUN_ID`` set by ``omnitrace run``),
  so a plain ``vllm serve`` on a machine that has omnitrace installed is never touched;
* the target's version is read from its distribution metadata, before anything heavy is
  imported; the hook set whose ``VERSIONS`` match is chosen (user ``--patches`` dirs first);
* each hook is applied on its own, when its module is imported (a post-import hook) or at
  once if it already is, so no process pays for importing vLLM-Omni because of us;
* a version no hook set knows, a missing class or method, or a hook that raises gives ONE
  warning line naming what was skipped; the code then runs uninstrumented (or partly), with
  its behaviour unchanged.

A hook definition module (built in: ``patches/<target>/v*.py``, installed as ``omnitrace.patches``; yours: any ``*.py``
in a ``--patches DIR``) defines ``TARGET`` (distribution name), ``VERSIONS`` (version
specifiers such as ``">=0.28,<0.31"``, or prefixes such as ``"0.30."``) and ``HOOKS`` (a
list of :class:`Hook`).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.metadata
import importlib.util
import os
import pkgutil
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterable

from omnitrace import conventions as cv
from omnitrace import record

ENV_PATCHES = "OMNITRACE_PATCHES"  # os.pathsep-separated dirs of user hook definitions
ENV_TARGET = "OMNITRACE_TARGET"  # "vllm-omni": the run is meant to instrument it (warn if absent)
# the built-in hook definitions, found by name as a --patches dir is by path: they build on
# this module's Hook API, a layer above it (tests/unit/test_layers.py), not below
BUILTIN_PATCHES = "omnitrace.patches"
ENV_WARNED = "OMNITRACE_PATCH_WARNED"  # inherited by children: one warning per process tree
ENV_DISABLE = "OMNITRACE_NO_PATCHES"  # "1": apply nothing (bisecting a suspected hook)

_PREFIX = "omnitrace: "


@dataclass(frozen=True)
class Hook:
    """One wrapped attribute: ``module.qualname`` is replaced by ``wrap(original)``.

    ``static``: the attribute is a staticmethod (the function inside is wrapped and
    re-wrapped). ``optional``: absent in some versions of the range; skipped silently.
    ``path``: the data path it instruments (``conventions.PATH_*``; "" = every path), what
    ``omnitrace hooks`` checks against a deploy file.
    """

    name: str
    module: str
    qualname: str
    wrap: Callable[[Any], Any]
    static: bool = False
    optional: bool = False
    path: str = cv.PATH_ALL


@dataclass
class PatchSet:
    target: str
    versions: tuple[str, ...]
    hooks: list[Hook]
    origin: str

    def matches(self, version: str) -> bool:
        return any(version_matches(v, version) for v in self.versions)


def version_matches(spec: str, version: str) -> bool:
    """``spec`` is a PEP 440 specifier set (``">=0.28,<0.31"``; pre-releases included, so
    ``">=0.32.0rc1,<0.33"`` holds 0.32.0rc1) or, as before, a version prefix (``"0.30."``)."""
    if spec[:1] not in "<>=!~":
        return version == spec or version.startswith(spec)
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version) in SpecifierSet(spec, prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return False


@dataclass
class _State:
    applied: dict[tuple[str, str], tuple[Any, str, Any]] = field(default_factory=dict)
    pending: dict[str, list[Hook]] = field(default_factory=dict)
    finder: "_PostImportFinder | None" = None
    active: PatchSet | None = None
    done: bool = False


_state = _State()
_lock = threading.RLock()
_warned: set[str] = set()


# --------------------------------------------------------------------------- warnings
def warn(message: str) -> None:
    """One line on stderr, once per process tree (children inherit ENV_WARNED)."""
    if message in _warned or os.environ.get(ENV_WARNED) == message[:200]:
        return
    _warned.add(message)
    os.environ[ENV_WARNED] = message[:200]
    try:
        sys.stderr.write(_PREFIX + message + "\n")
        sys.stderr.flush()
    except Exception:
        pass


_failed_hooks: set[str] = set()


def hook_failed(name: str, exc: BaseException) -> None:
    """A wrapper's own code raised: say so once; the wrapped call itself went on untouched."""
    if name in _failed_hooks:
        return
    _failed_hooks.add(name)
    warn(f"hook {name!r} raised {type(exc).__name__}: {exc}; its events are skipped")


# --------------------------------------------------------------------------- loading
def _builtin_modules() -> list[ModuleType]:
    try:
        pkg = importlib.import_module(BUILTIN_PATCHES)
    except ImportError:
        return []
    mods = []
    for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        leaf = info.name.rsplit(".", 1)[1]
        if info.ispkg or leaf.startswith("_"):
            continue
        mods.append(importlib.import_module(info.name))
    return mods


def _dir_modules(directory: str) -> list[ModuleType]:
    root = Path(directory)
    if not root.is_dir():
        raise FileNotFoundError(f"--patches {directory}: not a directory")
    mods = []
    for path in sorted(root.rglob("*.py")):
        if path.name.startswith("_"):
            continue
        name = "omnitrace_user_patches." + "_".join(path.relative_to(root).with_suffix("").parts)
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            continue
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        mods.append(mod)
    return mods


def load_patch_sets(patch_dirs: Iterable[str] = ()) -> list[PatchSet]:
    """User dirs first (they win for a version both know), then the built-in sets."""
    sets: list[PatchSet] = []
    sources = [(d, lambda d=d: _dir_modules(d)) for d in patch_dirs] + [("builtin", _builtin_modules)]
    for origin, load in sources:
        for mod in load():
            target, versions, hooks = (getattr(mod, n, None) for n in ("TARGET", "VERSIONS", "HOOKS"))
            if not target or not versions or hooks is None:
                continue
            sets.append(PatchSet(str(target), tuple(versions), list(hooks),
                                 getattr(mod, "__file__", origin) or origin))
    return sets


def choose(sets: list[PatchSet], target: str, version: str) -> PatchSet | None:
    """The first of ``sets`` (user sets come first) for ``target`` whose VERSIONS match."""
    return next((s for s in sets if s.target == target and s.matches(version)), None)


def unknown_version(sets: list[PatchSet], target: str, version: str) -> str:
    """The one line for a version no hook set knows."""
    known = sorted({v + ("x" if v.endswith(".") else "") for s in sets if s.target == target
                    for v in s.versions}, key=lambda v: v.lstrip("<>=!~"))
    return f"{target} {version} is not a known version (known: {', '.join(known) or 'none'})"


def installed_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _expects(target: str) -> bool:
    """Was this run meant to instrument ``target``? (then its absence deserves a warning)"""
    if os.environ.get(ENV_TARGET, "") == target:
        return True
    argv = list(getattr(sys, "argv", None) or [])
    if target != "vllm-omni" or not argv:
        return False
    # `vllm serve MODEL --omni ...`, `vllm-omni serve ...`, `python -m vllm_omni...`
    return ("--omni" in argv or os.path.basename(argv[0]) == "vllm-omni"
            or any(a.startswith("vllm_omni.") for a in argv[:3]))


# --------------------------------------------------------------------------- patching
def resolve(module: ModuleType, qualname: str) -> tuple[Any, str]:
    """The owner of ``module.qualname`` and the attribute's name (AttributeError if absent)."""
    owner: Any = module
    parts = qualname.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part)
    if not hasattr(owner, parts[-1]):
        raise AttributeError(f"{module.__name__}.{qualname} does not exist")
    return owner, parts[-1]


def _patch_one(module: ModuleType, hook: Hook) -> None:
    key = (hook.module, hook.qualname)
    if key in _state.applied:
        return
    owner, attr = resolve(module, hook.qualname)
    raw = owner.__dict__[attr] if isinstance(owner, type) and attr in owner.__dict__ else getattr(owner, attr)
    if getattr(raw, "__omnitrace_hook__", False) or getattr(getattr(raw, "__func__", None), "__omnitrace_hook__", False):
        return  # already wrapped (a second loader of the same patches)
    if hook.static:
        if not isinstance(raw, staticmethod):
            raise TypeError(f"{hook.module}.{hook.qualname} is no longer a staticmethod")
        inner = hook.wrap(raw.__func__)
        inner.__omnitrace_hook__ = True
        new: Any = staticmethod(inner)
    else:
        new = hook.wrap(raw)
        new.__omnitrace_hook__ = True
    setattr(owner, attr, new)
    _state.applied[key] = (owner, attr, raw)


def _apply_hooks(module: ModuleType, hooks: list[Hook]) -> list[str]:
    skipped = []
    for hook in hooks:
        try:
            _patch_one(module, hook)
        except Exception as exc:  # missing class/method, changed shape, wrapper factory bug
            if not hook.optional:
                skipped.append(f"{hook.name} ({type(exc).__name__}: {exc})")
    return skipped


def _report_skipped(skipped: list[str]) -> None:
    if skipped:
        ps = _state.active
        label = f"{ps.target} {installed_version(ps.target)}" if ps else "target"
        warn(f"{label}: skipped hooks: {'; '.join(skipped)}; running partly instrumented")


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Runs the hooks of a module right after the module's own code has executed."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in _state.pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_then_patch(module: ModuleType, _orig: Callable = exec_module) -> None:
            _orig(module)
            _fire(fullname, module)

        try:
            loader.exec_module = exec_then_patch  # type: ignore[union-attr]  # per-spec loader instance
        except Exception:
            return spec
        return spec


def _fire(name: str, module: ModuleType) -> None:
    with _lock:
        hooks = _state.pending.pop(name, None)
        if not hooks:
            return
        _report_skipped(_apply_hooks(module, hooks))


def apply(patch_dirs: Iterable[str] | None = None, target: str = "vllm-omni") -> PatchSet | None:
    """Install the hook set matching the installed ``target`` version; idempotent.

    Returns the chosen :class:`PatchSet`, or None when nothing is instrumented.
    """
    with _lock:
        if _state.done:
            return _state.active
        if not record.enabled() or os.environ.get(ENV_DISABLE) == "1":
            return None
        _state.done = True
        if patch_dirs is None:
            patch_dirs = [d for d in os.environ.get(ENV_PATCHES, "").split(os.pathsep) if d]
        version = installed_version(target)
        if version is None:
            if _expects(target):
                warn(f"{target} is not installed; running uninstrumented")
            return None
        try:
            sets = load_patch_sets(list(patch_dirs))
        except Exception as exc:
            warn(f"cannot load hook definitions ({type(exc).__name__}: {exc}); running uninstrumented")
            return None
        chosen = choose(sets, target, version)
        if chosen is None:
            warn(unknown_version(sets, target, version) + "; running uninstrumented")
            return None
        _state.active = chosen
        by_module: dict[str, list[Hook]] = {}
        for hook in chosen.hooks:
            by_module.setdefault(hook.module, []).append(hook)
        skipped: list[str] = []
        for name, hooks in by_module.items():
            module = sys.modules.get(name)
            if module is not None:
                skipped += _apply_hooks(module, hooks)
            else:
                _state.pending[name] = hooks
        if _state.pending and _state.finder is None:
            _state.finder = _PostImportFinder()
            sys.meta_path.insert(0, _state.finder)
        _report_skipped(skipped)
        return chosen


def remove() -> None:
    """Undo :func:`apply` (class attributes restored; already-built instances keep their
    stamping deque, which behaves as a plain deque)."""
    with _lock:
        for owner, attr, raw in reversed(list(_state.applied.values())):
            try:
                setattr(owner, attr, raw)
            except Exception:
                pass
        if _state.finder is not None:
            try:
                sys.meta_path.remove(_state.finder)
            except ValueError:
                pass
        _state.applied.clear()
        _state.pending.clear()
        _state.finder = None
        _state.active = None
        _state.done = False


def applied() -> list[str]:
    """``module.qualname`` of every hook in place (for tests and ``--list``)."""
    return [f"{m}.{q}" for m, q in _state.applied]


def status() -> dict[str, Any]:
    ps = _state.active
    return {"target": ps.target if ps else None, "origin": ps.origin if ps else None,
            "applied": applied(), "pending": sorted(_state.pending)}


__all__ = ["Hook", "PatchSet", "apply", "remove", "applied", "status", "warn", "hook_failed",
           "load_patch_sets", "choose", "unknown_version", "installed_version", "resolve",
           "ENV_PATCHES", "ENV_TARGET", "cv"]
