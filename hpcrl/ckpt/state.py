"""Run state saved beside the tensors: step, data cursor, algorithm state, RNG streams — all JSON.

RNG states are captured as JSON (python's Mersenne state as ints, numpy's as a list of uint32, torch's
byte state as base64), so no load path unpickles anything.
"""

from __future__ import annotations

import base64
import random
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass(kw_only=True)
class RunState:
    """Everything besides tensors that a resumed run needs to continue exactly."""

    step: int
    """Optimizer steps completed when the checkpoint was taken."""
    data_cursor: dict[str, Any] = field(default_factory=dict)
    """Where the data loader stands (e.g. epoch, index within the epoch, sampler seed); JSON only."""
    algorithm_state: dict[str, Any] = field(default_factory=dict)
    """Algorithm state that is not a tensor (e.g. adaptive KL coefficient); JSON only."""
    run_id: str = ""
    """Identity of the run that wrote the checkpoint; a loader may insist on it."""
    tracker_run_id: str | None = None
    """Metrics tracker run to append to on resume."""
    restart_count: int = 0
    """How many times the run was restarted (SLURM_RESTART_COUNT or counted resumes)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunState:
        return cls(**data)


def seed_rngs(seed: int) -> None:
    """Seed every RNG `capture_rng` saves: python's, numpy's global and torch's (CPU and every CUDA
    device), so a fresh run's states are a function of `seed` (issue 14: python and numpy were saved on
    checkpoint but never seeded, so they differed on every run)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)  # numpy's legacy seed takes 32 bits
    torch.manual_seed(seed % 2**63)


def capture_rng() -> dict[str, Any]:
    """This process's python, numpy and torch (CPU, and CUDA when present) RNG states as JSON."""
    version, mt_state, gauss_next = random.getstate()
    np_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": {"version": version, "state": list(mt_state), "gauss_next": gauss_next},
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": np_state["state"]["key"].tolist(),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": _b64(torch.get_rng_state()),
    }
    if torch.cuda.is_available():
        state["cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Inverse of `capture_rng`."""
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss_next"]))
    npst = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": npst["bit_generator"],
            "state": {"key": np.array(npst["key"], dtype=np.uint32), "pos": npst["pos"]},
            "has_gauss": npst["has_gauss"],
            "gauss": npst["gauss"],
        }
    )
    torch.set_rng_state(_unb64(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_unb64(s) for s in state["cuda"]])


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode()


def _unb64(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()
