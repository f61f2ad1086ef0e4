"""Which processes still run, read from /proc: a zombie counts as gone (it is dead; only its parent's wait
is missing, and in a container no init may ever reap it)."""

from __future__ import annotations

from pathlib import Path


def _stat_fields(pid: int | str) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state first), or None once the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def live_with_environ(key: str, value: str) -> list[int]:
    """Pids of the live (non-zombie) processes whose environment has `key=value`: every descendant of a
    process started with it, whatever process group or session it moved to (a killed parent's children
    are reparented, so the tree can no longer be walked; their environment still says whose they are)."""
    wanted = f"{key}={value}".encode()
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:  # gone, or not ours to read
            continue
        if wanted in environ and alive(int(entry.name)):
            members.append(int(entry.name))
    return members
