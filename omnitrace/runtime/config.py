"""Pipeline config: dataclasses, YAML loading and validation.

Every validation error is a :class:`PipelineConfigError` whose message is one line naming
the field (``stages[1].max_batch_size: must be a positive integer, got 0``), raised before
any process starts.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import yaml

DEFAULT_PIPELINE = os.path.join(os.path.dirname(__file__), "pipelines", "qwen3_omni.yaml")

KINDS = ("ar", "generation")
PRODUCES = ("hidden", "codec", "none")  # what a stage hands to its consumer stage
EMITS = ("text", "audio", "none")  # what a stage hands to the API server
COMPUTE = ("emulated", "torch")


class PipelineConfigError(ValueError):
    """An invalid pipeline config; str() is one line naming the field."""


@dataclass
class CostModel:
    """Emulated step cost: base + prefill tokens x per-token + batch size x per-seq."""

    base_ms: float = 2.0
    per_prefill_token_us: float = 0.0
    per_seq_us: float = 0.0

    def step_s(self, prefill_tokens: int, batch_size: int) -> float:
        return (self.base_ms * 1e3 + self.per_prefill_token_us * prefill_tokens
                + self.per_seq_us * batch_size) / 1e6


@dataclass
class ChunkConfig:
    # hidden-state chunks (thinker -> talker)
    prefill_bytes_per_token: int = 8192  # embed + hidden [P, 2048] bf16 each
    decode_bytes: int = 4096
    # codec chunks (talker -> code2wav)
    initial_codec_chunk_frames: int = 4
    codec_chunk_frames: int = 25
    codec_left_context_frames: int = 25
    codebooks: int = 16  # int64 per codebook -> 128 bytes per frame

    @property
    def bytes_per_frame(self) -> int:
        return self.codebooks * 8


@dataclass
class StageConfig:
    name: str
    kind: str = "ar"
    inputs: str | None = None
    produces: str = "none"
    emits: str = "none"
    max_batch_size: int = 32
    max_waiting: int = 1024
    max_num_batched_tokens: int = 16384  # prefill token budget per step (first stage)
    frames_per_token: float = 1.0  # AR consumer: output frames per upstream token
    compute: str = "emulated"
    torch_hidden: int = 256  # compute: torch -> MLP width
    inject_put_delay_ms: float = 0.0  # fault injection: extra sleep inside each chunk put (tests)
    cost: CostModel = field(default_factory=CostModel)
    chunk: ChunkConfig = field(default_factory=ChunkConfig)
    stage_id: int = 0


@dataclass
class AudioConfig:
    sample_rate: int = 24000
    samples_per_frame: int = 480


@dataclass
class Limits:
    max_prompt_tokens: int = 16384
    max_tokens: int = 4096


@dataclass
class ApiConfig:
    # fault injection (tests): the API blocks its event loop this long before writing each
    # request's first audio packet (a slow callback on the SSE write path)
    inject_write_delay_ms: float = 0.0


@dataclass
class PipelineConfig:
    name: str
    stages: list[StageConfig]
    limits: Limits = field(default_factory=Limits)
    audio: AudioConfig = field(default_factory=AudioConfig)
    api: ApiConfig = field(default_factory=ApiConfig)
    path: str = ""

    def consumer_of(self, stage_id: int) -> int | None:
        name = self.stages[stage_id].name
        for s in self.stages:
            if s.inputs == name:
                return s.stage_id
        return None

    def producer_of(self, stage_id: int) -> int | None:
        src = self.stages[stage_id].inputs
        return None if src is None else self.stage_index(src)

    def stage_index(self, name: str) -> int:
        return next(s.stage_id for s in self.stages if s.name == name)


# --------------------------------------------------------------------------- validation
def _err(where: str, msg: str) -> PipelineConfigError:
    return PipelineConfigError(f"{where}: {msg}")


def _pos_int(d: dict, key: str, where: str, default: int) -> int:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise _err(f"{where}.{key}", f"must be a positive integer, got {v!r}")
    return v


def _nonneg_num(d: dict, key: str, where: str, default: float, positive: bool = False) -> float:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or (positive and v == 0):
        kind = "a positive number" if positive else "a non-negative number"
        raise _err(f"{where}.{key}", f"must be {kind}, got {v!r}")
    return float(v)


def _choice(d: dict, key: str, where: str, choices: tuple[str, ...], default: str) -> str:
    v = d.get(key, default)
    if v not in choices:
        raise _err(f"{where}.{key}", f"must be one of {', '.join(choices)}, got {v!r}")
    return v


def _mapping(v: Any, where: str) -> dict:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise _err(where, f"must be a mapping, got {type(v).__name__}")
    return v


def _unknown(d: dict, allowed: set[str], where: str) -> None:
    extra = sorted(set(d) - allowed)
    if extra:
        raise _err(f"{where}.{extra[0]}", f"unknown field (allowed: {', '.join(sorted(allowed))})")


_STAGE_KEYS = {"name", "kind", "inputs", "produces", "emits", "max_batch_size", "max_waiting",
               "max_num_batched_tokens",
               "frames_per_token", "compute", "torch_hidden", "cost", "chunk", "inject_put_delay_ms"}


def _stage(raw: Any, i: int) -> StageConfig:
    where = f"stages[{i}]"
    d = _mapping(raw, where)
    _unknown(d, _STAGE_KEYS, where)
    name = d.get("name")
    if not isinstance(name, str) or not name.isidentifier():
        raise _err(f"{where}.name", f"must be an identifier-like string, got {name!r}")
    inputs = d.get("inputs")
    if inputs is not None and not isinstance(inputs, str):
        raise _err(f"{where}.inputs", f"must be a stage name or null, got {inputs!r}")
    cost_d = _mapping(d.get("cost"), f"{where}.cost")
    _unknown(cost_d, {"base_ms", "per_prefill_token_us", "per_seq_us"}, f"{where}.cost")
    cw = f"{where}.cost"
    cost = CostModel(_nonneg_num(cost_d, "base_ms", cw, 2.0),
                     _nonneg_num(cost_d, "per_prefill_token_us", cw, 0.0),
                     _nonneg_num(cost_d, "per_seq_us", cw, 0.0))
    ch_d = _mapping(d.get("chunk"), f"{where}.chunk")
    _unknown(ch_d, set(ChunkConfig.__dataclass_fields__), f"{where}.chunk")
    chw = f"{where}.chunk"
    dflt = ChunkConfig()
    chunk = ChunkConfig(**{k: _pos_int(ch_d, k, chw, getattr(dflt, k))
                           for k in ChunkConfig.__dataclass_fields__})
    return StageConfig(
        name=name,
        kind=_choice(d, "kind", where, KINDS, "ar"),
        inputs=inputs,
        produces=_choice(d, "produces", where, PRODUCES, "none"),
        emits=_choice(d, "emits", where, EMITS, "none"),
        max_batch_size=_pos_int(d, "max_batch_size", where, 32),
        max_waiting=_pos_int(d, "max_waiting", where, 1024),
        max_num_batched_tokens=_pos_int(d, "max_num_batched_tokens", where, 16384),
        frames_per_token=_nonneg_num(d, "frames_per_token", where, 1.0, positive=True),
        compute=_choice(d, "compute", where, COMPUTE, "emulated"),
        torch_hidden=_pos_int(d, "torch_hidden", where, 256),
        inject_put_delay_ms=_nonneg_num(d, "inject_put_delay_ms", where, 0.0),
        cost=cost, chunk=chunk, stage_id=i,
    )


def from_dict(raw: Any, path: str = "") -> PipelineConfig:
    """Validate a parsed config; raises PipelineConfigError naming the first bad field."""
    d = _mapping(raw, "pipeline")
    _unknown(d, {"name", "stages", "limits", "audio", "api"}, "pipeline")
    stages_raw = d.get("stages")
    if not isinstance(stages_raw, list) or not stages_raw:
        raise _err("stages", f"must be a non-empty list, got {stages_raw!r}")
    stages = [_stage(s, i) for i, s in enumerate(stages_raw)]
    names = [s.name for s in stages]
    for i, s in enumerate(stages):
        where = f"stages[{i}]"
        if names.index(s.name) != i:
            raise _err(f"{where}.name", f"duplicate stage name {s.name!r}")
        if i == 0:
            if s.inputs is not None:
                raise _err(f"{where}.inputs", "the first stage takes the prompt; must be null")
            if s.kind != "ar":
                raise _err(f"{where}.kind", "the first stage must be ar (it generates text)")
            continue
        # A linear chain, as Qwen3-Omni: stage i consumes stage i-1.
        if s.inputs != names[i - 1]:
            raise _err(f"{where}.inputs", f"must name the previous stage {names[i - 1]!r}, got {s.inputs!r}")
        up = stages[i - 1].produces
        if up == "none":
            raise _err(f"stages[{i - 1}].produces", f"stage {s.name!r} consumes it; must be hidden or codec")
        if up == "hidden" and s.kind != "ar":
            raise _err(f"{where}.kind", "a consumer of hidden-state chunks must be ar")
        if up == "codec" and s.kind != "generation":
            raise _err(f"{where}.kind", "a consumer of codec chunks must be generation")
        if s.kind == "generation" and s.emits == "text":
            raise _err(f"{where}.emits", "a generation stage emits audio or none")
    last = stages[-1]
    if last.produces != "none":
        raise _err(f"stages[{len(stages) - 1}].produces", "the last stage has no consumer; must be none")
    if stages[0].produces == "codec":
        raise _err("stages[0].produces", "the first stage produces hidden or none")
    if stages[0].emits != "text":
        raise _err("stages[0].emits", "the first stage must emit text")
    lim_d = _mapping(d.get("limits"), "limits")
    _unknown(lim_d, {"max_prompt_tokens", "max_tokens"}, "limits")
    limits = Limits(_pos_int(lim_d, "max_prompt_tokens", "limits", 16384),
                    _pos_int(lim_d, "max_tokens", "limits", 4096))
    au_d = _mapping(d.get("audio"), "audio")
    _unknown(au_d, {"sample_rate", "samples_per_frame"}, "audio")
    audio = AudioConfig(_pos_int(au_d, "sample_rate", "audio", 24000),
                        _pos_int(au_d, "samples_per_frame", "audio", 480))
    api_d = _mapping(d.get("api"), "api")
    _unknown(api_d, {"inject_write_delay_ms"}, "api")
    api = ApiConfig(_nonneg_num(api_d, "inject_write_delay_ms", "api", 0.0))
    name = d.get("name", os.path.splitext(os.path.basename(path))[0] or "pipeline")
    if not isinstance(name, str):
        raise _err("name", f"must be a string, got {name!r}")
    return PipelineConfig(name=name, stages=stages, limits=limits, audio=audio, api=api, path=path)


def load(path: str | None = None) -> PipelineConfig:
    """Load and validate a pipeline YAML (the packaged Qwen3-Omni shape by default)."""
    path = path or DEFAULT_PIPELINE
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except OSError as e:
        raise PipelineConfigError(f"{path}: cannot read pipeline config ({e.strerror})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        raise PipelineConfigError(f"{path}: invalid YAML{at}") from None
    return from_dict(raw, path)


def to_dict(cfg: PipelineConfig) -> dict:
    """Plain dict form (picklable, YAML-dumpable) that from_dict accepts back."""
    from dataclasses import asdict
    stages = []
    for s in cfg.stages:
        d = asdict(s)
        d.pop("stage_id")
        stages.append(d)
    return {"name": cfg.name, "stages": stages, "limits": asdict(cfg.limits),
            "audio": asdict(cfg.audio), "api": asdict(cfg.api)}
