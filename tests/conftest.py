"""Shared fixtures and markers.

Markers: slurm (needs the dev cluster), dist (real multi-process gloo), gpu (skipped without CUDA,
with the reason), slow; background_start / background_check (registered here: ordering of background
work, see BACKGROUND_MARKERS). The `slurm_cluster` fixture fails loudly (not skip) when HPCRL_REQUIRE_SLURM=1
and the dev cluster is not running: CI must never pass by skipping the cluster tests.
"""

from __future__ import annotations

import os
import sys

import pytest

from tests.module_seconds import longest_modules_first, record_if_asked

BACKGROUND_MARKERS = {
    "background_start": "starts long, mostly idle background work through a session fixture (e.g. a Slurm "
    "element that runs for minutes); moved to the FRONT of the session",
    "background_check": "checks the background work of a background_start test; moved to the END of the "
    "session (run alone, it waits for the work)",
    "after_background": "CPU-heavy work that would slow the background work past its time budget (the "
    "one-minute requeue element); runs after the background checks",
}


def pytest_configure(config):
    for name, doc in BACKGROUND_MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")
    _one_thread_per_test_process()
    # as every hpcrl process on CPU: megatron-core's fusions off before a test module imports it (its
    # import would compile them through torch dynamo, ~2.5 s of CPU per pytest process, for nothing)
    import hpcrl.train.fusions_off  # noqa: F401  (after the thread count: it imports torch)

    record_if_asked(config)  # HPCRL_RECORD_MODULE_SECONDS=1: tests/module_seconds.json


def _one_thread_per_test_process() -> None:
    """2 cores, pytest-xdist workers and the Slurm session beside them: one OpenMP thread per process
    (ranks and runs started by a test inherit it), unless the caller set OMP_NUM_THREADS. Set before any
    test module imports torch, whose OpenMP runtime reads it once; two spinning threads per worker made
    in-process training tests several times slower."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.hookimpl(trylast=True)  # after any other reordering: these positions are what make the overlap
def pytest_collection_modifyitems(config, items):
    _skip_gpu_tests_without_cuda(items)
    longest_modules_first(items)  # tests/module_seconds.py
    _background_work_first_and_its_checks_last(items)


def _skip_gpu_tests_without_cuda(items) -> None:
    import torch

    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA: no GPU on this machine (gpu marker)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def _background_work_first_and_its_checks_last(items) -> None:
    """Background work overlaps the rest of the session instead of adding its wall time to it (the
    order is otherwise kept)."""

    def position(item) -> int:
        if item.get_closest_marker("background_start"):
            return 0
        if item.get_closest_marker("after_background"):
            return 3
        return 2 if item.get_closest_marker("background_check") else 1

    items.sort(key=position)  # stable


@pytest.fixture(scope="session")
def slurm_cluster():
    """The running dev Slurm cluster (tests/slurm/cluster.py: SlurmCluster) with SLURM_CONF exported.

    Absent cluster: pytest.fail when HPCRL_REQUIRE_SLURM=1 (CI, launch/test.sh), else skip.
    """
    from tests.slurm.cluster import ClusterAbsent, SlurmCluster

    try:
        cluster = SlurmCluster.load()
    except ClusterAbsent as err:
        if os.environ.get("HPCRL_REQUIRE_SLURM") == "1":
            pytest.fail(f"HPCRL_REQUIRE_SLURM=1 but the dev Slurm cluster is absent: {err}", pytrace=False)
        pytest.skip(f"dev Slurm cluster not running: {err}")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SLURM_CONF", str(cluster.slurm_conf))
        yield cluster


@pytest.fixture(scope="session")
def sft_copy_export(tmp_path_factory):
    """One trained policy per pytest run, shared read-only: `hpcrl run templates/sft_tiny.yaml --data.task
    copy_digits` (150 steps, held-out exact match 1.0), its `hf/` export. The distillation tests take it
    as their teacher (tests/rl/test_distill.py, tests/recovery/test_exactly_once_distill.py)."""
    from pathlib import Path

    from filelock import FileLock

    from hpcrl import cli

    # Under pytest-xdist every worker has a session of its own; the workers' base temp dirs share a
    # parent, where the first worker to take the lock trains and the others read its export.
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    root = shared / "sft_copy"
    with FileLock(str(shared / "sft_copy.lock")):
        found = list(root.glob("sft_tiny/*/hf"))
        if not found:
            template = Path(__file__).resolve().parents[1] / "templates" / "sft_tiny.yaml"
            quiet = ["--logging.tensorboard=false", "--logging.progress=false", "--logging.plot=false"]
            argv = ["run", str(template), "--data.task=copy_digits", f"--run_root={root}", *quiet]
            assert cli.main(argv) == 0
            found = list(root.glob("sft_tiny/*/hf"))
    [hf] = found
    return hf
