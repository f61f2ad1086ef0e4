"""Shared fixtures and markers.

Markers: slurm (needs the dev cluster), dist (real multi-process gloo), gpu (skipped without CUDA,
with the reason), slow. The `slurm_cluster` fixture fails loudly (not skip) when HPCRL_REQUIRE_SLURM=1
and the dev cluster is not running: CI must never pass by skipping the cluster tests.
"""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA: no GPU on this machine (gpu marker)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _one_thread_per_test_process(monkeypatch):
    """2-core machines: keep OpenMP threads from oversubscribing when ranks run beside the test."""
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
