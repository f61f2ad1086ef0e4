"""What the async placement's rollout pool hands the training pool, and how it crosses (and is saved).

The rollout pool collects whole training batches (generate, score, dynamic sampling: hpcrl.rl.driver's
`collect`) and hands them over as `RolloutMessage`s: the batches, tagged with their index and the weight
version they were generated with (also per sample, `weight_version_B`), the held-out reward when the step
evaluates, the rollout's data cursor after them and its busy time. The first rollout rank broadcasts
each message over a group of itself and the training ranks (`BatchChannel`, as bytes of the codec below);
the other rollout ranks hold the same batch already (their generation all-gather) and take no part.

Batches generated but not yet trained (the in-flight ones, up to `max_off_policy_steps`) are part of the
exactly-once state: the training pool holds them and saves them with every checkpoint as one uint8 tensor
(`encode_batches`: a JSON header + the raw tensor bytes, so no load path unpickles anything, as
hpcrl.ckpt.state's rule; floats round-trip bitwise).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from hpcrl.data.tasks import Example
from hpcrl.distributed.collectives import collective_device
from hpcrl.rl.collector import RolloutBatch
from hpcrl.rl.experience import Experience
from hpcrl.rollout.base import GenerationOutput

VERSION_KEY = "weight_version_B"
"""Experience.tensors key: the weight version each sample was generated with ([B], int64)."""


@dataclass
class RolloutMessage:
    """What the rollout pool sends at one point of a step (hpcrl.rl.offpolicy.driver says when)."""

    batches: list[RolloutBatch]
    cursor: dict[str, int]
    """The rollout's data cursor after these batches (the checkpoint's data cursor)."""
    heldout: dict[str, float] | None = None
    """Held-out metrics of this step's evaluation (the weights before the step's update), if any
    (hpcrl.rl.collector.Collector.evaluate)."""
    busy_s: float = 0.0
    """Seconds the rollout pool worked for this message: weight swap, generation, reward."""


class BatchChannel:
    """The first rollout rank -> every training rank, over a group of exactly those ranks.

    Collective within the group: `send` on the source, `receive` on every training rank, in the same
    order. A message crosses as two broadcasts (its size, then `encode_message`'s bytes) on the group's
    device: no pickle (torch.distributed's object broadcast unpickled a 128-row batch in ~3.7 ms, the
    codec decodes it in 0.2 ms; the rollout pool waits for it every step)."""

    def __init__(self, group: dist.ProcessGroup, src: int):
        self.group, self.src = group, src
        self.device = collective_device(group)

    def send(self, message: RolloutMessage) -> None:
        blob = encode_message(message).to(self.device)
        dist.broadcast(torch.tensor([blob.numel()], device=self.device), src=self.src, group=self.group)
        dist.broadcast(blob, src=self.src, group=self.group)

    def receive(self) -> RolloutMessage:
        size = torch.zeros(1, dtype=torch.int64, device=self.device)
        dist.broadcast(size, src=self.src, group=self.group)
        blob = torch.empty(int(size), dtype=torch.uint8, device=self.device)
        dist.broadcast(blob, src=self.src, group=self.group)
        return decode_message(blob)


# ------------------------------------------------------------------------------------------------ codec
_EXP_TENSORS = ("group_ids_B", "prompt_ids_BP", "prompt_mask_BP")
"""Experience's own tensors; the format's names, in the order every checkpoint so far was written in:
these, GenerationOutput's fields, sampled_B, scores_B, then `tensors.<name>`."""


_GEN_TENSORS = tuple(f.name for f in dataclasses.fields(GenerationOutput) if f.name != "extras")
"""GenerationOutput's tensors; its `extras` reach the experience's `tensors` before a batch is sent."""


def _batch_tensors(batch: RolloutBatch) -> dict[str, torch.Tensor]:
    exp = batch.exp
    out = {name: getattr(exp, name) for name in _EXP_TENSORS}
    out |= {name: getattr(exp.gen, name) for name in _GEN_TENSORS}
    out["sampled_B"] = batch.sampled_B
    if exp.scores_B is not None:
        out["scores_B"] = exp.scores_B
    out |= {f"tensors.{k}": v for k, v in exp.tensors.items()}
    return out


def _encode(header: dict[str, Any], batches: list[RolloutBatch], with_seconds: bool) -> torch.Tensor:
    """8 bytes of header length, a JSON header (`header` + per batch: index, version, prompts, answers,
    responses, metrics, each tensor's name/dtype/shape), then every tensor's raw bytes in header order."""
    entries: list[dict] = []
    blobs: list[bytes] = []
    for batch in batches:
        tensors = _batch_tensors(batch)
        entries.append(
            {
                "index": batch.index,
                "version": batch.version,
                "examples": [[e.prompt, e.answer] for e in batch.exp.examples],
                "responses": list(batch.exp.responses),
                "metrics": batch.metrics,
                "seconds": batch.seconds if with_seconds else {},
                "tensors": [
                    [n, str(t.dtype).removeprefix("torch."), list(t.shape)] for n, t in tensors.items()
                ],
            }
        )
        blobs += [t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes() for t in tensors.values()]
    head = json.dumps({**header, "batches": entries}).encode()
    data = len(head).to_bytes(8, "little") + head + b"".join(blobs)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _decode(blob: torch.Tensor) -> tuple[dict[str, Any], list[RolloutBatch]]:
    data = blob.cpu().contiguous().numpy().tobytes()
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + size])
    offset = 8 + size
    out = []
    for entry in header.pop("batches"):
        tensors = {}
        for name, dtype_name, shape in entry["tensors"]:
            dtype = getattr(torch, dtype_name)
            count = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
            raw = bytearray(data[offset : offset + count])
            offset += count
            tensors[name] = (
                torch.frombuffer(raw, dtype=dtype).reshape(shape)
                if count
                else torch.empty(shape, dtype=dtype)
            )
        out.append(_batch_from(entry, tensors))
    if offset != len(data):
        raise ValueError(f"rollout batches: {len(data) - offset} trailing bytes after the last tensor")
    return header, out


