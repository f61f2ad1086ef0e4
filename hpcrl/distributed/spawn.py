"""Run a function on N local ranks that form a real torch.distributed group (gloo on CPU).

Used by tests, benchmarks and the memory planner's measurements. Each rank is a fresh process forked
from multiprocessing's fork server, which imported torch, megatron-core and transformers once (PRELOAD)
and nothing else: no state of the caller (an initialised megatron, a process group, a patched module)
reaches a rank, as with "spawn", but a rank starts without importing them again (~4-6 s of CPU each on
2 cores; megatron-core alone compiles its fusion decorators through torch._dynamo at import). The
caller's os.environ at the time of the call is installed in each rank (the server's is the one it
started with). Results come back pickled as bytes by the standard pickler, so a rank may exit before
the parent reads its tensors.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import socket
import traceback
from collections.abc import Callable
from typing import Any

from hpcrl.distributed.env import DistEnv, init_process_group


class RankFailed(RuntimeError):
    """A rank raised; the message holds its traceback."""


RANK_MODULES = (
    "torch",
    "torch.distributed",
    "megatron.core",
    "megatron.core.models.gpt",
    "megatron.core.models.gpt.gpt_layer_specs",
    "transformers",
    "transformers.modeling_utils",
    "transformers.models.llama.modeling_llama",
    "hpcrl.train.model",
)
"""What a rank of any stage imports first and slowly, so a fork server imports it once for all its ranks
(here and hpcrl.launcher.rank_server). The transformers model modules are in it because the first rank
to touch a model class pays for transformers' lazy module map, built by reading every model directory
(~1 s of CPU), and then for the model code, accelerate and kernels (~3 s in all, measured per forked
rank before they were preloaded)."""
PRELOAD = (
    "hpcrl.train.fusions_off",  # before megatron-core: its import compiles no fusions on CPU
    *RANK_MODULES,
    "hpcrl.distributed.frozen_heap",
)
"""Imported once by the fork server, in this order, before any rank is forked from it; the last one
freezes the heap the others built (hpcrl.distributed.frozen_heap)."""


def _context():
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))  # takes effect when the server starts (once per process)
    return ctx


def _rank_main(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    store: socket.socket | None,
    port: int,
    backend: str,
    timeout_s: float,
    args: tuple,
    results: mp.Queue,
    environ: dict[str, str],
) -> None:
    import torch
    import torch.distributed as dist

    os.environ.clear()
    os.environ.update(environ)
    torch.set_num_threads(1)
    env = DistEnv(
        rank=rank,
        world_size=world_size,
        local_rank=rank,
        node_rank=0,
        master_addr="127.0.0.1",
        master_port=port,
        node_name=socket.gethostname(),
        local_world_size=world_size,
        source="torchrun",
        store_fd=None if store is None else store.detach(),  # torch's store owns it from here
    )
    os.environ.update(env.torchrun_environ())
    try:
        init_process_group(env, backend, timeout_s)
        # every rank has its gloo mesh before any can tear it down: a rank whose fn returned at once
        # destroyed the group while a slower peer was still in connectFullMesh ("Connection closed by
        # peer"), which then failed in place of the rank that really failed (a loaded clean-clone run)
        dist.barrier()
        try:
            value = fn(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
        results.put((rank, True, pickle.dumps(value)))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str = "gloo",
    timeout_s: float = 180.0,
    collective_timeout_s: float = 60.0,
) -> list[Any]:
    """Call `fn(rank, world_size, *args)` on `world_size` spawned ranks; return their results by rank.

    `fn` must be importable (module level). Raises RankFailed with the first failing rank's traceback,
    or TimeoutError naming the ranks that did not report within `timeout_s`.
    """
    ctx = _context()
    results = ctx.Queue()
    environ = dict(os.environ)
    # bound here, hosted by rank 0 (hpcrl.distributed.env.STORE_FD_ENV): the port is never free between
    with socket.create_server(("127.0.0.1", 0), backlog=max(128, world_size)) as store:
        port = store.getsockname()[1]
        procs = [
            ctx.Process(
                target=_rank_main,
                args=(fn, rank, world_size, store if rank == 0 else None, port, backend)
                + (collective_timeout_s, args, results, environ),
                daemon=False,
            )
            for rank in range(world_size)
        ]
        for proc in procs:
            proc.start()  # the fork server holds its own copy of the socket for rank 0 once this returns
    collected: dict[int, Any] = {}
    failures: dict[int, str] = {}
    try:
        while len(collected) + len(failures) < world_size:
            try:
                rank, ok, payload = results.get(timeout=timeout_s)
            except queue.Empty:
                missing = sorted(set(range(world_size)) - collected.keys() - failures.keys())
                raise TimeoutError(f"ranks {missing} did not finish within {timeout_s}s") from None
            if ok:
                collected[rank] = pickle.loads(payload)
            else:
                failures[rank] = payload
                break  # peers of a failed rank may block in a collective until their timeout
    finally:
        for proc in procs:
            proc.join(timeout=5 if failures else collective_timeout_s)
            if proc.is_alive():
                proc.kill()
                proc.join()
    if failures:
        rank = min(failures)
        raise RankFailed(f"rank {rank} of {world_size} failed:\n{failures[rank]}")
    return [collected[rank] for rank in range(world_size)]
