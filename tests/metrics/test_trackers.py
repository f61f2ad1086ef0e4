"""Experiment trackers (hpcrl.metrics.trackers): W&B offline and MLflow's file store, real, read back
with their own formats. A step reaches a tracker once no resume can redo it, so after a SIGKILL and a
resume each tracker holds every step once, equal to metrics.jsonl; the outbox's rule under any order of
logs, commits and ends (hypothesis); the logging rules at `expand` (exit 2 naming the key)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrl.cli import main
from hpcrl.metrics import wandb_log
from hpcrl.metrics.trackers import TrackerOutbox, scalars
from tests.recovery._runs import latest_step, processes_of, run_dir_of, start_run, steps_logged
from tests.waiting import wait_until

TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "grpo_tiny.yaml"
QUIET = ("--logging.tensorboard", "false", "--logging.plot", "false", "--logging.progress", "false")
STEPS = 8


class _Recording:
    def __init__(self) -> None:
        self.steps: list[int] = []
        self.closed: list[bool] = []

    def log(self, record: dict) -> None:
        self.steps.append(record["step"])

    def catch_up(self, records: list[dict]) -> None:
        self.caught_up = [r["step"] for r in records]

    def close(self, completed: bool) -> None:
        self.closed.append(completed)


events = st.lists(st.one_of(st.just("log"), st.integers(0, 12).map(lambda n: ("commit", n))), max_size=30)


@settings(max_examples=200, deadline=None)
@given(events=events, completed=st.booleans())
def test_the_outbox_sends_each_step_once_in_order_and_only_what_no_resume_redoes(events, completed):
    tracker, opened = _Recording(), []
    outbox = TrackerOutbox(
        lambda: opened.append(1) or [tracker], lambda step: [{"step": s} for s in range(-3, step)]
    )
    logged, committed = 0, 0
    for event in events:
        if event == "log":
            outbox.hold({"step": logged, "x": 1.0})
            logged += 1
        else:
            committed = max(committed, min(event[1], logged))  # a checkpoint holds steps already done
            outbox.settle(committed)
    dropped = outbox.close(completed)
    sent = logged if completed else committed
    assert tracker.steps == list(range(sent))
    assert dropped == logged - sent
    assert len(opened) == (1 if sent else 0)  # opened once, at the first record that goes out
    assert getattr(tracker, "caught_up", None) == (list(range(-3, 0)) if sent else None)  # what came before
    assert tracker.closed == ([completed] if sent else [])


def test_mlflow_catches_up_a_batch_a_sigkill_cut_short_and_logs_each_point_once(tmp_path):
    """The file store writes one file per metric: a SIGKILL inside a batch leaves a step half logged. The
    next attempt's tracker finds the run by hpcrl's run id and logs only the points it lacks."""
    from hpcrl.metrics.config import MlflowConfig
    from hpcrl.metrics.trackers import MlflowTracker, TrackedRun

    run = TrackedRun("fp-1-ab", "c0ffee", "sweep", tmp_path, tmp_path, {"seed": "1"}, {})
    rows = [{"step": s, "a": 1.0 * s, "b": 10.0 * s} for s in range(4)]
    killed = MlflowTracker(MlflowConfig(), run)
    killed.log(rows[0])
    killed.log({"step": 1, "a": 1.0})  # b of step 1 never written
    resumed = MlflowTracker(MlflowConfig(), run)
    assert resumed.run_id == killed.run_id
    resumed.catch_up(rows[:2])
    resumed.log(rows[2])
    resumed.log(rows[3])
    resumed.close(completed=True)
    got, params, tags = _mlflow_history(tmp_path, store=tmp_path / "mlruns")
    assert got == rows and params == {"seed": "1"} and tags["status"] == "FINISHED"


def test_mlflow_resumes_a_run_whose_metric_files_a_sigkill_left_empty_or_torn(tmp_path):
    """The file store appends a line per point (open, then write): a SIGKILL leaves a file empty or its
    last line torn, which MLflow's own reader refuses. The next attempt cuts its own run's files back to
    whole points and logs the rest again; another element's file being written (empty) is not read or
    touched, though MLflow's search would raise on it."""
    from hpcrl.metrics.config import MlflowConfig
    from hpcrl.metrics.trackers import MlflowTracker, TrackedRun

    run = TrackedRun("fp-3-ef", "c0ffee", "sweep", tmp_path, tmp_path, {}, {})
    other = MlflowTracker(MlflowConfig(), TrackedRun("fp-4-01", "d00d", "sweep", tmp_path, tmp_path, {}, {}))
    rows = [{"step": s, "a": 1.0 * s, "r/b": 10.0 * s} for s in range(4)]
    killed = MlflowTracker(MlflowConfig(), run)
    killed.log(rows[0])
    killed.log(rows[1])
    metrics = next((tmp_path / "mlruns").glob(f"*/{killed.run_id}/metrics"))
    torn = (metrics / "a").read_bytes()
    (metrics / "a").write_bytes(torn[: torn.rfind(b" ")])  # step 1's line cut inside its step field
    (metrics / "r" / "b").write_bytes(b"")  # created, never written
    (metrics / "r" / "c").write_bytes(b"")
    busy = next((tmp_path / "mlruns").glob(f"*/{other.run_id}")) / "metrics" / "being_written"
    busy.parent.mkdir(exist_ok=True)
    busy.write_bytes(b"")
    resumed = MlflowTracker(MlflowConfig(), run)
    assert resumed.run_id == killed.run_id and resumed.last_steps == {"a": 0}
    resumed.catch_up(rows[:2])
    resumed.log(rows[2])
    resumed.log(rows[3])
    resumed.close(completed=True)
    assert busy.read_bytes() == b""  # another element's file, left as it is
    busy.unlink()
    got, _, tags = _mlflow_history(tmp_path, store=tmp_path / "mlruns", run_id=killed.run_id)
    assert got == rows and tags["status"] == "FINISHED"


