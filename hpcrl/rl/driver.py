"""The single-controller RL step (HybridFlow §4) for the colocated and split placements: weights
train -> rollout, collect, train, as plain code over three parts.

    WeightSync    the actor's weights to the rollout engine through the reshard engine
                  (hpcrl.rl.weight_sync; ReshardHandoff in hpcrl.rl.handoff)
    Collector     prompts -> responses -> scores: a RolloutBatch (hpcrl.rl.collector)
    Learner       old/ref log-probs, values, advantages, updates (hpcrl.rl.learner)

Placement is the worker groups' business (hpcrl.rl.assemble): colocated, actor, reference, critic and
rollout live on the same ranks; split, actor + rollout on one pool and critic + reference on another.
Every rank runs this code on the same global tensors (hpcrl.rl.workers); rank 0 logs. The async
placement schedules the same Collector and Learner on two pools at once (hpcrl.rl.offpolicy.driver).
"""

from __future__ import annotations

from hpcrl.rl.collector import Collector
from hpcrl.rl.learner import Learner
from hpcrl.rl.timing import PhaseTimer, timing_metrics
from hpcrl.rl.weight_sync import WeightSync


class RLDriver:
    """One step: sync the weights, evaluate when due, collect batch `step` with them, train on it."""

    def __init__(self, collector: Collector, learner: Learner, weight_sync: WeightSync, eval_every: int):
        self.collector, self.learner, self.weight_sync = collector, learner, weight_sync
        self.eval_every = eval_every

    def step(self, step: int) -> dict[str, float]:
        timer = PhaseTimer()
        metrics: dict[str, float] = {"step": step}
        with timer.phase("reshard"):
            metrics |= self.weight_sync.publish(step)  # the weights after `step` updates
        if self.eval_every and step % self.eval_every == 0:
            with timer.phase("eval"):  # the policy before this step's update, on the weights just synced
                metrics |= self.collector.evaluate(step)
        batch = self.collector.collect(step, step, timer)
        metrics |= batch.metrics
        self.collector.rollout.sleep()  # the generation memory (store / vLLM weights + KV cache) until next sync
        tokens = self.learner.train(step, batch, timer, metrics)
        return metrics | timing_metrics(timer, *tokens)

    def final_evaluation(self, step: int) -> dict[str, float]:
        """Held-out reward of the final policy (after the last update), logged as step `steps`."""
        self.weight_sync.publish(step)
        heldout = self.collector.evaluate(step)
        self.collector.rollout.sleep()
        return {"step": step} | heldout
