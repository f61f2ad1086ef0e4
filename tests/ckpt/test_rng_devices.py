"""RNG restore follows the check's rule on CUDA states: a checkpoint saved with more (or fewer) CUDA
devices than this process has restores the states of the devices both have (check_rng accepts any
count: which devices exist is this machine's business). No GPU needed: torch.cuda is faked."""

from __future__ import annotations

import base64

import pytest
import torch

from hpcrl.ckpt.state import capture_rng, check_rng, restore_rng

CUDA_STATE_BYTES = 16


@pytest.fixture
def one_fake_gpu(monkeypatch) -> list[int]:
    """torch.cuda with one device; returns the device indices whose state was set, in order."""
    set_on: list[int] = []

    def set_rng_state(state, device=0):
        assert state.numel() == CUDA_STATE_BYTES
        if int(device) >= 1:
            raise RuntimeError(f"CUDA error: invalid device ordinal {device}")
        set_on.append(int(device))

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(
        torch.cuda, "get_rng_state", lambda device=0: torch.zeros(CUDA_STATE_BYTES, dtype=torch.uint8)
    )
    monkeypatch.setattr(
        torch.cuda, "get_rng_state_all", lambda: [torch.zeros(CUDA_STATE_BYTES, dtype=torch.uint8)]
    )
    monkeypatch.setattr(torch.cuda, "set_rng_state", set_rng_state)
    monkeypatch.setattr(torch.cuda.random, "set_rng_state", set_rng_state)  # what set_rng_state_all calls
    return set_on


def saved_with(devices: int) -> dict:
    state = capture_rng()
    state["cuda"] = [base64.b64encode(bytes([d]) * CUDA_STATE_BYTES).decode() for d in range(devices)]
    return state


@pytest.mark.parametrize(("saved", "restored"), [(8, [0]), (1, [0]), (0, [])])
def test_the_states_of_the_devices_both_have_are_restored(one_fake_gpu, saved, restored):
    state = saved_with(saved)
    check_rng(state)  # accepted: the count is not damage
    one_fake_gpu.clear()  # check_rng put this process's own states back
    restore_rng(state)  # before: RuntimeError (invalid device ordinal) for 8 saved states on 1 GPU
    assert one_fake_gpu == restored
