"""The rules of a cluster config alone: sbatch directive text, environment names, module names and
numbers, each as (dotted key, message). They run at expand/submit for every element
(hpcrl.experiment.rules) and again on the ranks.

Why these rules: `cluster.*` values become #SBATCH directives, exported environment variables and
`module load` arguments in the batch script (hpcrl.launcher.sbatch renders it); a value that steers which
code runs, or that sbatch would take as given (`--mem=-10GB`), must be refused before anything is
submitted.
"""

from __future__ import annotations

import re

from hpcrl.cluster.config import ClusterConfig
from hpcrl.config.schema import range_problems
from hpcrl.errors import Problem, short

_DIRECTIVE_SAFE = re.compile(r"[\w.,:&|!*+\[\]()@/%=-]+")
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
_MODULE_NAME = re.compile(r"[\w.+/@:][\w.+/@:-]*")  # never a leading '-': it would be an option

DIRECTIVE_FIELDS = ("partition", "account", "qos", "gres", "constraint")
"""ClusterConfig fields that become #SBATCH directives verbatim."""


ENV_FORBIDDEN = {
    "PATH": "it chooses the programs the batch script and the ranks run (srun included)",
    "HOME": "Python adds ~/.local site-packages (and runs usercustomize) from it",
    "BASH_ENV": "every non-interactive bash sources the file it names",
    "ENV": "sh sources the file it names",
    "IFS": "it changes how bash splits words",
    "PS4": "bash expands it (command substitution included) when tracing",
    "SHELLOPTS": "it sets bash options in every child bash",
    "BASHOPTS": "it sets bash options in every child bash",
    "PROMPT_COMMAND": "bash runs it as a command",
    "GLIBC_TUNABLES": "the dynamic loader parses it at every exec",
    "GCONV_PATH": "glibc loads character-set converters from it",
    "CUDA_INJECTION64_PATH": "CUDA loads the library it names into every process",
}
"""Environment names a config may not set, and why: each changes which code runs, not how it runs."""
ENV_FORBIDDEN_PREFIXES = {
    "LD_": "the dynamic loader reads them (LD_PRELOAD, LD_LIBRARY_PATH, ...)",
    "SLURM_": "srun reads them (SLURM_TASK_PROLOG runs a program in every task)",
    "SRUN_": "srun reads them",
    "SBATCH_": "sbatch reads them",
    "SUBMITIT_": "submitit reads them in every rank",
    "PYTHON": "they change the interpreter (PYTHONPATH, PYTHONHOME, PYTHONSTARTUP, ...)",
}
"""Environment name prefixes a config may not use, and why."""
ENV_ALLOWED = frozenset(
    {
        "PYTHONHASHSEED",
        "PYTHONUNBUFFERED",
        "PYTHONFAULTHANDLER",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONIOENCODING",
        "PYTHONUTF8",
        "PYTHONSAFEPATH",
    }
)
"""PYTHON* names that only tune the interpreter (hashing, buffering, encodings, a safer sys.path)."""
ENV_SAFE_PREFIXES = {
    "OMP_": "OpenMP threads and placement",
    "MKL_": "MKL threads and code paths",
    "OPENBLAS_": "OpenBLAS threads",
    "NUMEXPR_": "numexpr threads",
    "NCCL_": "NCCL transport tuning (interfaces, IB devices, buffers, debug level)",
    "GLOO_": "gloo's network interface",
    "UCX_": "UCX transport tuning",
    "FI_": "libfabric provider tuning",
    "CUDA_": "CUDA device selection and launch behaviour",
    "NVTE_": "Transformer Engine switches",
    "TORCH_": "torch.distributed and torch debug switches",
    "PYTORCH_": "PyTorch allocator settings",
    "HF_": "Hugging Face Hub switches (offline mode, token)",
    "TRANSFORMERS_": "transformers switches (offline mode, verbosity)",
    "TOKENIZERS_": "tokenizers parallelism",
    "VLLM_": "vLLM switches",
    "WANDB_": "Weights & Biases settings",
    "MLFLOW_": "MLflow settings",
    "HPCRL_": "hpcrl's own knobs (test switches)",
}
"""Name prefixes accepted in `cluster.env` without `env_allow`, and what they tune. An ALLOWLIST: the
old denylist could not be complete (NCCL_NET_PLUGIN, OMPI_MCA_*, PERL5LIB and NODE_OPTIONS passed).
Even under these prefixes a name with a part in ENV_CODE_PARTS is not safe by its prefix alone."""
ENV_CODE_PARTS = (
    "PATH", "FILE", "DIR", "HOME", "PLUGIN", "LIB", "PRELOAD", "CACHE", "MODULE", "EXEC", "COMMAND", "CMD",
    "SCRIPT", "HOOK",
)  # fmt: skip
"""Parts of a name (between '_', as a prefix of the part: PATHS, LIBRARIES) that say it names a file,
directory or program: NCCL_NET_PLUGIN and NCCL_TUNER_PLUGIN load a library, OMP_TOOL_LIBRARIES loads
tools, CUDA_INJECTION64_PATH a library, NCCL_DEBUG_FILE writes a file, TORCH_EXTENSIONS_DIR holds built
code, HF_HOME holds downloaded remote code. They need `env_allow`."""


