"""The one process-group factory: every group hpcrl builds carries parallel.timeout_s (issue 14: the RL
job's training groups got torch's default instead)."""

import re
from pathlib import Path

import pytest

from hpcrl.distributed.config import ParallelConfig
from hpcrl.distributed.spawn import run_ranks
from tests.distributed._rank_fns import group_timeouts

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.dist
@pytest.mark.parametrize(("asked", "expected"), [(7.5, 7.5), (None, ParallelConfig.timeout_s)])
def test_every_group_builder_applies_the_timeout(asked, expected):
    seen = run_ranks(group_timeouts, 2, asked)
    assert seen[0] == seen[1] and len(seen[0]) >= 6
    assert set(seen[0]) == {expected}


def test_no_module_creates_a_group_but_the_factory():
    """Source rule: dist.new_group is called in hpcrl/distributed/groups.py only."""
    calls = [
        f"{path.relative_to(REPO)}:{n}"
        for path in (REPO / "hpcrl").rglob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\bdist\.new_group\(", line)
    ]
    assert calls == ["hpcrl/distributed/groups.py:" + str(_factory_line())]


def _factory_line() -> int:
    lines = (REPO / "hpcrl" / "distributed" / "groups.py").read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1) if "dist.new_group(" in line)
