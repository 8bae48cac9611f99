"""Per-step compute models for a stage.

``emulated``: ``time.sleep(cost)`` -- the scheduler thread blocks without the GIL, as it
does in a CUDA synchronize, so the sender and receiver threads run meanwhile.
``torch``: a small MLP forward per step on CPU (one thread), i.e. real work that holds and
releases the GIL the way torch ops do.
"""
from __future__ import annotations

import time

from omnitrace.runtime.config import StageConfig


class EmulatedCompute:
    def __init__(self, cfg: StageConfig) -> None:
        self.cost = cfg.cost

    def step(self, batch_size: int, prefill_tokens: int) -> None:
        time.sleep(self.cost.step_s(prefill_tokens, batch_size))


class TorchCompute:
    """A 2-layer MLP over one row per sequence plus one row per 64 prefill tokens."""

    def __init__(self, cfg: StageConfig) -> None:
        import torch  # optional dependency: only with compute: torch

        torch.set_num_threads(1)  # stay a fair neighbour on a small machine
        self.torch = torch
        h = cfg.torch_hidden
        self.model = torch.nn.Sequential(torch.nn.Linear(h, 4 * h), torch.nn.GELU(),
                                         torch.nn.Linear(4 * h, h)).eval()
        self.h = h

    def step(self, batch_size: int, prefill_tokens: int) -> None:
        rows = batch_size + prefill_tokens // 64
        with self.torch.inference_mode():
            self.model(self.torch.randn(rows, self.h))


def make(cfg: StageConfig) -> EmulatedCompute | TorchCompute:
    return TorchCompute(cfg) if cfg.compute == "torch" else EmulatedCompute(cfg)