def test_wandb_sends_again_only_the_steps_it_had_not_written(tmp_path):
    """A resumed attempt reads the run's W&B transaction logs (hpcrl.metrics.wandb_log) and sends the
    steps after the last one written: each step once, in order, across two offline runs of one id."""
    from hpcrl.metrics.config import WandbConfig
    from hpcrl.metrics.trackers import TrackedRun, WandbTracker

    run = TrackedRun("fp-2-cd", "c0ffee", "sweep", tmp_path, tmp_path, {}, {"seed": 1})
    rows = [{"step": s, "a": 1.0 * s} for s in range(5)]
    first = WandbTracker(WandbConfig(), run)
    for row in rows[:3]:
        first.log(row)
    first.close(completed=False)
    second = WandbTracker(WandbConfig(), run)
    second.catch_up(rows[:4])  # step 3 was never written
    second.log(rows[4])
    second.close(completed=True)
    rerun = WandbTracker(WandbConfig(), run)  # a rerun of the completed run logs its last record again
    rerun.log(rows[4])
    rerun.close(completed=True)
    assert wandb_log.history(tmp_path) == rows and wandb_log.run_ids(tmp_path) == {"fp-2-cd"}
    assert len(wandb_log.run_logs(tmp_path, "fp-2-cd")) == 3


@settings(max_examples=100, deadline=None)
@given(tail=st.binary(max_size=200), header=st.booleans())
def test_a_transaction_log_of_any_bytes_reads_without_error(tmp_path_factory, tail, header):
    """A torn, foreign or garbage `.wandb` file: no exception, and no history row it did not hold."""
    root = tmp_path_factory.mktemp("w")
    path = root / "wandb" / "offline-run-x-id" / "run-id.wandb"
    path.parent.mkdir(parents=True)
    path.write_bytes((b":W&B\xe1\xbe\x00" if header else b"") + tail)
    assert all(isinstance(r, bytes) for r in wandb_log.records(path))
    if not header:
        assert wandb_log.records(path) == []
    assert all(isinstance(row["step"], int) for row in wandb_log.history(root, "id"))


