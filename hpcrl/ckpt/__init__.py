"""Sharded HDF5 checkpoints: manifest, commit protocol, async save, reshard on load, HF export.

    from hpcrl.ckpt.checkpointer import Checkpointer
    ck = Checkpointer(root, group=pg, keep_last=2, async_save=True)
    ck.save(step, shards, RunState(step=step, data_cursor=..., algorithm_state=...), layout=..., extra=...)
    ck.fence()                                    # before writing saved tensors in place (optimizer step)
    loaded = ck.load(specs, fallback=True)        # specs of THIS rank under ANY layout
    restore_rng(loaded.rng); loaded.tensors[name]; loaded.state.data_cursor

| file            | role |
|-----------------|------|
| shards.py       | `ShardedTensor` (local tensor = one hyperslab of a named global tensor), `ShardSpec`, `Box`, dtypes, the caller contract (fused tensors = several logical tensors, replicas written once) |
| plan.py         | one metadata all-gather -> owner of every shard (lowest rank of its replicas), file and dataset names |
| rankfile.py     | one rank's HDF5 file: contiguous datasets, raw `pwrite` of the bytes, fsync, segment checksums |
| integrity.py    | fsync helpers, durable small writes, XXH3-128 segment checksums aligned to dataset boundaries |
| manifest.py     | `manifest.json` schema and self-consistency (shapes, dtypes, shards, files, checksums, fingerprints, RNG, state) |
| save.py         | write -> per-rank record -> rank 0 commits; sync path with failure agreement |
| commit.py       | `step_N.tmp-*` -> `step_N` -> `latest`; keep-last-k; leftovers of crashes; `.rejected-*` |
| checkpointer.py | `Checkpointer`: sync/async save (one save in flight, snapshot and write threads), fence, load |
| snapshot.py     | async save's host snapshot (reused buffers), its fence, the guard failing a save on unfenced writes |
| load.py         | candidates, verification agreed across ranks, fallback (rejected ones set aside), hyperslab reads counted exactly |
| trust.py        | the trust boundary: paths stay in the step dir, HDF5 datasets plain and as the manifest says |
| verify.py       | file/segment verification naming file and tensor; `hpcrl ckpt check`'s full verification |
| partition.py    | shard specs of another (t, p, d) from the manifest's partition annotations |
| state.py        | `RunState` and RNG states as JSON (no pickle on any load path) |
| collectives.py  | the few collectives, over an explicit group, JSON in uint8 tensors (no pickle) |
| trigger.py      | when to save: every N steps, on a signal, before the Slurm time limit; agreed across ranks |
| megatron.py     | a megatron-core `Trainer` (params + AdamW) as shards; load back under any layout |
| export.py       | checkpoint -> Hugging Face directory (safetensors) |
| command.py      | `hpcrl ckpt check CKPT [--layout t=..,p=..,d=..]`, `hpcrl ckpt export CKPT --hf DIR` |
"""
