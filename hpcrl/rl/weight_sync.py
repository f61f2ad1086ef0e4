"""WeightSync: the trainer's weights -> what the rollout engine generates with, one version at a time.

HybridFlow's weight transition (Sheng et al. 2024, §5) in each placement, behind one method:
- colocated / split: the 3D-HybridEngine reshards the actor's training shards into the generation
  layout on the same ranks, at once (hpcrl.rl.handoff.ReshardHandoff);
- async: a training rank sends its shards to the rollout pool, which swaps them in at its next step
  (hpcrl.rl.offpolicy.weights.WeightSender; the receiving side is DoubleBufferedWeights);
- a rank outside the actor pool moves nothing (NoWeightSync).
A weight source of another shape (LoRA adapters only, experts) is one more implementation.
"""

from __future__ import annotations

from typing import Protocol


class WeightSync(Protocol):
    def publish(self, version: int) -> dict[str, float]:
        """Make the trainer's current weights, as `version` (the number of updates they hold), what the
        rollout generates with next; returns this rank's metrics of the move."""
        ...


class NoWeightSync:
    """A rank whose rollout engine is fed by another rank (or that has none): nothing moves."""

    def publish(self, version: int) -> dict[str, float]:
        return {}
