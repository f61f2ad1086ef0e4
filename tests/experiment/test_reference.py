"""The published config reference (docs/config-reference.md) is the one the config dataclasses make today:
a field added, renamed or re-documented without regenerating the page fails here."""

from __future__ import annotations

from pathlib import Path

from hpcrl.experiment.reference import REFERENCE_PAGE, reference_page

REPO = Path(__file__).resolve().parents[2]


def test_the_published_config_reference_is_generated_from_the_fields():
    published = (REPO / REFERENCE_PAGE).read_text()
    assert published == reference_page(), "stale: regenerate with `python -m hpcrl.experiment.reference`"


def test_the_reference_page_documents_every_key():
    page = reference_page()
    for key in ("--name", "--model.hf_path", "--optim.lr", "--cluster.nodes", "--rm.pairs_per_step"):
        assert f"\n  {key}  " in page, key