def test_a_tracker_gets_finite_numbers_only():
    record = {"step": 3, "a": 1, "b": 0.5, "flag": True, "nan": float("nan"), "none": None, "text": "x"}
    assert scalars(record) == {"a": 1.0, "b": 0.5}


def _mlflow_history(
    run_root: Path, store: Path | None = None, run_id: str | None = None
) -> tuple[list[dict], dict[str, str], dict[str, str]]:
    """(rows by step, params, tags) of the one MLflow run (or run `run_id`) in the sweep's file store."""
    from mlflow.tracking import MlflowClient

    from hpcrl.metrics.trackers import _file_store_allowed

    if store is None:
        [store] = run_root.glob("*/mlruns")
    with _file_store_allowed():
        client = MlflowClient(tracking_uri=store.resolve().as_uri())
        [experiment] = [e for e in client.search_experiments() if e.name != "Default"]
        if run_id is None:
            [run] = client.search_runs([experiment.experiment_id])
        else:
            run = client.get_run(run_id)
        rows: dict[int, dict] = {}
        metrics_dir = store / experiment.experiment_id / run.info.run_id / "metrics"
        for key in (f.relative_to(metrics_dir).as_posix() for f in metrics_dir.rglob("*") if f.is_file()):
            for point in client.get_metric_history(run.info.run_id, key):
                assert key not in rows.setdefault(point.step, {"step": point.step}), (key, point.step)  # once
                rows[point.step][key] = point.value
    return [rows[s] for s in sorted(rows)], run.data.params, run.data.tags | {"status": run.info.status}


def _mlflow_whole_steps(run_root: Path) -> list[int]:
    """The steps of which the one MLflow run holds every point written whole, read from the file store's
    files as they are (a line "<timestamp> <value> <step>" per point)."""
    [metrics_dir] = run_root.glob("*/mlruns/*/*/metrics")
    steps_per_key = [
        {int(line.split()[2]) for line in f.read_text().splitlines(keepends=True) if line.endswith("\n")}
        for f in metrics_dir.rglob("*")
        if f.is_file()
    ]
    return sorted(set.union(*steps_per_key)) if steps_per_key else []


def _jsonl_rows(run_dir: Path) -> list[dict]:
    from hpcrl.metrics.sinks import read_jsonl

    return [{"step": r["step"], **scalars(r)} for r in read_jsonl(run_dir / "metrics.jsonl")]


