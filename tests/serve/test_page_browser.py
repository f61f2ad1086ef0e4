"""`hpcrl serve` in a real headless browser (tests/serve/browser.py): a real local sweep of the main job,
two elements one after the other, the server started and stopped by PID as a user runs it. The page
loads; the running element's step advances; the table then shows both COMPLETED; each curve has as
many points as its metrics.jsonl logged; the log pane shows the chosen element's log; hostile text from
the sweep is shown as text, never run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hpcrl.launcher.sweep_manifest import load_manifest
from tests.cli_runs import run_cli
from tests.serve.browser import headless_chromium
from tests.templates import write_grpo_template
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
CURVE_POINTS = "return Array.from(document.querySelector('#curves .js-plotly-plot').data, t => t.x.length)"


class Served:
    """`hpcrl serve SWEEP --port 0` as a child process in a session of its own; its URL from its output."""

    def __init__(self, sweep: Path, log: Path):
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "hpcrl", "serve", str(sweep), "--port", "0", "--refresh_s", "0.5"],
                cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        line = wait_until(self._url_line, 60, "the server's URL")
        self.url = line.split(" at ", 1)[1].split(" ", 1)[0]

    def _url_line(self) -> str | None:
        assert self.proc.poll() is None, self.log.read_text()
        return next((ln for ln in self.log.read_text().splitlines() if "hpcrl: serving" in ln), None)

    def stop(self) -> int:
        os.kill(self.proc.pid, signal.SIGTERM)
        return self.proc.wait(timeout=60)


def _text(driver, element_id: str) -> str | None:
    """The element's text now, read in one script (the page replaces its rows at every refresh: a found
    element may be gone by the next call)."""
    return driver.execute_script(
        "const e = document.getElementById(arguments[0]); return e && e.textContent", element_id
    )


@pytest.mark.slow
@pytest.mark.dist
def test_the_page_of_a_running_then_finished_sweep_in_a_real_browser(tmp_path, capsys):
    extra = (
        "cluster: {array_parallelism: 1, env: {HPCRL_STEP_SLEEP_S: '0.5'}}\nsweep: {grid: {seed: [0, 1]}}\n"
    )
    template = write_grpo_template(tmp_path, "served", steps=6, eval_every=2, extra=extra)
    sweep = tmp_path / "sweep"
    assert run_cli(capsys, "submit", template, "--sweep_dir", sweep)[0] == 0
    served = Served(sweep, tmp_path / "serve.log")
    try:
        with headless_chromium() as driver:
            driver.get(served.url)
            assert driver.title == "hpcrl: served"
            steps_seen: dict[int, set[str]] = {0: set(), 1: set()}

            def step_advanced() -> bool:  # one element runs at a time (array_parallelism 1)
                for index, seen in steps_seen.items():
                    state, step = _text(driver, f"state-{index}"), _text(driver, f"step-{index}")
                    if state == "RUNNING" and step not in (None, "-"):
                        seen.add(step)
                return any(len(seen) >= 2 for seen in steps_seen.values())

            wait_until(step_advanced, 240, "a running element's step to advance on the page", poll_s=0.1)
            finished = lambda: [_text(driver, f"state-{i}") for i in (0, 1)] == ["COMPLETED"] * 2  # noqa: E731
            wait_until(finished, 300, "both elements COMPLETED on the page")
            expected = []
            for entry in load_manifest(sweep).entries:
                rows = [
                    json.loads(line) for line in Path(entry.run_dir, "metrics.jsonl").read_text().splitlines()
                ]
                expected.append(sum("reward/heldout" in r for r in rows))
            assert expected == [4, 4]  # steps 0, 2, 4 and the final evaluation
            wait_until(
                lambda: driver.execute_script(CURVE_POINTS) == expected, 30, "every point on the curves"
            )
            assert _text(driver, "step-1") == "6" and _text(driver, "last-1") not in (None, "-")
            wait_until(lambda: "run dir" in (_text(driver, "log") or ""), 30, "element 0's log tail")
            driver.save_screenshot(str(tmp_path / "page.png"))
    finally:
        assert served.stop() == 0, served.log.read_text()[-3000:]


@pytest.mark.heavy
def test_hostile_text_from_the_sweep_is_shown_as_text(tmp_path, capsys):
    """A hand-edited manifest's reason and an element log with markup and terminal escapes: the page shows
    them as text (React escapes text nodes); nothing of them runs."""
    template = write_grpo_template(
        tmp_path, "hostile", steps=2, eval_every=0, extra="sweep: {grid: {seed: [0, 1]}}\n"
    )
    sweep = tmp_path / "sweep"
    assert run_cli(capsys, "submit", template, "--dry-run", "--sweep_dir", sweep)[0] == 0
    manifest = json.loads((sweep / "manifest.json").read_text())
    script = '<img src=x onerror="window.pwned=1"><script>window.pwned=2</script>'
    manifest["entries"][1]["reason"] = script
    (sweep / "manifest.json").write_text(json.dumps(manifest))
    served = Served(sweep, tmp_path / "serve.log")
    try:
        with headless_chromium() as driver:
            driver.get(served.url)
            wait_until(lambda: _text(driver, "reason-1") == script, 60, "the reason as text")
            assert driver.execute_script("return window.pwned === undefined")
            assert _text(driver, "log") == "(element 0 was never submitted (state DRY_RUN))"
    finally:
        assert served.stop() == 0, served.log.read_text()[-3000:]
