"""`hpcrl resume SWEEP`: resubmit only the failed / cancelled / timed-out elements, as one new array."""

from __future__ import annotations

from pathlib import Path

HELP = "Resubmit the failed, cancelled and timed-out elements of a sweep as one new array job."


def add_arguments(parser) -> None:
    parser.add_argument("sweep", help="Sweep directory.")


def main(args) -> int:
    from hpcrl.config.resolve import ResolvedConfig, element_problems
    from hpcrl.errors import ConfigError, Problem
    from hpcrl.launcher import sweeps
    from hpcrl.launcher.element import load_resolved
    from hpcrl.launcher.manifest import load_manifest

    manifest = sweeps.refresh(load_manifest(args.sweep))
    again = sweeps.resubmittable(manifest)
    if not again:
        print("nothing to resume: no failed, cancelled or timed-out element")
        return 0
    elements = [
        ResolvedConfig(e.index, e.config_id, load_resolved(Path(e.config_path)), {}, e.swept) for e in again
    ]
    problems = [
        Problem(message, entry.config_path, key)
        for entry, element in zip(again, elements, strict=True)
        for key, message in element_problems(element.config)
    ]
    if problems:
        raise ConfigError(problems)
    before = len(manifest.arrays)
    sweeps.submit_elements(manifest, elements)
    for array in manifest.arrays[before:]:
        print(f"resubmitted {len(array['indices'])} element(s) {array['indices']} as job {array['job_id']}")
    return 0
