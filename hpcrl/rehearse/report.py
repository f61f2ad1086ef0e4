"""What a rehearsal must show, read off its metrics.jsonl (rank 0's figures) and its resume log.

Checks (each failure one line naming the step and the metric):
- every step 0..K-1 logged exactly once across the two launches (the save, then the resume; metrics.jsonl
  numbers steps from 0, and a final held-out evaluation may add a row of its own);
- the second launch resumed at step K-1 (its log says so);
- every step's weight sync was verified against what the optimizer wrote (`reshard/verified_params`);
- the weights the rollout received changed after every update that had a gradient
  (`reshard/read_checksum` differs from the sync before whenever the step before had
  `actor/grad_norm` > 0 and was not skipped: an update that never reaches the rollout, the failure this
  whole check is for, leaves it constant; a group-relative step whose groups all scored alike has a
  zero gradient and rightly moves nothing), and at least one update had one;
- the reshard's bytes received equal the planned bound (`reshard/bytes_received`), when one is given;
- loss, grad norm and the rollout-vs-trainer log-prob mismatch are finite.

Pure: rows in, a `Report` out; hpcrl.rehearse.workdir reads the rows, hpcrl.cli.rehearse prints it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

PHASES = ("time/generate_s", "time/train_s", "time/reshard_s")
"""Per-step phase times shown (seconds)."""


@dataclass
class Report:
    rows: list[dict]
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def lines(self) -> list[str]:
        """One line per step: phases, bytes received, log-prob mismatch, whether the weights moved."""
        out = []
        previous = None
        for row in self.rows:
            phases = "  ".join(
                f"{k.removeprefix('time/').removesuffix('_s')} {row.get(k, 0.0):.2f}s" for k in PHASES
            )
            moved = "-"
            if previous is not None:
                same = row.get("reshard/read_checksum") == previous.get("reshard/read_checksum")
                moved = "yes" if not same else ("NO" if _updated(previous) else "no (no gradient)")
            previous = row
            out.append(
                f"step {row['step']}: {phases}  reshard {int(row.get('reshard/bytes_received', 0)):,} B"
                f"  mismatch {row.get('mismatch/logprob_max', float('nan')):.2e}  weights moved {moved}"
            )
        return out


def _updated(row: dict) -> bool:
    """The step's update changed the weights it trains (a nonzero gradient, not skipped)."""
    return row.get("actor/grad_norm", 0.0) > 0 and not row.get("actor/update_skipped_nonfinite")


def syncs_verified_and_moving(step_rows: list[dict]) -> bool:
    """Every weight sync was verified against what the optimizer wrote, and what the rollout received
    changed at every step (the checks below; benchmarks/gpu_check.py and vllm_rl.py read runs with it)."""
    verified = all(r.get("reshard/verified_params") for r in step_rows)
    moving = all(
        not _updated(before) or before.get("reshard/read_checksum") != after.get("reshard/read_checksum")
        for before, after in zip(step_rows, step_rows[1:], strict=False)
    )
    return bool(step_rows) and verified and moving


def check(rows: list[dict], steps: int, resume_log: str, bound_bytes: int | None) -> Report:
    """The rehearsal's verdict from its metrics rows (rank 0) and the resumed launch's output."""
    step_rows = [r for r in rows if "time/step_s" in r]  # not the final evaluation's row
    report = Report(sorted(step_rows, key=lambda r: r["step"]))
    fail = report.failures.append
    seen = sorted(int(r["step"]) for r in step_rows)
    if seen != list(range(steps)):
        fail(f"metrics.jsonl: steps {seen}, want each of 0..{steps - 1} once (save + resume)")
    if f"at step {steps - 1}" not in resume_log or "resumed from" not in resume_log:
        fail(f"the second launch did not resume from the step-{steps - 1} checkpoint")
    previous = None
    for row in report.rows:
        step = row["step"]
        if not row.get("reshard/verified_params"):
            fail(f"step {step}: reshard/verified_params missing: the weight sync was not verified")
        checksum = row.get("reshard/read_checksum")
        if previous is not None and _updated(previous) and checksum == previous["reshard/read_checksum"]:
            fail(
                f"step {step}: reshard/read_checksum unchanged: step {step - 1}'s update did not reach the rollout"
            )
        previous = row
        if bound_bytes is not None and row.get("reshard/bytes_received") != bound_bytes:
            fail(
                f"step {step}: reshard/bytes_received {row.get('reshard/bytes_received')} != bound {bound_bytes}"
            )
        for key in ("actor/loss", "actor/grad_norm", "mismatch/logprob_max"):
            value = row.get(key)
            if value is not None and not math.isfinite(value):
                fail(f"step {step}: {key} = {value}")
    if report.rows and not any(_updated(r) for r in report.rows[:-1]):
        fail(
            "no update before the last step had a gradient: the rehearsal could not see one reach the rollout"
        )
    return report
