"""The import graph: no cycles between hpcrl modules, the layer contracts (pyproject's
[tool.importlinter], run by `lint-imports` in launch/test.sh) can fail, and local imports say why.

grimp (import-linter's graph library) reads every import statement, including those inside functions,
so a lazy import cannot hide an edge from these checks.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _strongly_connected(graph: grimp.ImportGraph) -> list[list[str]]:
    """Tarjan's strongly connected components of size > 1 (each one is an import cycle)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while component[-1:] != [module]:
                component.append(stack.pop())
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return cycles


def test_no_import_cycle_between_hpcrl_modules():
    """No cycle among the imports that run. An import under `if TYPE_CHECKING:` only names a type for an
    annotation (a stage kind's rules take the ExperimentConfig that registers the kind); it never runs,
    so it cannot make an import-order cycle, and the layer contracts below still count it."""
    assert _strongly_connected(_runtime_graph("hpcrl")) == []


def _runtime_graph(package: str) -> grimp.ImportGraph:
    return grimp.build_graph(package, exclude_type_checking_imports=True)


def test_cycle_finder_finds_a_cycle(tmp_path, monkeypatch):
    package = tmp_path / "cyc"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from cyc import b  # a local import is an edge too\n")
    (package / "b.py").write_text("from cyc import a\n")
    (package / "c.py").write_text("from cyc import a\n")
    (package / "d.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cyc import e\n"
    )
    (package / "e.py").write_text("from cyc import d\n")  # d -> e for annotations only: no cycle
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _strongly_connected(_runtime_graph("cyc")) == [["cyc.a", "cyc.b"]]


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_layer_contracts_hold_and_an_upward_import_breaks_them(tmp_path):
    """The contracts pass on the tree, and the same contracts fail on a copy with one upward import
    (errors, the bottom layer, importing the launcher): the check is able to fail."""
    assert LINT_IMPORTS.exists(), "import-linter is a dev dependency (pyproject's dev extra)"
    kept = _lint_imports(REPO)
    assert kept.returncode == 0, kept.stdout[-3000:] + kept.stderr[-2000:]
    shutil.copytree(REPO / "hpcrl", tmp_path / "hpcrl", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    errors = tmp_path / "hpcrl" / "errors.py"
    errors.write_text(errors.read_text() + "\n\ndef _upward():\n    from hpcrl.launcher import sweeps\n")
    broken = _lint_imports(tmp_path)
    assert broken.returncode == 1, broken.stdout[-3000:]
    assert "hpcrl.errors -> hpcrl.launcher.sweeps" in broken.stdout, broken.stdout[-3000:]


def _local_hpcrl_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of an hpcrl module inside a function of `path`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for inner in ast.walk(node):
            if isinstance(inner, ast.ImportFrom) and inner.module and inner.level == 0:
                found.append((inner.lineno, inner.module))
            elif isinstance(inner, ast.Import):
                found.extend((inner.lineno, alias.name) for alias in inner.names)
    return sorted({(line, module) for line, module in found if module.split(".")[0] == "hpcrl"})


def _explained(lines: list[str], lineno: int) -> bool:
    """A comment on the import's line, or above the run of import lines it belongs to."""
    if "#" in lines[lineno - 1]:
        return True
    above = lineno - 2
    while above >= 0 and (
        not lines[above].strip() or lines[above].strip().startswith(("from ", "import ", ")"))
    ):
        above -= 1
    return above >= 0 and lines[above].strip().startswith("#")


@pytest.mark.parametrize(
    "path", sorted((REPO / "hpcrl").rglob("*.py")), ids=lambda p: str(p.relative_to(REPO))
)
def test_hpcrl_imports_sit_at_module_top_unless_a_comment_says_why(path):
    """A function-local import of an hpcrl module hides the module's place in the graph from a reader:
    it is allowed only with a comment saying which heavy dependency it keeps away (torch out of
    `hpcrl --help` and `expand`, vLLM, megatron's TE)."""
    lines = path.read_text().splitlines()
    unexplained = [
        f"{path.relative_to(REPO)}:{lineno} import {module}"
        for lineno, module in _local_hpcrl_imports(path)
        if not _explained(lines, lineno)
    ]
    assert unexplained == []


def _files_naming_a_stage(name: str, config_class: str, package: Path = REPO / "hpcrl") -> set[str]:
    """The hpcrl modules whose code (not docstrings) names stage `name`: its section (`cfg.<name>`), its
    config class, its kind module, or the stage name as a string."""
    found = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            named = (
                (isinstance(node, ast.Attribute) and node.attr == name)
                or (isinstance(node, ast.Name) and node.id == config_class)
                or (isinstance(node, ast.ImportFrom) and node.module == f"hpcrl.experiment.kinds.{name}")
                or (
                    isinstance(node, ast.ImportFrom)
                    and node.module == "hpcrl.experiment.kinds"
                    and name in {alias.name for alias in node.names}
                )
                or (isinstance(node, ast.Constant) and node.value == name)
            )
            if named:
                found.add(str(path.relative_to(package)))
                break
    return found


@pytest.mark.parametrize(
    ("stage", "config_class", "trainer"),
    [
        ("sft", "SFTConfig", {"posttrain/sft.py"}),
        ("rm", "RMConfig", {"posttrain/rm.py"}),
        ("dpo", "DPOConfig", {"posttrain/dpo.py", "posttrain/kto.py"}),
    ],
)
def test_a_stage_is_its_trainer_its_kind_module_and_its_registry_line(stage, config_class, trainer):
    """Adding a stage touches its trainer, its module of config and rules (hpcrl.experiment.kinds) and its
    registration in hpcrl.experiment.config; no other module names it (issue 42: it was 7 files in 4
    packages)."""
    expected = {f"experiment/kinds/{stage}.py", "experiment/config.py"} | trainer
    assert _files_naming_a_stage(stage, config_class) == expected


def test_the_stage_file_count_sees_a_stage_named_elsewhere(tmp_path):
    package = tmp_path / "hpcrl"
    shutil.copytree(REPO / "hpcrl", package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "plan" / "stray.py").write_text("def steps(cfg):\n    return cfg.rm.steps\n")
    (package / "cli" / "stray.py").write_text("STAGE = 'sft'\n")
    assert "plan/stray.py" in _files_naming_a_stage("rm", "RMConfig", package)
    assert "cli/stray.py" in _files_naming_a_stage("sft", "SFTConfig", package)
