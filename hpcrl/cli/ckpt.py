"""`hpcrl ckpt`: inspect sharded checkpoints without a training job.

    hpcrl ckpt check CKPT [--layout t=1,p=2,d=1]   verify CKPT (a root with `latest`, or one step dir);
                                                   with --layout: can it load under that layout?
    hpcrl ckpt export CKPT --hf DIR [--force]      write an HF model directory (safetensors)
Exit codes: 0 ok, 1 the checkpoint does not verify, 2 usage error or a layout it cannot load under.

--hf DIR is an output directory (hpcrl.config.output_dirs: never through a symlink, never someone else's
non-empty folder); an earlier export there is replaced only with --force. A damaged checkpoint is one
line and exit 1, for export as for check; a DIR the file system refuses is one line naming --hf, exit 2.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Literal, Optional

from jsonargparse import ArgumentParser

from hpcrl.config.output_dirs import HF_EXPORT_DIR, output_dir_problem
from hpcrl.errors import MESSAGE_CHARS, ConfigError, Problem, cut

HELP = "Verify a sharded checkpoint, check it loads under another layout, export it to Hugging Face."


def add_arguments(parser: ArgumentParser) -> None:
    # one level of positionals, not nested subcommands: the top-level parser adds ours after we return
    parser.add_argument("action", type=Literal["check", "export"], help="check | export")
    parser.add_argument("checkpoint", type=str, help="Checkpoint root (with `latest`) or a step_N directory.")
    parser.add_argument(
        "--layout", type=Optional[str], default=None, help="check: target layout, e.g. t=1,p=2,d=1."
    )
    parser.add_argument("--json", action="store_true", help="check: print one JSON object.")
    parser.add_argument("--hf", type=Optional[str], default=None, help="export: output HF directory.")
    parser.add_argument(
        "--prefix",
        type=Optional[str],
        default=None,
        help="export: name prefix of the model tensors (default: the checkpoint's only model, else actor.).",
    )
    parser.add_argument("--force", action="store_true", help="export: replace an earlier export in --hf DIR.")


def main(args) -> int:
    if args.action == "check":
        return _check(args)
    if not args.hf:
        raise ConfigError(Problem("export needs --hf DIR", key="--hf"))
    return _export(args)


def _resolve(path_text: str):
    """(the checkpoint directory to use, the root it was found under or None when named itself)."""
    # hpcrl.ckpt pulls torch (~1 s): imported when the command runs, so `hpcrl --help` stays fast
    from hpcrl.ckpt.trust import checkpoint_dirs

    path = Path(path_text)
    found, root = checkpoint_dirs(path)
    if not found:
        raise ConfigError(
            Problem(f"{path}: no checkpoint (no manifest.json, no committed step_N)", key="checkpoint")
        )
    return found[0], root


def _check(args) -> int:
    # hpcrl.ckpt pulls torch (~1 s): imported when the command runs, so `hpcrl --help` stays fast
    from hpcrl.ckpt.manifest import CorruptCheckpoint
    from hpcrl.ckpt.partition import layout_problems, parse_layout
    from hpcrl.ckpt.verify import verify_directory

    directory, root = _resolve(args.checkpoint)
    layout = None
    if args.layout is not None:
        try:
            layout = parse_layout(args.layout)
        except (ValueError, ConfigError) as err:
            raise ConfigError(Problem(str(err), key="--layout")) from err
    try:
        manifest = verify_directory(directory, root)
    except CorruptCheckpoint as err:
        return _corrupt("check", err)
    problems = layout_problems(manifest, layout) if layout is not None else []
    report = {
        "checkpoint": str(directory),
        "step": manifest.step,
        "verified": True,
        "world_size": manifest.world_size,
        "layout": manifest.layout,
        "tensors": len(manifest.tensors),
        "files": len(manifest.files),
        "bytes": sum(f.size for f in manifest.files.values()),
        "model_fingerprint": manifest.model_fingerprint,
        "target_layout": args.layout,
        "loads": not problems,
        "problems": problems,
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"{directory}: step {manifest.step}, {report['tensors']} tensors in {report['files']} files "
            f"({report['bytes']} bytes), saved by {manifest.world_size} ranks with layout {manifest.layout}: verified"
        )
        if layout is not None and not problems:
            print(f"loads under t={layout.tensor},p={layout.pipeline},d={layout.data}")
    if problems:
        raise ConfigError([Problem(p, key="--layout") for p in problems])
    return 0


def _export(args) -> int:
    # hpcrl.ckpt pulls torch (~1 s): imported when the command runs, so `hpcrl --help` stays fast
    from hpcrl.ckpt.export import export_hf
    from hpcrl.ckpt.manifest import CheckpointError, CorruptCheckpoint
    from hpcrl.ckpt.trust import check_step_dir

    out = _export_dir(args.hf, args.force)
    directory, root = _resolve(args.checkpoint)
    try:
        check_step_dir(directory, root)
        export_hf(directory, out, prefix=args.prefix)
    except CorruptCheckpoint as err:
        return _corrupt("export", err)
    except CheckpointError as err:  # a readable checkpoint without the model asked for
        raise ConfigError(Problem(str(err), key="--prefix")) from None
    except OSError as err:  # the file system refused the directory (/proc, permissions, space)
        where = os.fsdecode(err.filename) if err.filename is not None else str(out)
        raise ConfigError(Problem(f"cannot write: {err.strerror or err}", file=where, key="--hf")) from None
    print(f"wrote {out}")
    return 0


def _corrupt(action: str, err: Exception) -> int:
    """A checkpoint that does not verify: one line (control characters escaped, cut), exit 1."""
    print(f"hpcrl ckpt {action}: CORRUPT: {cut(str(err), MESSAGE_CHARS)}", file=sys.stderr)
    return 1


def _export_dir(text: str, force: bool) -> Path:
    """--hf DIR checked before anything is read or written: an output directory, and an earlier export
    there (config.json or model.safetensors) is replaced only with --force."""
    problem = output_dir_problem(text, HF_EXPORT_DIR)
    if problem:
        raise ConfigError(Problem(problem, key="--hf"))
    out = Path(text).absolute()
    earlier = sorted(name for name in HF_EXPORT_DIR.names if os.path.lexists(out / name))
    if earlier and not force:
        raise ConfigError(
            Problem(f"{out} holds an earlier export ({', '.join(earlier)}): --force replaces it", key="--hf")
        )
    return out
