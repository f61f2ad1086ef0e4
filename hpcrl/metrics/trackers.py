"""Experiment trackers (W&B, MLflow): each element's metrics in the tracker its team already watches.

A tracker cannot take a step back: W&B drops a step below its last one, MLflow keeps every point. A
resumed run redoes the steps after its last committed checkpoint (metrics.jsonl is cut back to it,
TensorBoard purges them), so a tracker gets a step only once no resume can redo it: when a checkpoint
at or after it is committed, or when the run completed (`TrackerOutbox`). A tracker therefore lags the
run by up to `checkpoint.every_steps` steps, and after a SIGKILL and resume it holds every step once,
equal to metrics.jsonl.

The tracker run's id is hpcrl's run id (run.json, kept across attempts), so every attempt of an element
continues one W&B run (`resume="allow"`) or finds its MLflow run by the tag `hpcrl.run_id`.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from hpcrl.metrics import wandb_log
from hpcrl.metrics.config import LoggingConfig, MlflowConfig, WandbConfig


@dataclass(frozen=True)
class TrackedRun:
    """What a tracker names and records of one element."""

    run_id: str
    """hpcrl's run id (run.json): the W&B run id and the MLflow tag `hpcrl.run_id`."""
    name: str
    """The run directory's name (the config id): the tracker run's display name."""
    group: str
    """The sweep's name (`name`): the W&B group, the MLflow experiment."""
    run_dir: Path
    """W&B's offline runs go under <run_dir>/wandb."""
    store_root: Path
    """<run_root>/<name>: the default MLflow file store goes under it, shared by the sweep's elements."""
    params: dict[str, str]
    """The element's user-set keys, flattened to dotted names (MLflow params)."""
    config: dict[str, Any]
    """The resolved config (W&B config)."""


class Tracker(Protocol):
    def log(self, record: dict[str, Any]) -> None: ...

    def catch_up(self, records: list[dict[str, Any]]) -> None:
        """Records an earlier attempt sent, or was killed while sending: log what the tracker lacks."""

    def close(self, completed: bool) -> None: ...


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The record's finite numbers but `step` (a tracker takes no None, text or NaN)."""
    return {
        key: float(value)
        for key, value in record.items()
        if key != "step"
        and isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
    }


class WandbTracker:
    """One W&B run per element: id = hpcrl's run id, group = the sweep, offline by default."""

    def __init__(self, cfg: WandbConfig, run: TrackedRun):
        import wandb

        self._wandb = wandb
        self.root, self.id = run.run_dir, wandb_id(run.run_id)
        self.run = wandb.init(
            project=cfg.project,
            mode=cfg.mode,
            dir=str(run.run_dir),
            id=self.id,
            name=run.name,
            group=run.group,
            config=run.config,
            resume="allow",
            settings=wandb.Settings(silent=True, console="off", save_code=False, x_disable_stats=True),
        )
        self.last_step = wandb_log.last_step(self.root, self.id)
        """The last step this W&B run holds (its transaction logs under the run dir, then what this attempt
        sent): a step is sent once (a rerun of a completed run logs its final evaluation again)."""

    def log(self, record: dict[str, Any]) -> None:
        step = int(record["step"])
        if step > self.last_step:
            self.run.log(scalars(record), step=step)
            self.last_step = step

    def catch_up(self, records: list[dict[str, Any]]) -> None:
        """Send again the steps after the last one W&B wrote here (hpcrl.metrics.wandb_log): wandb's
        service writes in order, so what a SIGKILL took is the tail."""
        for record in records:
            self.log(record)

    def close(self, completed: bool) -> None:
        self.run.finish(exit_code=0 if completed else 1)
        self._wandb.teardown()  # stops wandb's service process: nothing outlives the rank