def env_problems(env: dict[str, str], allow: list[str] | tuple[str, ...] = ()) -> list[Problem]:
    """`cluster.env` names that are not plain upper-case names, that steer code, or that are neither
    known-safe (`env_name_is_safe`) nor in `allow` (cluster.env_allow), as (key, message). Then the
    `allow` names themselves: plain names, none of them one that steers code.

    The values need no rule of their own beyond the text rule (hpcrl.config.text_rules): they are
    always one shlex-quoted word."""
    out = []
    for name in env:
        key = f"cluster.env.{name}"
        refusal = _steering(name)
        if refusal:
            out.append(Problem(refusal, key=key))
        elif not (env_name_is_safe(name) or name in allow):
            out.append(
                Problem(
                    f"{name} is not a known-safe name (OMP_*, NCCL_*, CUDA_*, TORCH_*, HF_*, ... with no "
                    "path, file, directory, library or plugin part: hpcrl.cluster.rules.ENV_SAFE_PREFIXES): if "
                    f"it only tunes how the job runs, accept it with --cluster.env_allow '[{name}]' or in a "
                    "cluster profile's env_allow",
                    key=key,
                )
            )
    for name in allow:
        refusal = _steering(name)
        if refusal:
            out.append(Problem(f"{short(name)}: cannot be allowed: {refusal}", key="cluster.env_allow"))
    return out


def env_name_is_safe(name: str) -> bool:
    """A PYTHON* tuning name, or a name under ENV_SAFE_PREFIXES with no part in ENV_CODE_PARTS."""
    if name in ENV_ALLOWED:
        return True
    if not name.startswith(tuple(ENV_SAFE_PREFIXES)):
        return False
    return not any(part.startswith(ENV_CODE_PARTS) for part in name.split("_"))


def _steering(name: str) -> str | None:
    """Why `name` can never be set from a config (not a name, or one that changes which code runs)."""
    if not _ENV_NAME.fullmatch(name):
        return f"{short(name)} is not an environment variable name ([A-Z_][A-Z0-9_]*)"
    if name in ENV_FORBIDDEN:
        return f"may not be set from a config: {ENV_FORBIDDEN[name]}"
    if name in ENV_ALLOWED:
        return None
    prefix = next((p for p in ENV_FORBIDDEN_PREFIXES if name.startswith(p)), None)
    if prefix:
        return f"{prefix}* may not be set from a config: {ENV_FORBIDDEN_PREFIXES[prefix]}"
    return None


def check_cluster(cluster: ClusterConfig) -> list[Problem]:
    """Values that cannot safely become sbatch directives or shell names, as (dotted key, message)."""
    out = []
    for name in DIRECTIVE_FIELDS:
        value = getattr(cluster, name)
        if value is not None and not _DIRECTIVE_SAFE.fullmatch(value):
            out.append(
                Problem(
                    f"{short(value)} has characters Slurm does not use in a {name}", key=f"cluster.{name}"
                )
            )
    out += env_problems(cluster.env, cluster.env_allow)
    for module in cluster.modules:
        if not _MODULE_NAME.fullmatch(module):
            out.append(Problem(f"{short(module)} is not a module name", key="cluster.modules"))
    if cluster.container is not None and not _MODULE_NAME.fullmatch(cluster.container):
        out.append(Problem(f"{short(cluster.container)} is not an image reference", key="cluster.container"))
    return out + _range_problems(cluster)


def _range_problems(cluster: ClusterConfig) -> list[Problem]:
    """Numbers sbatch would take as given (`--mem=-10GB`, `--time=10^30`: each field's Range, checked
    here too for a config built in code) or that break the job's own schedule: the warning signal must
    come inside the time limit, or the job is told to save and stop the moment it starts (USR2@300 on
    a 1-minute job was killed after 8 s, FAILED)."""
    out = range_problems(cluster, "cluster.")
    limit_s = cluster.time_min * 60
    if not out and cluster.signal_delay_s >= limit_s:
        message = (
            f"the warning signal {cluster.signal_delay_s} s before the end must come after the start: "
            f"below cluster.time_min = {cluster.time_min} min = {limit_s} s"
        )
        out.append(Problem(message, key="cluster.signal_delay_s"))
    return out
