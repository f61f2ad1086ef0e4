"""Checkpoint and resume of a stage through hpcrl.ckpt (sharded HDF5, any layout on load): every stage
(the RL job hpcrl.rl.job, offline DPO hpcrl.posttrain.dpo) shares it.

Saved: the step, RNG states and a list of `Stateful`s (hpcrl.stages.stateful), each component's own: the
trainers' parameters and AdamW state as shards, one prefix per trainer ("actor." / "critic."), with an
fp16 trainer's loss-scale state (TrainerStates); the data cursor (DataCursorState); whatever else a stage
registers (the async placement: its weight version and the batches generated but not yet trained,
hpcrl.rl.offpolicy.driver). Not saved: the reference model (it is rebuilt from the same init or HF directory)
and the rollout engine (it receives the actor's weights at the start of every step).
Saves are async when `checkpoint.async_save`: every saved trainer fences the
in-flight save before its optimizer step (`Trainer.add_pre_step_hook(checkpointer.fence)`), the first
in-place write of its parameters and optimizer state in a step (nothing else writes them in place: the
reshard engine and the rollout engines only read the training shards).
When to save is `hpcrl.ckpt.trigger.SaveTrigger`, reading the run's `Lifecycle` (the owner of the
signals, hpcrl.lifecycle): every `checkpoint.every_steps`, on SIGUSR1 (plain
`sbatch --signal=B:USR1@N`) or submitit's USR2, and before the time limit; a requested or deadline save
also stops the run and asks the launcher to requeue it (`lifecycle.stop_for_requeue`); on SIGTERM
(preemption, `scontrol requeue`) or a local Ctrl-C it saves and stops without one, and the job Slurm
restarts resumes at that step. `RunState.step` counts completed steps, so a resumed run starts
at that step, and metrics.jsonl is cut back to the steps before it (those after it are redone: each step
is logged once).

Run identity (hpcrl.stages.run_identity): group rank 0 reads or creates `<run_dir>/run.json`, every
checkpoint carries its run id, and a resume refuses a checkpoint of another run (ConfigError naming
checkpoint.dir and both run ids). `checkpoint.resume_from` starts a new run from another run's weights.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch.distributed as dist

from hpcrl.ckpt.checkpointer import Checkpointer
from hpcrl.ckpt.load import ForeignCheckpoint, Loaded, NoCheckpoint, load_checkpoint
from hpcrl.ckpt.manifest import CheckpointError, Manifest
from hpcrl.ckpt.megatron import load_into_trainer, model_extra, trainer_specs
from hpcrl.ckpt.shards import ShardSpec
from hpcrl.ckpt.state import RunState, restore_rng
from hpcrl.ckpt.trigger import SaveTrigger, restart_count
from hpcrl.distributed.collectives import all_gather_json, group_rank
from hpcrl.errors import ConfigError, Problem
from hpcrl.experiment.config import ExperimentConfig
from hpcrl.lifecycle import Lifecycle
from hpcrl.metrics.sinks import METRICS_FILE
from hpcrl.stages.run_identity import RunIdentity, fingerprint_of, load_or_create
from hpcrl.stages.stateful import DATA_CURSOR, Stateful, TrainerStates

if TYPE_CHECKING:
    from hpcrl.train.trainer import Trainer

log = logging.getLogger(__name__)


def cut_metrics_back(path: Path, resume_step: int) -> int:
    """Drop the records of steps >= `resume_step` (logged after the checkpoint, before the crash; they are
    redone) and a torn last line, IN PLACE: the metrics logger already holds the file open for appending
    (O_APPEND writes go to the new end). Returns the number of records dropped."""
    if not path.exists():
        return 0
    kept, dropped = [], 0
    for line in path.read_bytes().splitlines(keepends=True):
        try:
            record = json.loads(line)
        except ValueError:  # torn by the kill
            dropped += 1
            continue
        if record.get("step", 0) < resume_step:
            kept.append(line if line.endswith(b"\n") else line + b"\n")
        else:
            dropped += 1
    data = b"".join(kept)
    with path.open("r+b") as fh:
        fh.write(data)
        fh.truncate(len(data))
        fh.flush()
        os.fsync(fh.fileno())
    return dropped


def establish_identity(cfg: ExperimentConfig, run_dir: Path, group: dist.ProcessGroup | None) -> RunIdentity:
    """This run's identity on every rank: group rank 0 reads or creates `<run_dir>/run.json` (one writer:
    the run lock's holder) and shares it, or shares its ConfigError, which every rank then raises."""
    payload: dict = {}
    if group_rank(group) == 0:
        try:
            payload = {"identity": load_or_create(run_dir, cfg).to_json()}
        except ConfigError as err:
            payload = {"problems": [vars(p) for p in err.problems]}
    agreed = all_gather_json(payload, group)[0]
    if "problems" in agreed:
        raise ConfigError([Problem(**p) for p in agreed["problems"]])
    return RunIdentity(**agreed["identity"])


