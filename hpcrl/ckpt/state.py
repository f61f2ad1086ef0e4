"""Run state saved beside the tensors: step, data cursor, algorithm state, RNG streams — all JSON.

RNG states are captured as JSON (python's Mersenne state as ints, numpy's as a list of uint32, torch's
byte state as base64), so no load path unpickles anything.
"""

from __future__ import annotations

import base64
import random
from dataclasses import asdict, dataclass, field, fields
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
        """Parse a manifest's `state`, checking every field's type: a damaged manifest must be rejected
        while the loader can still fall back, not fail later in the middle of a resume (ValueError)."""
        if not isinstance(data, dict):
            raise ValueError(f"state is {type(data).__name__}, expected an object")
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"state has unknown keys {unknown}")
        for key, ok in _STATE_TYPES.items():
            if key in data and not ok(data[key]):
                raise ValueError(f"state[{key!r}] = {data[key]!r} has the wrong type")
        if "step" not in data:
            raise ValueError("state has no 'step'")
        return cls(**data)


def _count(value: Any) -> bool:
    return type(value) is int and value >= 0


_STATE_TYPES = {
    "step": _count,
    "data_cursor": lambda v: isinstance(v, dict),
    "algorithm_state": lambda v: isinstance(v, dict),
    "run_id": lambda v: isinstance(v, str),
    "tracker_run_id": lambda v: v is None or isinstance(v, str),
    "restart_count": _count,
}
"""RunState field -> its JSON type check (bool is not an int here)."""


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
        _restore_cuda([_unb64(s) for s in state["cuda"]])


def _restore_cuda(states: list[torch.Tensor]) -> None:
    """Device i gets saved state i, for the devices this process has and the checkpoint saved: which
    devices exist is this machine's business (`check_rng`'s rule), e.g. a resume on fewer GPUs, or with
    CUDA_VISIBLE_DEVICES narrowed to the rank's own GPU. torch's `set_rng_state_all` raised for a saved
    state beyond the last device, after the checkpoint had been accepted."""
    for index, cuda_state in enumerate(states[: torch.cuda.device_count()]):
        torch.cuda.set_rng_state(cuda_state, index)


def check_rng(state: Any) -> None:
    """Raise ValueError unless `restore_rng(state)` can succeed, so a loader rejects a damaged state while
    it can still fall back. The CPU part is checked by restoring it, then this process's own states
    again (`restore_rng` itself is the only complete list of what python, numpy and torch accept); the
    CUDA part by its form only, since which devices exist is this machine's business, not damage."""
    if not isinstance(state, dict):
        raise ValueError(f"RNG state is {type(state).__name__}, expected an object")
    _check_cuda_states(state.get("cuda", []))
    own = capture_rng()
    try:
        restore_rng({key: value for key, value in state.items() if key != "cuda"})
    except Exception as err:  # any of them: TypeError, KeyError, RuntimeError, binascii.Error, ...
        raise ValueError(f"RNG state does not restore: {err!r}") from None
    finally:
        restore_rng(own)


def _check_cuda_states(states: Any) -> None:
    """A list of base64 states (of this machine's CUDA state size when it has CUDA)."""
    size = torch.cuda.get_rng_state().numel() if torch.cuda.is_available() else None
    if not isinstance(states, list) or not all(isinstance(s, str) for s in states):
        raise ValueError("RNG state: 'cuda' is not a list of base64 strings")
    for index, text in enumerate(states):
        try:
            raw = base64.b64decode(text, validate=True)
        except ValueError as err:
            raise ValueError(f"RNG state: cuda[{index}] is not base64: {err}") from None
        if size is not None and len(raw) != size:
            raise ValueError(f"RNG state: cuda[{index}] holds {len(raw)} bytes, a CUDA state {size}")


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode()


def _unb64(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()