@pytest.mark.slow
def test_wandb_and_mlflow_hold_every_step_once_equal_to_metrics_jsonl_after_a_sigkill_and_resume(
    tmp_path, monkeypatch
):
    """The main job with both trackers, a checkpoint every 2 steps: SIGKILLed once steps after a commit
    were logged (sent to no tracker), rerun to the end. W&B's offline runs (one per attempt, one run id)
    and the MLflow run hold every step once, each value equal to metrics.jsonl's, the final evaluation
    included: wandb's service, killed with the rank, had not written the last steps handed to it (steps
    0-1 lost, 3 tries of 3, before the catch-up) and MLflow's file store may be cut inside a batch."""
    monkeypatch.setenv("HPCRL_STEP_SLEEP_S", "0.3")  # time to catch it between a commit and the next
    root = tmp_path / "runs"
    args = ("--algorithm.steps", str(STEPS), "--checkpoint.every_steps", "2", "--algorithm.eval_every", "4")
    args += ("--logging.trackers", "[wandb, mlflow]", "--logging.wandb.project", "hpcrl-test", *QUIET)
    victim = start_run(TEMPLATE, root, *args, log=tmp_path / "run.log")

    def after_a_commit() -> bool:
        if victim.poll() is not None or not any(root.glob("*/*/metrics.jsonl")):
            return victim.poll() is not None
        run_dir = run_dir_of(root)  # steps went out (MLflow writes them at once), one after the last commit
        sent = any(root.glob("*/mlruns/*/*/metrics/reward/mean"))
        return sent and steps_logged(run_dir) > (latest_step(run_dir / "checkpoints") or 0)

    wait_until(after_a_commit, 300, "steps sent and one logged after the last commit", poll_s=0.01)
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(timeout=120) == -signal.SIGKILL, (tmp_path / "run.log").read_text()[-3000:]
    wait_until(lambda: not processes_of(root), 120, "the killed run's processes to die")
    run_dir = run_dir_of(root)
    killed_at, resumed_at = steps_logged(run_dir), latest_step(run_dir / "checkpoints")
    assert resumed_at is not None and resumed_at < killed_at < STEPS, (resumed_at, killed_at)
    sent_before = _mlflow_whole_steps(root)  # read as written: a file may be cut (MLflow's reader raises)
    assert sent_before and sent_before == list(range(len(sent_before))), sent_before
    assert len(sent_before) <= resumed_at, (sent_before, resumed_at, killed_at)  # none that is redone

    resumed = start_run(TEMPLATE, root, *args, log=tmp_path / "run.log")
    assert resumed.wait(timeout=300) == 0, (tmp_path / "run.log").read_text()[-3000:]
    expected = _jsonl_rows(run_dir)
    assert [r["step"] for r in expected] == list(range(STEPS + 1))  # + the final evaluation
    assert wandb_log.history(run_dir) == expected  # the steps a SIGKILL took from W&B sent again
    assert len(list(run_dir.glob("wandb/offline-run-*"))) == 2  # one per attempt ...
    run_id = __import__("json").loads((run_dir / "run.json").read_text())["run_id"]
    assert wandb_log.run_ids(run_dir) == {run_id}  # ... continuing one W&B run
    rows, params, tags = _mlflow_history(root)
    assert rows == expected
    assert tags["hpcrl.run_id"] == run_id and tags["status"] == "FINISHED"
    assert params["algorithm.steps"] == str(STEPS) and params["logging.trackers"] == "['wandb', 'mlflow']"
    assert not processes_of(root)  # nothing of W&B's outlives the run


@pytest.mark.parametrize(
    ("args", "key"),
    [
        (["--logging.trackers", "[wandb, wandb]"], "logging.trackers"),
        (["--logging.trackers", "[tensorboard]"], "logging.trackers"),
        (["--logging.wandb.project", "p"], "logging.wandb.project"),  # set, but no wandb tracker
        (["--logging.mlflow.tracking_uri", "http://h"], "logging.mlflow.tracking_uri"),
        *(
            (["--logging.trackers", "[wandb]", "--logging.wandb.project", bad], "logging.wandb.project")
            for bad in ("a/b", "x?y", "\x1b[2J", "p" * 129, "", "a\nb")
        ),
        *(
            (
                ["--logging.trackers", "[mlflow]", "--logging.mlflow.tracking_uri", bad],
                "logging.mlflow.tracking_uri",
            )
            for bad in (
                "ftp://h/x",
                "file:relative",
                "file://otherhost/x",
                "http://",
                "/abs\x00",
                "mlruns",
                "file:/a\x1b",
            )
        ),
    ],
)
def test_a_tracker_setting_that_cannot_work_is_exit_2_at_expand_naming_the_key(capsys, args, key):
    code = main(["expand", str(TEMPLATE), *args])
    err = capsys.readouterr().err
    assert code == 2 and key in err and "Traceback" not in err and "\x1b" not in err, err


def test_a_tracker_that_is_not_installed_is_named_at_expand(capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a)
    )
    code = main(["expand", str(TEMPLATE), "--logging.trackers", "[mlflow]"])
    err = capsys.readouterr().err
    assert code == 2 and "logging.trackers: mlflow is not installed: pip install 'hpcrl[trackers]'" in err, (
        err
    )
