"""The rank server (hpcrl.launcher.rank_server): a local element's ranks are forked from one process
that imported torch, megatron-core and the entrypoint once, safely (no CUDA, one Python thread), and
still look like the element to `hpcrl cancel`'s ownership check (the server leads the group with the
element's command line: tests/launcher/test_local.py cancels a running element through it, and
test_sweep_dir_hostile.py shows a foreign group leader is left alone)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from hpcrl import cli
from hpcrl.launcher import rank_server
from hpcrl.launcher.rank_server import START_ENV

REPO = Path(__file__).resolve().parents[2]


def _in_fresh_python(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.heavy
def test_after_its_imports_the_server_has_no_cuda_and_one_python_thread():
    """What a rank inherits: the server preloads torch, megatron-core and the RL entrypoint; none of that
    initialises CUDA or starts a Python thread (a forked child keeps only the forking thread)."""
    seen = _in_fresh_python(
        "import json, importlib, sys, threading\n"
        "from hpcrl.launcher import rank_server as r\n"
        "loaded = r.preload()\n"  # no entrypoint: the fixed list only
        "importlib.import_module('hpcrl.rl.job')\n"
        "import torch\n"
        "print(json.dumps({'loaded': loaded, 'cuda': torch.cuda.is_initialized(),\n"
        "  'threads': threading.active_count(), 'problems': r.fork_safety_problems()}))\n"
    )
    assert seen == {"loaded": list(rank_server.RANK_MODULES), "cuda": False, "threads": 1, "problems": []}


@pytest.mark.parametrize(
    ("given", "world", "expected"),
    [(None, 1, "cpus"), (None, 2, "half"), (None, 4096, "1"), ("3", 8, "3"), ("0", 8, "0"), ("x", 2, "x")],
)
def test_a_rank_shares_the_cpus_unless_omp_num_threads_is_set(monkeypatch, tmp_path, given, world, expected):
    """Set by the caller or cluster.env: passed on as it is (torch judges it, as in a fresh interpreter);
    unset: the CPUs this process may run on, shared among the ranks, at least 1."""
    if given is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", given)
    cpus = len(os.sched_getaffinity(0))
    want = {"cpus": str(cpus), "half": str(max(1, cpus // 2))}.get(expected, expected)
    env = rank_server.rank_environ(0, world, 29500, tmp_path / "0.json")
    assert env["OMP_NUM_THREADS"] == want


def test_a_python_thread_is_named_as_a_reason_not_to_fork():
    seen = _in_fresh_python(
        "import json, threading\nfrom hpcrl.launcher import rank_server as r\n"
        "e = threading.Event(); t = threading.Thread(target=e.wait); t.start()\n"
        "print(json.dumps(r.fork_safety_problems())); e.set()\n"
    )
    assert seen == ["2 Python threads"]


def test_the_server_module_keeps_no_mutable_state():
    """Its globals are modules, functions, classes and immutable constants: what a rank inherits from
    the server is the imports, nothing the server changed."""
    allowed = (types.ModuleType, types.FunctionType, type, str, int, tuple, frozenset, type(None))
    mutable = {
        name: type(value).__name__
        for name, value in vars(rank_server).items()
        if not name.startswith("__") and name != "annotations" and not isinstance(value, allowed)
    }
    assert mutable == {}


def _template(tmp_path: Path, ranks: int) -> Path:
    template = tmp_path / "t.yaml"
    template.write_text(
        "entrypoint: tests.launcher._fork_probe:main\nname: forked\n"
        f"run_root: {tmp_path / 'runs'}\nparallel: {{data: {ranks}}}\ncluster: {{tasks_per_node: {ranks}}}\n"
    )
    return template


@pytest.mark.heavy
@pytest.mark.dist
@pytest.mark.parametrize("mode", ["fork", "exec"])
def test_ranks_are_children_of_the_server_which_leads_their_group(tmp_path, capsys, monkeypatch, mode):
    """fork (the default): each rank is the server's image (its command line, megatron-core already
    imported); exec (the baseline, HPCRL_LOCAL_RANK_START=exec): a fresh interpreter per rank. Either
    way the server is every rank's parent and process-group leader, and each rank has its own
    torchrun-style environment. Rank 0 alone holds the socket the server bound on MASTER_PORT, to host
    the store on (HPCRL_STORE_FD): the port was never free for another process to take."""
    monkeypatch.setenv(START_ENV, mode)
    monkeypatch.delenv("OMP_NUM_THREADS")  # the server's torch then runs one thread per CPU
    assert cli.main(["run", str(_template(tmp_path, 3))]) == 0
    run_dir = Path(capsys.readouterr().out.splitlines()[0].removeprefix("run dir: "))
    reports = [json.loads((run_dir / f"rank_{rank}.json").read_text()) for rank in range(3)]
    servers = {r["ppid"] for r in reports}
    assert len(servers) == 1 and {r["pgid"] for r in reports} == servers
    assert len({r["pid"] for r in reports}) == 3
    assert [r["rank_env"][:3] for r in reports] == [[str(k), "3", str(k)] for k in range(3)]
    assert len({r["rank_env"][3] for r in reports}) == 1  # one MASTER_PORT
    store_fd = reports[0]["store_fd"]
    assert [r["listening_on_master_port"] for r in reports] == [[int(store_fd)], [], []]
    assert [r["store_fd"] for r in reports[1:]] == [None, None]
    forked = mode == "fork"
    for report in reports:
        element_argv = report["cmdline"][1:5]
        assert element_argv == ["-m", "hpcrl.launcher.element", str(run_dir / "config.yaml"), str(run_dir)]
        assert ("--ranks" in report["cmdline"]) is forked
        assert report["megatron_preloaded"] is forked
        assert (report["frozen_objects"] > 100_000) is forked  # the preloaded heap, frozen before forking
        shared = str(max(1, len(os.sched_getaffinity(0)) // 3))  # the CPUs shared among the 3 ranks
        assert report["omp_threads"] == shared
        assert report["torch_threads"] == int(shared)  # forked: set after the server's torch read its env
    for rank in range(3):  # a forked rank skips interpreter teardown, not what exit owes its code
        assert (run_dir / f"rank_{rank}.atexit").read_text() == "ran"
        assert (run_dir / f"rank_{rank}.thread").read_text() == "joined"


def test_a_stop_signal_that_came_while_forking_reaches_the_last_rank_and_ends_the_unforked_ones(tmp_path):
    """The server holds INT and TERM (blocked) until its ranks exist and checks before each fork: a
    signal pending there forks no more ranks. Only the last rank forked can have missed it (it came
    between that check and that fork): it gets the signal itself (an INT stays an INT: a rank saves on
    it), and each rank never forked is recorded as ended by it. A fresh interpreter: signal masks."""
    seen = _in_fresh_python(
        "import argparse, json, os, signal, time\n"
        "from pathlib import Path\n"
        "from hpcrl.launcher import rank_server as r\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, r.STOP_SIGNALS)\n"
        "server = os.getpid()\n"
        "pid = os.fork()\n"
        "if pid == 0:  # rank 0: waits to be stopped, or for the server's end (a failing test)\n"
        "    signal.signal(signal.SIGINT, signal.SIG_DFL)\n"
        "    signal.pthread_sigmask(signal.SIG_UNBLOCK, r.STOP_SIGNALS)\n"
        "    while os.getppid() == server: time.sleep(0.05)\n"
        "    os._exit(0)\n"
        "os.kill(os.getpid(), signal.SIGINT)  # came after rank 0's fork, pending in the server only\n"
        f"ends = Path({str(tmp_path)!r})\n"
        "r._release_stop_signals({pid: 0}, argparse.Namespace(ranks=3, ends=ends))\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print(json.dumps({'rank0': -os.WTERMSIG(status), 'unforked': [r.read_record(r.end_path(ends, k))\n"
        "    ['returncode'] for k in (1, 2)], 'ignored': signal.getsignal(signal.SIGTERM) == signal.SIG_IGN}))\n"
    )
    assert seen == {"rank0": -2, "unforked": [-2, -2], "ignored": True}