def encode_batches(batches: list[RolloutBatch]) -> torch.Tensor:
    """The in-flight batches as one 1-D uint8 checkpoint tensor, without their wall-clock seconds (a
    checkpoint holds only what the run computes). Never empty: the header is always there."""
    return _encode({}, batches, with_seconds=False)


def decode_batches(blob: torch.Tensor) -> list[RolloutBatch]:
    """Inverse of `encode_batches` (bitwise: every tensor comes back with its bytes, dtype and shape)."""
    return _decode(blob)[1]


def encode_message(message: RolloutMessage) -> torch.Tensor:
    """A whole message (its batches with their seconds, the cursor, held-out reward, busy time)."""
    header = {"cursor": message.cursor, "heldout": message.heldout, "busy_s": message.busy_s}
    return _encode(header, message.batches, with_seconds=True)


def decode_message(blob: torch.Tensor) -> RolloutMessage:
    header, batches = _decode(blob)
    return RolloutMessage(batches, header["cursor"], header["heldout"], header["busy_s"])


def _batch_from(entry: dict, tensors: dict[str, torch.Tensor]) -> RolloutBatch:
    gen = GenerationOutput(**{name: tensors[name] for name in _GEN_TENSORS})
    exp = Experience(
        examples=[Example(prompt, answer) for prompt, answer in entry["examples"]],
        gen=gen,
        responses=list(entry["responses"]),
        scores_B=tensors.get("scores_B"),
        tensors={k.removeprefix("tensors."): v for k, v in tensors.items() if k.startswith("tensors.")},
        **{name: tensors[name] for name in _EXP_TENSORS},
    )
    sampled_B, metrics, seconds = tensors["sampled_B"], dict(entry["metrics"]), dict(entry["seconds"])
    return RolloutBatch(entry["index"], entry["version"], exp, sampled_B, metrics, seconds)
