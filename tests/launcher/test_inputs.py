"""An element's inputs from upstream stages (hpcrl.launcher.inputs): a selection rule picks by the
candidates' metrics and the pick is recorded and kept across attempts; an HF export is verified file by
file before it is used (hpcrl.ckpt.export_manifest): missing, partial, altered, added to or linked is
refused naming the stage and key; inputs.json is untrusted (any bytes: refused or read, nothing else)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcrl.ckpt.export_manifest import EXPORT_MANIFEST, export_problem, write_export_manifest
from hpcrl.errors import ConfigError
from hpcrl.launcher.inputs import SELECTED, VERIFIED, Input, bind_inputs, read_inputs, write_inputs


def _export(directory: Path) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text('{"vocab_size": 16}')
    (directory / "model.safetensors").write_bytes(b"\x00" * 64)
    (directory / "tokenizer").mkdir()
    (directory / "tokenizer" / "vocab.json").write_text("{}")
    write_export_manifest(directory)
    return directory


def _candidates(tmp_path: Path, losses: list[float | None]) -> list[Path]:
    runs = []
    for n, loss in enumerate(losses):
        run = tmp_path / "runs" / f"e{n}"
        _export(run / "hf")
        rows = [{"step": 0}, {"step": 1, "loss": 9.0}, {"step": 2, "loss": loss}, {"step": 3}]
        if loss is None:  # never logged it
            rows = [{"step": 0}]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        runs.append(run)
    return runs


def _consumer(tmp_path: Path, runs: list[Path], rule: str | None, metric: str | None = "loss") -> Path:
    reference = f"${{stages.sft.{rule}({metric}).hf}}" if rule else str(runs[0] / "hf")
    me = tmp_path / "runs" / "consumer"
    me.mkdir(parents=True, exist_ok=True)
    outputs = [str(r / "hf") for r in runs]
    write_inputs(
        me, [Input("model.hf_path", reference, "sft", "hf", [str(r) for r in runs], outputs, rule, metric)]
    )
    return me


def test_a_tie_goes_to_the_lowest_index_for_every_rule(tmp_path):
    runs = _candidates(tmp_path, [0.5, 0.2, 0.2, 0.5])
    for rule, picked in (("min", 1), ("max", 0), ("best", 0)):
        me = _consumer(tmp_path, runs, rule)
        (me / SELECTED).unlink(missing_ok=True)
        bound = bind_inputs(me, read_inputs(me), {"model.hf_path": read_inputs(me)[0].reference})
        assert bound == {"model.hf_path": str(runs[picked] / "hf")}, rule


@pytest.mark.parametrize(("rule", "picked"), [("min", 1), ("max", 2), ("best", 2)])
def test_a_rule_picks_by_the_last_logged_value_and_the_pick_is_kept(tmp_path, rule, picked):
    runs = _candidates(tmp_path, [0.5, 0.2, 0.8, None])
    me = _consumer(tmp_path, runs, rule)
    reference = read_inputs(me)[0].reference
    bound = bind_inputs(me, read_inputs(me), {"model.hf_path": reference})
    assert bound == {"model.hf_path": str(runs[picked] / "hf")}
    record = json.loads((me / SELECTED).read_text())[reference]
    assert record["element"] == picked and record["scores"] == {"0": 0.5, "1": 0.2, "2": 0.8, "3": None}
    (runs[0] / "metrics.jsonl").write_text(json.dumps({"step": 3, "loss": -5.0}) + "\n")  # logged since
    assert (
        bind_inputs(me, read_inputs(me), {"model.hf_path": reference}) == bound
    )  # a restarted attempt: the same element


def test_no_candidate_with_the_metric_is_refused_naming_the_key(tmp_path):
    me = _consumer(tmp_path, _candidates(tmp_path, [None, None]), "best", "reward/heldout")
    with pytest.raises(ConfigError) as err:
        bind_inputs(me, read_inputs(me), {"model.hf_path": "${stages.sft.best(reward/heldout).hf}"})
    assert err.value.problems[0].key == "model.hf_path" and "no element of stage sft logged" in str(err.value)


@pytest.mark.parametrize(
    ("harm", "words"),
    [
        (lambda hf: (hf / "model.safetensors").unlink(), "missing (a partial export)"),
        (lambda hf: (hf / "config.json").write_text('{"vocab_size": 17}'), "altered"),
        (lambda hf: (hf / "pytorch_model.bin").write_bytes(b"x"), "not one of the export's files"),
        (lambda hf: (hf / EXPORT_MANIFEST).unlink(), "a partial export, or not one hpcrl wrote"),
        (lambda hf: (hf / EXPORT_MANIFEST).write_text("{"), "unreadable"),
        (lambda hf: (hf / "link").symlink_to("/etc/passwd"), "symbolic link"),
        (lambda hf: __import__("shutil").rmtree(hf), "missing (the upstream stage wrote no export)"),
    ],
)
def test_an_export_that_is_not_the_one_written_is_refused_before_it_is_used(tmp_path, harm, words):
    runs = _candidates(tmp_path, [0.1])
    me = _consumer(tmp_path, runs, None)
    assert export_problem(runs[0] / "hf") is None
    harm(runs[0] / "hf")
    with pytest.raises(ConfigError) as err:
        bind_inputs(me, read_inputs(me), {"model.hf_path": str(runs[0] / "hf")})
    problem = err.value.problems[0]
    assert problem.key == "model.hf_path" and "the export of stage sft cannot be used" in problem.message
    assert words in problem.message, problem.message


def _age(directory: Path, seconds: float) -> None:
    for path in directory.rglob("*"):
        info = path.stat()
        os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns - int(seconds * 1e9)))


def test_a_restarted_consumer_hashes_only_what_changed_and_still_refuses_an_altered_export(
    tmp_path, monkeypatch
):
    """A restart of the consumer re-hashes no file whose size, mtime and inode are those it verified
    (inputs.verified.json); a file rewritten since is hashed again and refused; a file written within the
    racy window of a check is never trusted by its stamp; hostile stamps only cost a re-hash."""
    import hpcrl.ckpt.export_manifest as manifest

    hashed: list[str] = []
    real = manifest.file_sha256
    monkeypatch.setattr(manifest, "file_sha256", lambda path: hashed.append(Path(path).name) or real(path))
    runs = _candidates(tmp_path, [0.1])
    me = _consumer(tmp_path, runs, None)
    hf = runs[0] / "hf"

    def bind() -> dict:
        hashed.clear()
        return bind_inputs(me, read_inputs(me), {"model.hf_path": str(hf)})

    assert bind() and sorted(hashed) == ["config.json", "model.safetensors", "vocab.json"]
    assert bind() and len(hashed) == 3  # just written: racily clean, no stamp trusted yet
    _age(hf, 3600)
    assert bind() and len(hashed) == 3  # stamps recorded now
    assert bind() and hashed == []  # the restart: nothing changed, nothing hashed
    (hf / "config.json").write_text('{"vocab_size": 17}')  # same size, rewritten in place
    with pytest.raises(ConfigError, match="config.json is not the file the export wrote"):
        bind()
    assert hashed == ["config.json"]
    (hf / "config.json").write_text('{"vocab_size": 16}')
    _age(hf, 3600)
    assert bind() and bind() == {"model.hf_path": str(hf)} and hashed == []
    for hostile in ("[1, 2]", json.dumps({str(hf): {"config.json": "x"}}), "\u0000garbage", "{" * 100000):
        (me / VERIFIED).write_text(hostile)
        assert bind() and len(hashed) >= 1  # untrusted stamps: hashed again, still bound


def test_a_config_that_does_not_hold_the_reference_is_refused(tmp_path):
    me = _consumer(tmp_path, _candidates(tmp_path, [0.1]), None)
    with pytest.raises(ConfigError, match="does not hold"):
        bind_inputs(me, read_inputs(me), {"model.hf_path": "/somewhere/else"})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    raw=st.binary(max_size=200)
    | st.lists(
        st.fixed_dictionaries(
            {
                "key": st.sampled_from(["model.hf_path", 3]),
                "reference": st.text(max_size=5),
                "stage": st.just("s"),
                "output": st.sampled_from(["hf", "run_dir", "x"]),
            },
            optional={
                "candidates": st.lists(st.sampled_from(["/a", "rel", "/a/../etc", 5]), max_size=2),
                "outputs": st.lists(st.sampled_from(["/a/hf", "x"]), max_size=2),
                "rule": st.sampled_from(["best", "worst", None]),
                "metric": st.sampled_from(["m", None, 1]),
                "extra": st.just(0),
            },
        ),
        max_size=3,
    ).map(lambda items: json.dumps(items).encode())
)
def test_any_inputs_file_reads_or_is_refused_naming_it(tmp_path, raw):
    (tmp_path / "inputs.json").write_bytes(raw)
    try:
        inputs = read_inputs(tmp_path)
    except ConfigError as err:
        assert all(p.file == str(tmp_path / "inputs.json") for p in err.problems)
    else:
        for item in inputs:
            assert (
                item.output in ("hf", "run_dir", "checkpoint")
                and len(item.candidates) == len(item.outputs) >= 1
            )
            assert all(p.startswith("/") and ".." not in p for p in [*item.candidates, *item.outputs])


def test_an_export_directory_is_known_by_its_record_too():
    """`hpcrl ckpt export --force` replaces a directory holding only an export's files: the record is one."""
    from hpcrl.config.output_dirs import HF_EXPORT_DIR

    assert EXPORT_MANIFEST in HF_EXPORT_DIR.names


def test_a_torn_or_hostile_metrics_file_reads_as_what_it_wholly_holds(tmp_path):
    import os

    from hpcrl.launcher.inputs import last_value

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_bytes(
        b'{"step": 0, "m": 0.3}\n[1]\n{"step": -1, "m": 9}\n{"step": 1, "m": 0.7'
    )
    assert last_value(run, "m") == 0.3  # the torn last line (a killed writer) and the non-records skipped
    (run / "metrics.jsonl").write_bytes(b'{"step": 0, "m": ' + b"9" * 400 + b'}\n{"step": 1, "m": NaN}\n')
    assert last_value(run, "m") is None
    (run / "metrics.jsonl").unlink()
    os.mkfifo(run / "metrics.jsonl")  # never opened for reading: it would hang the consumer's start
    assert last_value(run, "m") is None
