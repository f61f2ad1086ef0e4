"""Hostile output paths for the fuzz tests of every option that names a directory hpcrl writes
(--sweep_dir, --run_root, ckpt export --hf): symlinks, someone else's non-empty folders, files, /proc,
'..', control characters. `Sandbox` lays out the traps and checks that a command left them alone.

    sandbox = Sandbox.make(tmp_dir)
    path = data.draw(hostile_paths(sandbox))
    code, err = <run the command with path>
    sandbox.check(path, code, err, "--sweep_dir")
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from hypothesis import strategies as st

PARTS = ["link", "foreign", "plain", "empty", "victim", "new", "..", ".", "a\nb", "e\x1b[31m", "%x", "t\tx"]
"""Path components: the sandbox's traps, fresh names, and text no path value may hold."""
SYSTEM = ["/proc", "/proc/self", "/proc/1", "/sys/kernel"]
"""Pseudo file systems: never a directory hpcrl can make (or may: /proc/self is a link)."""


@dataclass(frozen=True)
class Sandbox:
    root: Path

    @classmethod
    def make(cls, root: Path) -> Sandbox:
        root.mkdir(parents=True, exist_ok=True)
        (root / "victim").mkdir(exist_ok=True)
        (root / "victim" / "keep").write_text("victim")
        if not os.path.lexists(root / "link"):
            (root / "link").symlink_to(root / "victim")
        (root / "foreign").mkdir(exist_ok=True)
        (root / "foreign" / "notes.txt").write_text("foreign")
        (root / "plain").write_text("plain")
        (root / "empty").mkdir(exist_ok=True)
        return cls(root)

    def listing(self) -> dict[str, bytes | None]:
        """Every entry under the sandbox (links not followed) -> a file's bytes, None for the others."""
        out: dict[str, bytes | None] = {}
        for directory, dirs, files in os.walk(self.root):
            for name in dirs + files:
                path = Path(directory) / name
                out[str(path)] = path.read_bytes() if path.is_file() and not path.is_symlink() else None
        return out

    def check(self, path: str, code: int, err: str, option: str, before: dict[str, bytes | None]) -> None:
        """The command either refused `path` in one line per problem naming `option` (exit 2), or wrote
        only at the path as `mkdir -p` meets it (and below it), reached without a link: nothing else in
        the sandbox was made, removed or rewritten."""
        assert code in (0, 2), err
        assert "Traceback" not in err, err
        if code == 2:
            problems = [line for line in err.splitlines() if line.startswith("  - ")]
            assert problems and all(f"{option}: " in line for line in problems), err
        after = self.listing()
        target = Path(os.path.normpath(Path(path).absolute()))
        changed = {
            name for name in before.keys() | after.keys() if before.get(name, b"") != after.get(name, b"")
        }
        for name in changed:  # what the command wrote: at the target (its own earlier output included)
            written = Path(name)
            assert code == 0 and (
                written == target or target in written.parents or written in target.parents
            ), name
        if code == 0:
            assert os.path.realpath(target) == str(target)  # no link on the way


@st.composite
def hostile_paths(draw, sandbox: Sandbox) -> str:
    base = draw(st.sampled_from([str(sandbox.root)] * 3 + SYSTEM))
    parts = draw(st.lists(st.sampled_from(PARTS), min_size=0 if base != str(sandbox.root) else 1, max_size=3))
    return os.path.join(base, *parts)
