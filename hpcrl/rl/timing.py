"""Per-phase wall-clock seconds (and CUDA memory peaks) of a step, and the step's timing metrics."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch


@dataclass
class PhaseTimer:
    seconds: dict[str, float] = field(default_factory=dict)
    peak_bytes: dict[str, int] = field(default_factory=dict)
    """CUDA only: the most GPU memory allocated during each phase (torch.cuda.max_memory_allocated)."""
    within: dict[str, float] = field(default_factory=dict)
    """Seconds of parts of a phase (env_wait: blocked on environments during generate): logged with
    their share of the step, not added to it."""

    @contextmanager
    def phase(self, name: str):
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
            if cuda:
                self.peak_bytes[name] = max(self.peak_bytes.get(name, 0), torch.cuda.max_memory_allocated())


def timing_metrics(timer: PhaseTimer, gen_tokens: int, train_tokens: int) -> dict[str, float]:
    """Seconds and share of each phase, tokens/s of generation and training, CUDA memory peaks;
    time/step_s is the sum of the phases."""
    total = sum(timer.seconds.values()) or 1e-9
    out = {f"time/{k}_s": v for k, v in timer.seconds.items()}
    out |= {f"share/{k}": v / total for k, v in timer.seconds.items()}
    if timer.seconds.get("generate"):
        out["tps/generate"] = gen_tokens / timer.seconds["generate"]
    if timer.seconds.get("train"):
        out["tps/train"] = train_tokens / timer.seconds["train"]
    out |= {f"time/{k}_s": v for k, v in timer.within.items()}
    out |= {f"share/{k}": v / total for k, v in timer.within.items()}
    out["time/step_s"] = total
    out |= {f"memory/{k}_peak_gib": v / 2**30 for k, v in timer.peak_bytes.items()}
    return out
