"""An entrypoint whose module waits at import for a gate file: a test can signal a rank server that is
still preloading it (the server imports the entrypoint's module before it forks any rank).

`HPCRL_TEST_IMPORT_GATE` names the gate; `<gate>.importing` appears once the import waits. A rank that
runs `main` writes `<run_dir>/ran_<rank>` and then waits to be stopped."""

from __future__ import annotations

import os
import time
from pathlib import Path

_GATE = Path(os.environ["HPCRL_TEST_IMPORT_GATE"])
Path(f"{_GATE}.importing").write_text(str(os.getpid()))
while not _GATE.exists():  # the condition the test sets, polled
    time.sleep(0.05)


def main(cfg, run_dir: Path, lifecycle=None) -> None:
    (Path(run_dir) / f"ran_{os.environ['RANK']}").write_text("")
    while True:  # until a signal ends this rank
        time.sleep(1)