class StageCheckpointing:
    """Save / resume of a stage's `trainers` (prefix -> Trainer on this rank) and its other `states`."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        run_dir: Path,
        trainers: dict[str, Trainer],
        states: list[Stateful],
        lifecycle: Lifecycle | None = None,
    ):
        """`trainers` are checkpointed first (TrainerStates) and are what `checkpoint.resume_from` loads;
        `states` are restored in their order, after the RNG states."""
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.lifecycle = lifecycle or Lifecycle()  # a direct call (tests): inert, no signal handlers
        self.trainers = dict(trainers)
        self.states: list[Stateful] = [TrainerStates(self.trainers), *states]
        self.group = dist.group.WORLD if dist.is_initialized() and dist.get_world_size() > 1 else None
        self.identity = establish_identity(cfg, self.run_dir, self.group)
        self.checkpointer = Checkpointer.from_config(cfg.checkpoint, run_dir, self.group)
        self.trigger = SaveTrigger.from_slurm(
            cfg.checkpoint.every_steps, safety=cfg.checkpoint.deadline_safety, signals=self.lifecycle
        )
        self.lifecycle.checkpoints_and_resumes(time_left_s=self.trigger.time_left())
        # the optimizer step is the first in-place write of what an async save copies in the background
        self._removers = [t.add_pre_step_hook(self.checkpointer.fence) for t in self.trainers.values()]
        self._step_started = time.perf_counter()
        self._last_saved: int | None = None

    def resume(self) -> int:
        """Load the newest committed checkpoint that verifies when resume=auto; return the start step.

        Every committed `step_N` is a candidate, newest first (at most `latest`'s step, or all of them
        when `latest` is missing, empty or garbled), and each is verified by the loader before it is used:
        a torn manifest or a damaged file moves all ranks on to the next older one together
        (`checkpoint.fallback`), and the rejected one is set aside so this run can commit its step again.
        Either way the metrics log is cut back to the start step: records of an earlier attempt that
        died before its first checkpoint are redone from step 0 and must not appear twice. Only this
        run's checkpoints are resumed; without one, `checkpoint.resume_from` gives the first weights."""
        loaded = self._load_own() if self.cfg.checkpoint.resume == "auto" else None
        if loaded is None:
            if self.cfg.checkpoint.resume_from:
                self._start_from(self.cfg.checkpoint.resume_from)
            if group_rank(self.group) == 0:
                cut_metrics_back(self.run_dir / METRICS_FILE, 0)
            return 0
        if loaded.rng is not None:
            restore_rng(loaded.rng)
        saved = {**loaded.state.algorithm_state, DATA_CURSOR: loaded.state.data_cursor}
        for state in self.states:
            state.restore(loaded.state.step, saved.get(state.key), loaded.tensors)
        if group_rank(self.group) == 0:
            cut_metrics_back(self.run_dir / METRICS_FILE, loaded.state.step)
        log.warning("resumed from %s at step %d", loaded.path, loaded.state.step)
        self._last_saved = loaded.state.step
        return loaded.state.step

    def _load_own(self) -> Loaded | None:
        """This run's newest good checkpoint (None: nothing committed yet, a fresh start). One written
        by another run is a ConfigError: resuming it would continue someone else's training."""
        try:
            return self.checkpointer.load(
                self._specs, fallback=self.cfg.checkpoint.fallback, expect_run_id=self.identity.run_id
            )
        except NoCheckpoint:
            return None
        except ForeignCheckpoint as err:
            raise ConfigError(self._foreign_problem(err)) from None

    def _foreign_problem(self, err: ForeignCheckpoint) -> Problem:
        root, mine = self.checkpointer.root, self.identity.run_id
        same = fingerprint_of(err.run_id) == self.identity.fingerprint
        why = "the same config, started at another time" if same else "another config"
        return Problem(
            f"{root} holds another run's checkpoints: {err.directory.name} was written by run {err.run_id} "
            f"(fingerprint {fingerprint_of(err.run_id) or '?'}), this run is {mine} (fingerprint "
            f"{self.identity.fingerprint}): {why}. Not resumed. Give this run its own checkpoint.dir; to "
            f"start from that run's weights also set checkpoint.resume_from: {root}",
            key="checkpoint.dir",
        )

    def _start_from(self, source: str) -> None:
        """Fine-tuning start: the trainers' weights from another run's checkpoint (any run id), nothing
        else (optimizer, data cursor and RNG stay fresh; the run starts at step 0 under its own id). A
        trainer the checkpoint has no tensor for (a critic from a GRPO run) keeps its initialisation."""
        skipped: set[str] = set()

        def weight_specs(manifest: Manifest) -> list[ShardSpec]:
            specs = []
            for prefix, trainer in self.trainers.items():
                if not any(name.startswith(prefix) for name in manifest.tensors):
                    skipped.add(prefix)
                    continue
                specs += [s for s in trainer_specs(trainer, manifest, prefix) if _is_weight(s.name, prefix)]
            return specs

        try:
            loaded = load_checkpoint(
                source, weight_specs, group=self.group, fallback=self.cfg.checkpoint.fallback
            )
        except CheckpointError as err:  # none there, another model, nothing verifies
            raise ConfigError(Problem(f"cannot start from it: {err}", key="checkpoint.resume_from")) from None
        for prefix, trainer in self.trainers.items():
            if prefix not in skipped:
                load_into_trainer(trainer, loaded.tensors, prefix)
        log.warning(
            "started from the weights of %s (run %s, step %d)%s",
            loaded.path,
            loaded.state.run_id or "?",
            loaded.state.step,
            f"; not in it, kept fresh: {sorted(skipped)}" if skipped else "",
        )

    def _specs(self, manifest: Manifest) -> list[ShardSpec]:
        """What this rank loads from a candidate: each state's tensors (any of them may reject it)."""
        return [spec for state in self.states for spec in state.checkpoint_specs(manifest)]

    def save(self, completed_steps: int) -> None:
        start = time.perf_counter()
        extra = {"models": {}}
        for prefix, trainer in self.trainers.items():
            extra["models"].update(model_extra(trainer, prefix)["models"])
        shards = [shard for state in self.states for shard in state.checkpoint_shards()]
        saved = {state.key: s for state in self.states if (s := state.checkpoint_state()) is not None}
        state = RunState(
            step=completed_steps,
            data_cursor=saved.pop(DATA_CURSOR, {}),  # its own field in the format (hpcrl.stages.stateful)
            algorithm_state=saved,
            run_id=self.identity.run_id,
            restart_count=restart_count(),
        )
        p = self.cfg.parallel
        self.checkpointer.save(
            completed_steps, shards, state, layout={"t": p.tensor, "p": p.pipeline, "d": p.data}, extra=extra
        )
        self.trigger.record_save(time.perf_counter() - start)
        self._last_saved = completed_steps

    @property
    def committed_steps(self) -> int:
        """The completed steps that the last checkpoint this attempt committed holds (0: none yet; rank 0,
        where the trackers run: hpcrl.metrics.trackers)."""
        return self.checkpointer.committed_step or 0

    def after_step(self, step: int) -> bool:
        """Save when the trigger says so; True = stop now (signal or time limit). A stop waits for the
        save to be committed and asks the launcher to requeue the element."""
        self.trigger.record_step(time.perf_counter() - self._step_started)
        if self.checkpointer.last_save_s is not None:  # an async save's whole time, not just its call
            self.trigger.record_save(self.checkpointer.last_save_s)
        decision = self.trigger.decide(step + 1, self.group)
        if decision.save:
            self.save(step + 1)
        if decision.stop:
            self.checkpointer.wait()
            why = ", ".join(decision.reasons)
            if decision.requeue:
                log.warning("step %d: saved (%s), stopping for requeue", step + 1, why)
                self.lifecycle.stop_for_requeue()
            else:
                log.warning("step %d: saved (%s), stopping: the job is ending", step + 1, why)
                self.lifecycle.stop_for_termination()
        self._step_started = time.perf_counter()
        return decision.stop

    def close(self, completed_steps: int, *, between_steps: bool = True) -> None:
        """Save on exit (checkpoint.save_on_exit) and close. Not when a step was interrupted
        (`between_steps` False: an exception, a second Ctrl-C, left it midway): its weights or optimizer
        state may be half updated, and a checkpoint of them labelled `completed_steps` would resume into a
        state no run had; the run resumes from its last checkpoint instead."""
        for remove in self._removers:
            remove()
        self._removers = []
        if self.cfg.checkpoint.save_on_exit and completed_steps > 0 and self._last_saved != completed_steps:
            if between_steps:
                self.save(completed_steps)
            else:
                log.warning(
                    "not saved on exit: step %d was interrupted midway (its state may be half updated); "
                    "a rerun resumes from the last checkpoint (step %s)",
                    completed_steps + 1,
                    self._last_saved,
                )
        self.checkpointer.close()


def _is_weight(name: str, prefix: str) -> bool:
    """A parameter tensor (or its fp32 master), not optimizer state (hpcrl.ckpt.megatron's naming)."""
    return not name.startswith(f"{prefix}optim.") or name.startswith(f"{prefix}optim.master.")
