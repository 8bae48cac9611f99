"""``CpuOmniPlatform``: vLLM's ``CpuPlatform`` plus the Omni interfaces a Qwen3-Omni
pipeline asks of its platform (worker classes, device, memory, synchronize)."""
from __future__ import annotations

from typing import Any

import psutil
import torch
from vllm.platforms.cpu import CpuPlatform
from vllm_omni.platforms.interface import OmniPlatform, OmniPlatformEnum

_WORKERS = "omni_cpu_platform.worker"


class CpuOmniPlatform(OmniPlatform, CpuPlatform):
    _omni_enum = OmniPlatformEnum.OOT

    @classmethod
    def get_omni_ar_worker_cls(cls) -> str:
        return f"{_WORKERS}.CPUARWorker"

    @classmethod
    def get_omni_generation_worker_cls(cls) -> str:
        return f"{_WORKERS}.CPUGenerationWorker"

    @classmethod
    def get_default_stage_config_path(cls) -> str:
        return "vllm_omni/model_executor/stage_configs"

    @classmethod
    def get_diffusion_attn_backend_cls(cls, selected_backend: str | None, head_size: int,
                                       allow_trtllm_default: bool = False) -> str:
        from vllm_omni.diffusion.attention.backends.registry import DiffusionAttentionBackendEnum
        return DiffusionAttentionBackendEnum.TORCH_SDPA.get_path()

    @classmethod
    def supports_torch_inductor(cls) -> bool:
        return False

    @classmethod
    def supports_talker_mtp_graph_capture(cls) -> bool:
        return False

    @classmethod
    def get_torch_device(cls, local_rank: int | None = None) -> torch.device:
        return torch.device("cpu")

    @classmethod
    def get_device_count(cls) -> int:
        return 1

    @classmethod
    def get_device_version(cls) -> str | None:
        return None

    @classmethod
    def synchronize(cls) -> None:
        return None

    @classmethod
    def get_free_memory(cls, device: Any = None) -> int:
        return int(psutil.virtual_memory().available)

    @classmethod
    def get_device_memory(cls, device: Any = None) -> tuple[int, int]:
        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)
