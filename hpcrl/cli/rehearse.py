"""`hpcrl rehearse TEMPLATE [--index N] [overrides]`: run a (GPU) recipe on this machine before a GPU does.

For each element (identical rehearsals once), hpcrl.rehearse.derive keeps what the recipe says about
the job (layout, placement, dtype, update backend and rollout engine resolved as on a GPU element,
algorithm, checkpoints) and shrinks the rest; the result is written as a plain template,
`<dir>/rehearsal.yaml` (rerun it with `hpcrl run`), and run twice in one run directory through the local
launcher: STEPS - 1 steps that end with a checkpoint, then a resumed launch for the last step. With
`parallel.verify_weight_sync` on, a weight sync that the optimizer's writes do not reach stops the job.
Then hpcrl.rehearse.report checks the metrics (every step once, resumed, weights moved every step,
reshard bytes = the planned bound, finite losses), and the full-size job's memory plan is printed.

`--model DIR`: rehearse with that HF directory at its real size (e.g. SmolLM2-135M) instead of a tiny
stand-in; the layout is then shrunk to what its dimensions allow.

Exit codes: 0 every rehearsal passed; 1 one failed (its lines say which check, its logs where); 2 a
config error (in the template, or in a rehearsal: a derivation bug, reported as such).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

from hpcrl.cli.common import add_template_arguments, overrides_from
from hpcrl.cli.plan import human
from hpcrl.errors import ConfigError, Problem
from hpcrl.experiment.resolve import resolve
from hpcrl.experiment.stage_kinds import require_rehearsed
from hpcrl.launcher import local, sweeps
from hpcrl.plan.memory import predict
from hpcrl.rehearse.derive import MAX_RANKS, STEPS, Rehearsal
from hpcrl.rehearse.workdir import (
    RUN_DIR,
    launch_log,
    read_report,
    rehearsal_identity,
    rehearsal_of,
    write_rehearsal,
)
from hpcrl.rollout.engine_rule import vllm_device

HELP = (
    "Rehearse a (GPU) recipe on CPU: its layout, dtype, backends, engine and a save + resume, at tiny sizes."
)


def add_arguments(parser) -> None:
    add_template_arguments(parser)
    parser.add_argument("--index", type=int, default=None, help="One sweep element (default: every one).")
    parser.add_argument("--steps", type=int, default=STEPS, help="RL steps (a save before the last one).")
    parser.add_argument("--max_ranks", type=int, default=MAX_RANKS, help="Most ranks a rehearsal runs.")
    parser.add_argument(
        "--model", default=None, help="An HF directory to rehearse with at its real size (no tiny model)."
    )
    parser.add_argument(
        "--dir", default=None, help="Where rehearsals go (default: <run_root>/rehearse/<name>/<UTC time>)."
    )


def main(args) -> int:
    sweep = resolve(args.template, overrides_from(args))
    require_rehearsed(sweep.elements[0].config, str(args.template))
    indices = range(len(sweep.elements)) if args.index is None else [_checked_index(args.index, sweep)]
    first = sweep.elements[indices[0]].config
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    root = Path(args.dir) if args.dir else Path(first.run_root) / "rehearse" / sweep.name / stamp
    vllm_here = vllm_device() == "cpu"
    seen: dict[str, int] = {}
    failed = 0
    for index in indices:
        element = sweep.elements[index]
        where = root / f"element-{index}"
        rehearsal = rehearsal_of(element, where, args.model, args.steps, args.max_ranks, vllm_here)
        key = rehearsal_identity(element.data, rehearsal)
        print(
            f"\nrehearse {sweep.template} [{index}] {element.config_id}: {rehearsal.ranks} rank(s)",
            flush=True,
        )
        if key in seen:
            print(f"  the same rehearsal as element {seen[key]}: not run again")
            continue
        seen[key] = index
        failed += not _rehearse(element, rehearsal, where, args, real_model=args.model is not None)
    return 1 if failed else 0


def _checked_index(index: int, sweep) -> int:
    if not 0 <= index < len(sweep.elements):
        raise ConfigError(Problem(f"--index {index} is outside 0..{len(sweep.elements) - 1}", key="--index"))
    return index


def _rehearse(element, rehearsal: Rehearsal, where: Path, args, *, real_model: bool) -> bool:
    """Write, run twice (save, resume), check and report one rehearsal; True when it passed."""
    for note in rehearsal.notes:
        print(f"  {note}")
    template = write_rehearsal(element, rehearsal, where, real_model=real_model)
    start = time.perf_counter()
    codes = [
        _launch(template, where / RUN_DIR, launch_log(where, n), steps)
        for n, steps in enumerate((args.steps - 1, args.steps), start=1)
    ]
    wall = time.perf_counter() - start
    if any(codes):
        print(f"  FAIL: launch exit codes {codes}; logs: {where}/launch-*.log ({wall:.0f} s)")
        return False
    report = read_report(element, rehearsal, where, args.steps)
    for line in report.lines():
        print(f"  {line}")
    _print_memory_plan(element)
    for failure in report.failures:
        print(f"  FAIL: {failure}")
    print(f"  {'PASS' if report.ok else 'FAIL'} in {wall:.0f} s; rerun: hpcrl run {template}", flush=True)
    return report.ok


def _launch(template: Path, run_dir: Path, log: Path, steps: int) -> int:
    """One launch of the rehearsal's config with `steps` steps into `run_dir`, output to `log`."""
    element = resolve(template, {"algorithm.steps": steps}).elements[0]
    with sweeps.writing(None, "run_root"):
        config_path = sweeps.write_config(element, run_dir / f"launch-{steps}")
    cluster = element.config.cluster
    with log.open("wb") as out:
        return local.run_local(
            config_path, run_dir, cluster.nodes * cluster.tasks_per_node, cluster.env, log=out
        )


def _print_memory_plan(element) -> None:
    plan = predict(element.config)
    fits = plan.device.kind == "cpu" or plan.device_peak <= plan.device.bytes
    print(
        f"  full-size memory plan ({plan.layout}): device peak {human(plan.device_peak)} of "
        f"{plan.device.name} {human(plan.device.bytes)}: {'fits' if fits else 'DOES NOT FIT'}; "
        f"host RAM peak {human(plan.host_peak)} per rank"
    )
