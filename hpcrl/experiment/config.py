"""The whole experiment: one dataclass composed of the components' own configs, and the registry of
stage kinds.

Each component owns its config (and its defaults); this module only composes them, so every default
has exactly one home. A stage kind's module (hpcrl.experiment.kinds) owns its section and rules; it is
registered here: once in STAGE_KINDS, once as a section of ExperimentConfig. Templates (YAML) and `--<dotted.key>` overrides are checked against
`ExperimentConfig`'s type hints by hpcrl.config.schema (not by jsonargparse, which stops at the first bad
key: a template author gets every problem at once, each with its file and key); jsonargparse only
parses the command line's own options.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hpcrl.algorithm.config import AlgorithmConfig
from hpcrl.ckpt.config import CheckpointConfig
from hpcrl.cluster.config import ClusterConfig
from hpcrl.config.ranges import Seed
from hpcrl.data.config import DataConfig
from hpcrl.distributed.config import ParallelConfig
from hpcrl.distributed.placement import PlacementConfig, placement_of
from hpcrl.experiment.kinds import dpo, rl, rm, sft
from hpcrl.experiment.kinds.dpo import DPOConfig
from hpcrl.experiment.kinds.kind import StageKind
from hpcrl.experiment.kinds.rm import RMConfig
from hpcrl.experiment.kinds.sft import SFTConfig
from hpcrl.metrics.config import LoggingConfig
from hpcrl.rewards.config import RewardConfig
from hpcrl.rollout.config import RolloutConfig
from hpcrl.train.config import ModelConfig, OptimizerConfig

STAGE_KINDS: dict[str, StageKind] = {kind.name: kind for kind in (rl.KIND, dpo.KIND, sft.KIND, rm.KIND)}
"""Every stage kind by name: what each reads, runs, checks and is watched by (hpcrl.experiment.stage_kinds
reads it)."""

StageName = Literal[tuple(STAGE_KINDS)]  # the names registered above, for the schema and --help
"""The values of `ExperimentConfig.stage`."""


@dataclass(kw_only=True)
class ExperimentConfig:
    """One resolved experiment = one array element."""

    name: str = "experiment"
    """Human name; run directories are <run_root>/<name>/<config id>."""
    seed: Seed = 0
    """Global seed (sampling, data order, dropout)."""
    run_root: str = "runs"
    """Where run directories are created (relative to the working directory)."""
    stage: StageName = "rl"
    """What the element trains: `rl` (online RL: the algorithm, rollout, reward and placement sections),
    `dpo` (offline DPO, IPO or KTO: the dpo section), `sft` (supervised fine-tuning: the sft section) or
    `rm` (a reward model on preference pairs: the rm section). Each stage
    reads the shared sections (model, parallel, optim, data, checkpoint, logging, cluster) and its own; a
    template setting another stage's section is refused at expand (hpcrl.experiment.stage_kinds, which
    also names each stage's entrypoint)."""
    entrypoint: str | None = None
    """`module:function` every rank of an element calls as `fn(cfg, run_dir, lifecycle=...)`: the
    ExperimentConfig, the run directory (Path) and the run's hpcrl.lifecycle.Lifecycle (its
    stop signals; an entrypoint that saves nothing may ignore it). null: the stage's own."""
    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    optim: OptimizerConfig = field(default_factory=OptimizerConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    dpo: DPOConfig = field(default_factory=DPOConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    rm: RMConfig = field(default_factory=RMConfig)
    data: DataConfig = field(default_factory=DataConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    @property
    def ranks_per_element(self) -> int:
        """Ranks one element needs: what its placement's pools take (hpcrl.distributed.placement)."""
        return placement_of(self.placement).ranks(self.parallel, self.placement)
