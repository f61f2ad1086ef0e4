"""Where hpcrl may create or fill a directory of its own: the one rule for a sweep directory, a run root
and an HF export directory (and any later directory a command is told to write, e.g. a pipeline's).

- The path is a path value (hpcrl.config.text_rules: one line of printable text, bounded lengths).
- It is never reached through a symbolic link: no component of the path as given is a link. A link
  planted at `/tmp/demo -> /etc` turned the README's `--sweep_dir /tmp/demo/sweep` into writes to /etc
  (as root); `/proc/self/...` is a link too. The message names the link and the directory it leads to,
  which the user may give instead (a site's `/home -> /gpfs/home` costs typing the real path once).
- No component is a file (`DIR/sub` under a file), and the path itself is a directory or does not exist.
- An existing directory is empty or holds only what hpcrl writes into that kind of directory
  (`DirKind.owns`): a folder of someone else's files is never filled with ours (nor, for an export,
  overwritten). Whether ours may be replaced (a submitted sweep, an earlier export) is the caller's rule.

Checked before anything is written; a file system refusal afterwards (a /proc directory, permissions) is
the caller's to report in one line. The walk is no lock: a link made between it and the writes is not
seen (the paths are the user's own, not a shared spool).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from hpcrl.config.text_rules import path_problem
from hpcrl.errors import short

FOREIGN_SHOWN = 3
"""Entries of a foreign folder quoted in its message."""


@dataclass(frozen=True)
class DirKind:
    """A kind of directory hpcrl writes, named for messages, and the entries it writes into one."""

    what: str
    """'a sweep directory', ... (as in 'is a non-empty folder that is not a sweep directory')."""
    names: frozenset[str] = frozenset()
    """Entries hpcrl writes into it (files and directories)."""
    any_directory: bool = False
    """Every real directory is one of its entries (a run root holds one directory per experiment name)."""

    def owns(self, entry: os.DirEntry) -> bool:
        """Whether `entry` is one hpcrl writes here; the temporary files of an interrupted atomic write
        (hpcrl.config.yaml_io.atomic_write: '.<name>.<random>.tmp') count as ours."""
        if entry.name in self.names or (entry.name.startswith(".") and entry.name.endswith(".tmp")):
            return True
        return self.any_directory and entry.is_dir(follow_symlinks=False)


SWEEP_DIR = DirKind("a sweep directory", frozenset({"manifest.json", "configs", "sbatch", "slurm", "local"}))
RUN_ROOT = DirKind("a run root (one directory per experiment name)", any_directory=True)
HF_EXPORT_DIR = DirKind(
    "an HF export directory",
    frozenset(
        {  # what hpcrl.ckpt.export writes: the model, and the tokenizer's files as transformers saves them
            "config.json",
            "model.safetensors",
            "generation_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "special_tokens_map.json",
            "added_tokens.json",
            "chat_template.jinja",
            "chat_template.json",
            "vocab.json",
            "merges.txt",
            "tokenizer.model",
            "hpcrl-export.json",  # its file record, written last (hpcrl.ckpt.export_manifest)
        }
    ),
)
PIPELINE_DIR = DirKind(
    "a pipeline directory", frozenset({"pipeline.json"}), any_directory=True
)  # pipeline.json and one sweep directory per stage (hpcrl.pipeline.manifest)


def output_dir_problem(path: str | Path, kind: DirKind) -> str | None:
    """Why hpcrl may not create or fill `path` as a directory of `kind` (see the module docstring), or None."""
    problem = path_problem(str(path))
    if problem:
        return problem
    absolute = Path(path).absolute()  # not resolved: every component as given is checked
    # ...and as `mkdir -p` meets them: 'new/..' is the parent once 'new' is made (with no link on the
    # way, the lexical '..' is the real one), and 'new/../link' goes through 'link'
    target = Path(os.path.normpath(absolute))
    problem = _reach_problem(absolute) or _reach_problem(target)
    if problem or not target.is_dir():
        return problem
    foreign = _foreign_entries(target, kind)
    if foreign:
        shown = ", ".join(short(name) for name in foreign[:FOREIGN_SHOWN])
        more = ", ..." if len(foreign) > FOREIGN_SHOWN else ""
        return (
            f"is a non-empty folder that is not {kind.what} (it holds {shown}{more}): "
            "choose a new or empty directory"
        )
    return None


def _reach_problem(path: Path) -> str | None:
    """A link or a file among the existing components of `path` (the walk stops at the first that does
    not exist: what follows, hpcrl creates)."""
    parts = path.parts
    for depth in range(1, len(parts) + 1):
        prefix = Path(*parts[:depth])
        try:
            mode = os.lstat(prefix).st_mode
        except FileNotFoundError:
            return None
        except OSError as err:
            return f"cannot be reached: {prefix}: {err.strerror or err}"
        if stat.S_ISLNK(mode):
            where = "is" if prefix == path else f"is reached through {short(str(prefix))}, which is"
            return (
                f"{where} a symbolic link (to {short(_readlink(prefix))}); hpcrl never writes through one: "
                f"give the directory it leads to ({short(os.path.realpath(path))}) if that is meant"
            )
        if not stat.S_ISDIR(mode):
            return (
                "is a file, not a directory" if prefix == path else f"lies under {short(str(prefix))}, a file"
            )
    return None


def _readlink(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError as err:
        return f"unreadable: {err.strerror}"


def _foreign_entries(directory: Path, kind: DirKind) -> list[str]:
    """Names in `directory` that hpcrl does not write into `kind` (sorted; an unreadable directory is
    foreign as a whole)."""
    try:
        with os.scandir(directory) as entries:
            return sorted(entry.name for entry in entries if not kind.owns(entry))
    except OSError as err:
        return [f"<unreadable: {err.strerror or err}>"]
