"""Checkpoint and resume of the RL job through hpcrl.ckpt (sharded HDF5, any layout on load).

Saved: actor (+ critic) parameters and AdamW state as shards ("actor." / "critic." prefixes), the data
cursor, the step, RNG states. Not saved: the reference model (it is rebuilt from the same init or HF
directory) and the rollout engine (it receives the actor's weights at the start of every step).
When to save is `hpcrl.ckpt.trigger.SaveTrigger`: every `checkpoint.every_steps`, on SIGUSR1 (Slurm's
warning signal) and before the time limit; a requested or deadline save also stops the run so that the
launcher can requeue it. `RunState.step` counts completed steps, so a resumed run starts at that step.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path

import torch.distributed as dist

from hpcrl.ckpt.checkpointer import Checkpointer
from hpcrl.ckpt.commit import read_latest
from hpcrl.ckpt.manifest import read_manifest
from hpcrl.ckpt.megatron import load_into_trainer, model_extra, trainer_shards, trainer_specs
from hpcrl.ckpt.state import RunState, restore_rng
from hpcrl.ckpt.trigger import SaveTrigger, restart_count
from hpcrl.config.experiment import ExperimentConfig
from hpcrl.data.cursor import DataCursor, PromptSampler
from hpcrl.rl.driver import RLDriver

log = logging.getLogger(__name__)


class RLCheckpointing:
    def __init__(self, cfg: ExperimentConfig, run_dir: Path, driver: RLDriver):
        self.cfg, self.driver = cfg, driver
        self.group = dist.group.WORLD if dist.is_initialized() and dist.get_world_size() > 1 else None
        self.checkpointer = Checkpointer.from_config(cfg.checkpoint, run_dir, self.group)
        self.trigger = SaveTrigger.from_slurm(cfg.checkpoint.every_steps)
        if threading.current_thread() is threading.main_thread():
            self.trigger.install_signal_handler(signal.SIGUSR1)
        self._step_started = time.perf_counter()
        self._last_saved: int | None = None

    def _trainers(self) -> dict[str, object]:
        workers = self.driver.workers
        out = {"actor.": workers.actor.trainer}
        if workers.critic is not None:
            out["critic."] = workers.critic.trainer
        return out

    def resume(self) -> int:
        """Load the newest verified checkpoint when resume=auto and one exists; return the start step."""
        latest = read_latest(self.checkpointer.root)
        if self.cfg.checkpoint.resume != "auto" or latest is None:
            return 0
        manifest = read_manifest(latest)
        specs = [s for prefix, t in self._trainers().items() for s in trainer_specs(t, manifest, prefix)]
        loaded = self.checkpointer.load(specs, fallback=True)
        for prefix, trainer in self._trainers().items():
            load_into_trainer(trainer, loaded.tensors, prefix)
        if loaded.rng is not None:
            restore_rng(loaded.rng)
        self.driver.sampler = PromptSampler(
            self.driver.sampler.rows, DataCursor.from_dict(loaded.state.data_cursor)
        )
        log.warning("resumed from %s at step %d", loaded.path, loaded.state.step)
        self._last_saved = loaded.state.step
        return loaded.state.step

    def save(self, completed_steps: int) -> None:
        start = time.perf_counter()
        shards, extra = [], {"models": {}}
        for prefix, trainer in self._trainers().items():
            shards += trainer_shards(trainer, prefix)
            extra["models"].update(model_extra(trainer, prefix)["models"])
        state = RunState(
            step=completed_steps,
            data_cursor=self.driver.sampler.cursor.to_dict(),
            restart_count=restart_count(),
        )
        p = self.cfg.parallel
        self.checkpointer.save(
            completed_steps, shards, state, layout={"t": p.tensor, "p": p.pipeline, "d": p.data}, extra=extra
        )
        self.trigger.record_save(time.perf_counter() - start)
        self._last_saved = completed_steps

    def after_step(self, step: int) -> bool:
        """Save when the trigger says so; True = stop now (signal or time limit)."""
        self.trigger.record_step(time.perf_counter() - self._step_started)
        decision = self.trigger.decide(step + 1, self.group)
        if decision.save:
            self.save(step + 1)
        self._step_started = time.perf_counter()
        return decision.stop

    def close(self, completed_steps: int) -> None:
        if self.cfg.checkpoint.save_on_exit and completed_steps > 0 and self._last_saved != completed_steps:
            self.save(completed_steps)
        self.checkpointer.close()
