"""One result schema for every benchmark: a JSONL record per measurement.

The schema lives in the package (hpcrl.bench.records) so `hpcrl bench report` reads it from anywhere;
benchmark programs keep importing `Record` and `write_records` from here.
"""

from __future__ import annotations

from hpcrl.bench.records import Record, git_commit, write_records

__all__ = ["Record", "git_commit", "write_records"]
