"""`hpcrl run TEMPLATE [--index N] [overrides]`: run one resolved config here, in the foreground.

Prints the run directory first. A 1-rank element runs in this process; an N-rank element runs as N
local processes (torchrun-style environment) supervised as one job (hpcrl.launcher.ranks). Exit codes:
0; 1 a failure of the in-process rank; 2 a config error (also: the run is locked by another writer);
3 (RANK_DIED_EXIT) a rank of an N-rank run died, named on stderr; 128 + N when stopped by signal N
(130 for Ctrl-C). This is the main-job command of the README.
"""

from __future__ import annotations

from hpcrl.cli.common import add_template_arguments, overrides_from, print_config_if_asked
from hpcrl.cli.pipeline import run_pipeline
from hpcrl.errors import ConfigError, Problem
from hpcrl.experiment.resolve import ResolvedConfig, resolve
from hpcrl.launcher import local, sweeps
from hpcrl.launcher.element import run_element, scoped_environ
from hpcrl.lifecycle import Lifecycle
from hpcrl.pipeline.spec import is_pipeline_file
from hpcrl.progress import DelayedProgress

HELP = "Run one resolved config of a template on this machine (foreground); prints the run dir first."


def add_arguments(parser) -> None:
    add_template_arguments(parser)
    parser.add_argument("--index", type=int, default=None, help="Which sweep element to run (sweeps only).")


def main(args) -> int:
    if is_pipeline_file(args.template):
        return run_pipeline(args, run_resolved)
    with DelayedProgress() as track:
        sweep = resolve(args.template, overrides_from(args), track=track)
    if print_config_if_asked(args, sweep):
        return 0
    if args.index is None and len(sweep.elements) > 1:
        raise ConfigError(
            Problem(
                f"the template is a sweep of {len(sweep.elements)}: pick one with --index",
                file=str(args.template),
                key="sweep",
            )
        )
    index = args.index or 0
    if not 0 <= index < len(sweep.elements):
        raise ConfigError(Problem(f"--index {index} is outside 0..{len(sweep.elements) - 1}", key="--index"))
    return run_resolved(sweep.elements[index])


def run_resolved(element: ResolvedConfig) -> int:
    """Write the element's config into its run dir and run it here; the exit code of the module docstring."""
    problems = sweeps.run_root_problems([element.config.run_root])
    if problems:
        raise ConfigError(problems)
    with sweeps.writing(None, "run_root"):
        config_path = sweeps.write_config(element)
    print(f"run dir: {element.run_dir}", flush=True)
    cluster = element.config.cluster
    world = cluster.nodes * cluster.tasks_per_node
    if world == 1:
        from hpcrl.train.megatron_compat import fusions_off_without_cuda  # imports torch: here only, the
        # launcher of N ranks imports none (their rank server does)

        fusions_off_without_cuda()  # before the in-process rank imports megatron-core
        # the caller's environment comes back afterwards: `hpcrl run` may be called in-process (tests,
        # notebooks), whose later sbatch calls and runs must not inherit this element's cluster.env
        lifecycle = Lifecycle.for_this_process()
        with scoped_environ(cluster.env):
            run_element(config_path, element.run_dir, lifecycle)
        return 128 + lifecycle.interrupted_by if lifecycle.interrupted_by else 0  # Ctrl-C: saved, stopped
    return local.run_local(config_path, element.run_dir, world, cluster.env, grace_s=cluster.stop_grace_s)
