"""Stage workers for the CPU: vLLM's ``CPUWorker`` running vLLM-Omni's own AR and
generation model runners.

The runners are vLLM-Omni's GPU runners with vLLM's ``CPUModelRunner`` placed between
them and vLLM's ``GPUModelRunner`` in the MRO, so every Omni step (chunk adapter,
connector, talker MTP) runs as on a GPU while tensors stay on the CPU.
``CPUWorker.init_device`` builds its runner from the module global ``CPUModelRunner``;
the worker swaps that global for the Omni runner for the duration of the call.
"""
from __future__ import annotations

import contextlib

import vllm.v1.worker.cpu_worker as cpu_worker_mod
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.cpu_worker import CPUWorker
from vllm_omni.worker.gpu_ar_model_runner import GPUARModelRunner
from vllm_omni.worker.gpu_generation_model_runner import GPUGenerationModelRunner
from vllm_omni.worker.mixins import OmniWorkerMixin


class _CpuRunnerMixin:
    def _init_talker_mtp(self) -> None:
        # The talker-MTP buffers are sized max(max_num_reqs, max_cudagraph_capture_size);
        # the CPU platform leaves the latter None (no CUDA graphs).
        cc = self.compilation_config
        saved = cc.max_cudagraph_capture_size
        if saved is None:
            cc.max_cudagraph_capture_size = 0
        try:
            super()._init_talker_mtp()
        finally:
            cc.max_cudagraph_capture_size = saved


class CPUARModelRunner(_CpuRunnerMixin, GPUARModelRunner, CPUModelRunner):
    pass


class CPUGenerationModelRunner(_CpuRunnerMixin, GPUGenerationModelRunner, CPUModelRunner):
    pass


@contextlib.contextmanager
def _runner_class(cls: type):
    saved = cpu_worker_mod.CPUModelRunner
    cpu_worker_mod.CPUModelRunner = cls
    try:
        yield
    finally:
        cpu_worker_mod.CPUModelRunner = saved


class _OmniCpuWorker(OmniWorkerMixin, CPUWorker):
    model_runner_cls: type = CPUModelRunner

    def init_device(self) -> None:
        with _runner_class(self.model_runner_cls):
            super().init_device()


class CPUARWorker(_OmniCpuWorker):
    model_runner_cls = CPUARModelRunner


class CPUGenerationWorker(_OmniCpuWorker):
    model_runner_cls = CPUGenerationModelRunner