def wandb_id(run_id: str) -> str:
    """W&B run ids: at most 64 characters, none of / \\ # ? % :."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", run_id)[:64]


class MlflowTracker:
    """One MLflow experiment per sweep, one MLflow run per element (tag `hpcrl.run_id`, params = the
    element's user-set keys); a file store under the sweep's run root unless `tracking_uri` says."""

    def __init__(self, cfg: MlflowConfig, run: TrackedRun):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.uri = cfg.tracking_uri or (run.store_root / "mlruns").resolve().as_uri()
        with _file_store_allowed():
            self.client = MlflowClient(tracking_uri=self.uri)
            experiment_id = self._experiment(run.group)
            found = self._earlier_run(experiment_id, run.run_id)
            self.last_steps: dict[str, int] = {}
            """Per metric key, the last step the MLflow run holds: a point is logged once, per key."""
            if found is not None:
                self.run_id = found
                self.client.update_run(self.run_id, status="RUNNING")
                for key in self.client.get_run(self.run_id).data.metrics:
                    history = self.client.get_metric_history(self.run_id, key)
                    self.last_steps[key] = max((m.step for m in history), default=-1)
            else:
                created = self.client.create_run(
                    experiment_id, run_name=run.name, tags={"hpcrl.run_id": run.run_id}
                )
                self.run_id = created.info.run_id
                params = [Param(mlflow_key(k), v[:6000]) for k, v in sorted(run.params.items())]
                for start in range(0, len(params), 100):  # MLflow takes 100 params a batch
                    self.client.log_batch(self.run_id, params=params[start : start + 100])

    def _earlier_run(self, experiment_id: str, hpcrl_run_id: str) -> str | None:
        """The MLflow run an earlier attempt of this element created, if any.

        In a file store the run is found by its tag file, and only its own metric files are read, after
        `repair_metric_files`: MLflow's search reads every run of the experiment, and a file another
        element is appending to at that moment, or one a SIGKILL cut, makes it raise."""
        store = file_store_path(self.uri)
        if store is None:
            found = self.client.search_runs(
                [experiment_id], filter_string=f"tags.`hpcrl.run_id` = '{hpcrl_run_id}'", max_results=1
            )
            return found[0].info.run_id if found else None
        for tag in sorted((store / experiment_id).glob("*/tags/hpcrl.run_id")):
            if tag.read_text(errors="replace") == hpcrl_run_id:
                repair_metric_files(tag.parent.parent / "metrics")
                return tag.parent.parent.name
        return None

    def _experiment(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(name)
        except Exception:  # another element of the sweep created it first
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def log(self, record: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        now_ms, step = int(time.time() * 1000), int(record["step"])
        metrics = [
            Metric(key, v, now_ms, step)
            for k, v in scalars(record).items()
            if self.last_steps.get(key := mlflow_key(k), -1) < step
        ]
        self.last_steps |= {m.key: step for m in metrics}
        with _file_store_allowed():
            for start in range(0, len(metrics), 1000):
                self.client.log_batch(self.run_id, metrics=metrics[start : start + 1000])

    def catch_up(self, records: list[dict[str, Any]]) -> None:
        """Log each point the run lacks (an earlier attempt's, killed between two files of a batch: the
        file store writes one file per metric)."""
        for record in records:
            self.log(record)

    def close(self, completed: bool) -> None:
        with _file_store_allowed():
            self.client.set_terminated(self.run_id, status="FINISHED" if completed else "KILLED")


def file_store_path(uri: str) -> Path | None:
    """The directory of a `file:` tracking URI (MLflow's file store), None for a server."""
    parsed = urllib.parse.urlparse(uri)
    return Path(urllib.parse.unquote(parsed.path)) if parsed.scheme == "file" else None


def repair_metric_files(metrics_dir: Path) -> None:
    """Cut each metric file of one MLflow run back to its last whole point.

    The file store appends one line "<timestamp> <value> <step>" per point (open, then write): a SIGKILL
    can leave a file empty or its last line torn, which MLflow's reader refuses ("malformed") or misreads
    (a torn line of two fields reads as step 0). Only the element's own run is repaired, when a new
    attempt opens it: no other process writes that run then. The lost points are logged again by
    `catch_up`."""
    for path in sorted(p for p in metrics_dir.rglob("*") if p.is_file()):
        data = path.read_bytes()
        whole = data[: data.rfind(b"\n") + 1]
        if not whole:
            path.unlink()
        elif whole != data:
            os.truncate(path, len(whole))


def mlflow_key(name: str) -> str:
    """MLflow keys: letters, digits, _ - . / and spaces."""
    return re.sub(r"[^A-Za-z0-9_\-./ ]", "_", name)[:250]


@contextlib.contextmanager
def _file_store_allowed() -> Iterator[None]:
    """MLflow 3 refuses its file store unless told (it suggests a database; a file per run suits a
    shared file system with many writers better): allowed while hpcrl's own calls run, then restored."""
    before = os.environ.get("MLFLOW_ALLOW_FILE_STORE")
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("MLFLOW_ALLOW_FILE_STORE", None)
        else:
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = before


TRACKERS: dict[str, Callable[[LoggingConfig, TrackedRun], Tracker]] = {
    "wandb": lambda cfg, run: WandbTracker(cfg.wandb, run),
    "mlflow": lambda cfg, run: MlflowTracker(cfg.mlflow, run),
}


class TrackerOutbox:
    """Holds each step's record until no resume can redo it, then hands it to the trackers, in order.

    `settle(n)`: a checkpoint of n completed steps is committed: records of steps < n go out.
    `close(completed)`: the run completed (every step and its final evaluation are kept): all go out;
    otherwise the held ones are dropped (the next attempt redoes and sends them). Trackers open at the
    first record that goes out (`open_trackers`), so a run that sends nothing starts none; they then catch
    up on the records before it (`earlier(step)`: the run's metrics.jsonl, cut back to the resume step),
    which an earlier attempt sent, or was SIGKILLed while sending."""

    def __init__(
        self,
        open_trackers: Callable[[], Sequence[Tracker]],
        earlier: Callable[[int], list[dict[str, Any]]] = lambda step: [],
    ):
        self._open = open_trackers
        self._earlier = earlier
        self._trackers: Sequence[Tracker] | None = None
        self._held: list[dict[str, Any]] = []

    def hold(self, record: dict[str, Any]) -> None:
        self._held.append(dict(record))

    def settle(self, completed_steps: int) -> None:
        ready = [r for r in self._held if int(r["step"]) < completed_steps]
        self._held = [r for r in self._held if int(r["step"]) >= completed_steps]
        self._send(ready)

    def close(self, completed: bool) -> int:
        """Send or drop what is held, close the trackers; returns how many records were dropped."""
        held, self._held = self._held, []
        if completed:
            self._send(held)
        if self._trackers is not None:
            for tracker in self._trackers:
                tracker.close(completed)
        return 0 if completed else len(held)

    def _send(self, records: list[dict[str, Any]]) -> None:
        if not records:
            return
        if self._trackers is None:
            self._trackers = self._open()
            before = self._earlier(int(records[0]["step"]))  # what earlier attempts logged (metrics.jsonl)
            for tracker in self._trackers:
                tracker.catch_up(before)
        for record in records:
            for tracker in self._trackers:
                tracker.log(record)
