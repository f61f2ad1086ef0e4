"""Make the README's sweep page screenshot and compare report from a real 24-element local sweep.

    python launch/demo_sweep_page.py [--sweep_dir /tmp/grpo24] [--out docs/images]

Runs `hpcrl submit templates/sweeps/grpo-24.yaml` (local executor, two at a time), waits on `hpcrl status
--json` until every element ended, then `hpcrl compare --by algorithm.name --out OUT/compare-24`, then
`hpcrl serve --port 0`, whose page headless chromium (launch/install_browser.sh) loads and photographs to
OUT/sweep-page.png; the server is stopped by its PID. Prints each command's wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = REPO / "templates" / "sweeps" / "grpo-24.yaml"
STATE_23 = "const e = document.getElementById('state-23'); return e && e.textContent"
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "LOST", "TIMEOUT", "OUT_OF_MEMORY"}


def hpcrl(*args: str) -> str:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "hpcrl", *args], cwd=REPO, capture_output=True, text=True)
    print(
        f"hpcrl {' '.join(args)}: exit {proc.returncode}, {time.perf_counter() - started:.1f} s", flush=True
    )
    if proc.returncode not in (0, 1):
        raise SystemExit(proc.stdout + proc.stderr)
    return proc.stdout


def wait_for_the_end(sweep: Path) -> dict:
    started = time.perf_counter()
    while True:
        status = json.loads(hpcrl("status", str(sweep), "--json"))
        if all(e["state"] in FINAL for e in status["elements"]):
            print(f"sweep ended after {time.perf_counter() - started:.0f} s: {status['counts']}", flush=True)
            return status
        time.sleep(10)


def screenshot(sweep: Path, path: Path) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    server = subprocess.Popen(
        [sys.executable, "-m", "hpcrl", "serve", str(sweep), "--port", "0"],
        cwd=REPO, stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        line = server.stdout.readline()
        url = line.split(" at ", 1)[1].split(" ", 1)[0]
        options = webdriver.ChromeOptions()
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1500"):
            options.add_argument(arg)
        driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
        try:
            started = time.perf_counter()
            driver.get(url)
            drawn = "const g = document.querySelector('#curves .js-plotly-plot'); return g && g.data && g.data.length"
            while driver.execute_script(drawn) != 24 or driver.execute_script(STATE_23) is None:
                time.sleep(0.1)
            print(f"page with 24 elements shown {time.perf_counter() - started:.2f} s after the request")
            driver.save_screenshot(str(path))
        finally:
            driver.quit()
    finally:
        os.kill(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
    print(f"screenshot {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep_dir", default="/tmp/grpo24")
    parser.add_argument("--out", default=str(REPO / "docs" / "images"))
    args = parser.parse_args()
    sweep, out = Path(args.sweep_dir), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not (sweep / "manifest.json").exists():
        hpcrl(
            "submit",
            str(TEMPLATE),
            "--sweep_dir",
            str(sweep),
            "--run_root",
            str(sweep.parent / "grpo24-runs"),
        )
    wait_for_the_end(sweep)
    hpcrl("status", str(sweep))
    print(hpcrl("compare", str(sweep), "--by", "algorithm.name", "--out", str(out / "compare-24")), end="")
    screenshot(sweep, out / "sweep-page.png")


if __name__ == "__main__":
    main()
