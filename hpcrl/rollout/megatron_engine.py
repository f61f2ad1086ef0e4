"""Rollout on megatron-core at the generation layout: HybridFlow's sharded rollout worker, on CPU or GPU.

A GPTModel built with the *generation* process groups (TP = t_g over ParallelLayout's strided generation
TP groups, PP = p_g; `hpcrl.train.model.build_generation_groups`) generates with a KV cache
(megatron-core's `StaticInferenceContext`, which `GPTModel.forward(inference_context=)` fills layer by
layer). Its parameters hold no weights of their own: the RL job binds them to the reshard engine's
generation buffers (`hpcrl.reshard.generation.GenerationStore`), so every weight sync writes straight
into the model this engine runs.

Why a loop of our own over `GPTModel.forward` and not megatron's `TextGenerationController`: the
controllers place tensors with `torch.cuda.current_device()` and draw from a CUDA `torch.Generator`, and
they run one TP/PP world (megatron's global parallel state); this loop takes the generation groups
explicitly and runs the same on gloo and NCCL.

One decode step: stage s receives hidden states [S, B, H] from s-1 (nothing on the first stage), runs its
layers (KV cache of its own layers), sends to s+1; the last stage's vocab shards [B, V/t_g] are
all-gathered over the generation TP group (megatron's runtime_gather_output), TP rank 0 samples, and the tokens and their log-probs are
broadcast to the whole generation replica (t_g·p_g ranks), so every rank of a replica returns the same
output. Prefill masks left padding and the causal future; decode masks the padded keys only. Ragged
batches (`ragged`): prompts prefill in length buckets over their own columns, and a row that sampled EOS
leaves the decode batch and its KV-cache slots.

Log-probs contract (as the HF and vLLM engines): log softmax(logits / temperature) of each sampled token
(greedy: temperature 1), without top-k/top-p truncation; 0 on padding.

Shapes: B prompts, P prompt tokens (left padded), T new tokens, S tokens in one forward, V vocabulary,
H hidden.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

import torch
import torch.distributed as dist

from hpcrl.rollout.base import (
    GenerationOutput,
    SamplingParams,
    gumbel_noise,
    left_pad,
    response_mask_from_eos,
)
from hpcrl.rollout.cache_slots import CacheSlots
from hpcrl.train.config import ModelConfig
from hpcrl.train.model import (
    TrainGroups,
    build_gpt_model,
    named_global_params,
)


def filter_logits(logits_BV: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Top-k then nucleus (top-p) truncation: logits outside the kept set become -inf.

    Top-p keeps the smallest set of most likely tokens whose probability reaches `top_p` (Holtzman et al.
    2020, §3.1), always at least the most likely token.
    """
    if top_k > 0 and top_k < logits_BV.shape[-1]:
        kth_B1 = torch.topk(logits_BV, top_k, dim=-1).values[:, -1:]
        logits_BV = logits_BV.masked_fill(logits_BV < kth_B1, float("-inf"))
    if top_p < 1.0:
        sorted_BV, order_BV = torch.sort(logits_BV, dim=-1, descending=True)
        cum_BV = sorted_BV.softmax(dim=-1).cumsum(dim=-1)
        mass_before_BV = cum_BV - sorted_BV.softmax(dim=-1)
        drop_sorted_BV = mass_before_BV >= top_p  # the kept tokens already hold top_p
        drop_sorted_BV[:, 0] = False  # the most likely token always stays
        drop_BV = drop_sorted_BV.scatter(-1, order_BV, drop_sorted_BV)
        logits_BV = logits_BV.masked_fill(drop_BV, float("-inf"))
    return logits_BV


def sample_tokens(
    logits_BV: torch.Tensor,
    sampling: SamplingParams,
    seeds_B: torch.Tensor | None = None,
    position: int | torch.Tensor = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens_B, logprobs_B): sampled (or greedy) tokens and their log-probs under the contract above.

    With `seeds_B`, row b's token at `position` is argmax(kept logits/temperature + Gumbel noise of
    (seeds_B[b], position, vocab id)): the same token whatever the batch split (`gumbel_noise`).
    Without, torch.multinomial draws from the process RNG.
    """
    logits_BV = logits_BV.float()
    logp_BV = torch.log_softmax(logits_BV / sampling.logprob_temperature, dim=-1)
    if sampling.temperature <= 0:
        tokens_B = logits_BV.argmax(dim=-1)
    else:
        kept_BV = filter_logits(logits_BV / sampling.temperature, sampling.top_k, sampling.top_p)
        if seeds_B is None:
            tokens_B = torch.multinomial(kept_BV.softmax(dim=-1), 1).squeeze(-1)
        else:
            noise_BV = gumbel_noise(seeds_B.to(kept_BV.device), position, kept_BV.shape[-1])
            tokens_B = (kept_BV.double() + noise_BV).argmax(dim=-1)
    return tokens_B, logp_BV.gather(-1, tokens_B[:, None]).squeeze(-1)


class MegatronRolloutEngine:
    """RolloutEngine over a megatron-core GPTModel at the generation layout (one per rank, SPMD)."""

    def __init__(
        self,
        model: torch.nn.Module,
        cfg: ModelConfig,
        groups: TrainGroups,
        pad_id: int,
        eos_id: int,
        *,
        ragged: bool = True,
        max_rows: int | None = None,
    ):
        self.model, self.cfg, self.groups = model.eval(), cfg, groups
        self.pad_id, self.eos_id = pad_id, eos_id
        self.max_rows = max_rows
        """Sequences decoding at once (rollout.max_num_seqs; None: every prompt of a call); the others
        wait and join as rows finish."""
        self.ragged = ragged
        """Prefill in length buckets and batch continuously (False: the static batch, one padded prefill
        of every prompt and every row decoded until the last is done, `max_rows` ignored: what
        benchmarks/lengths.py measures against)."""
        sample = next(model.parameters())
        self.device, self.dtype = sample.device, sample.dtype

    @classmethod
    def build(
        cls, cfg: ModelConfig, groups: TrainGroups, pad_id: int, eos_id: int, **kwargs
    ) -> MegatronRolloutEngine:
        """A model of memory only (no random init): weights arrive by `bind`-ing the generation store or
        by `load_weights` before the first `generate`."""
        return cls(build_gpt_model(cfg, groups, initialize=False), cfg, groups, pad_id, eos_id, **kwargs)

    def sleep(self) -> None:
        """Nothing here: its weights are views of the generation store, which the hand-off puts to sleep
        (hpcrl.reshard.generation.GenerationStore.sleep)."""

    def wake_up(self) -> None:
        """The store wakes at the next sync."""

    def global_params(self) -> dict[str, torch.nn.Parameter]:
        """Global Megatron name -> parameter of this rank's generation shard (what the store binds)."""
        return dict(named_global_params(self.model, self.cfg, self.groups))

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy (global Megatron name, generation-shard tensor) pairs into the model (tests, benchmarks;
        the RL job binds the store instead). Every parameter must arrive once, with its shape."""
        params, seen = self.global_params(), set()
        for name, tensor in weights:
            if name not in params:
                raise KeyError(f"generation model has no parameter {name!r} (rank {dist.get_rank()})")
            if tuple(tensor.shape) != tuple(params[name].shape) or name in seen:
                raise ValueError(
                    f"{name}: shape {tuple(tensor.shape)} vs {tuple(params[name].shape)}, or sent twice"
                )
            params[name].copy_(tensor)
            seen.add(name)
        if missing := sorted(set(params) - seen):
            raise KeyError(f"weights for {len(missing)} parameters were not sent, e.g. {missing[:3]}")
        return len(seen)

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        sampling: SamplingParams,
        seeds: Sequence[int] | None = None,
    ) -> GenerationOutput:
        """`seeds` (one per prompt): layout-independent sampling (`sample_tokens`); None: process RNG.

        Ragged (`self.ragged`), continuous batching over the static cache's rows (hpcrl.rollout.cache_slots):
        at most `max_rows` sequences decode at once; a row that samples EOS leaves and a waiting prompt
        takes its place at the next step; prompts prefill in length buckets, each over its own columns
        (`prefill_buckets`). A long-tailed batch thus costs its total tokens, not rows x its longest prompt
        and response. With seeds, every row's samples are the ones it draws in the static batch (its noise
        depends on (seed, position) only). Static (`ragged` False): one padded prefill of every prompt,
        every row decoded until the last one finishes."""
        from megatron.core.inference.contexts import StaticInferenceContext

        if empty := [i for i, ids in enumerate(prompt_ids) if not len(ids)]:
            raise ValueError(f"prompts {empty[:5]} are empty: a row needs a token to attend to")
        input_ids_BP, keep_BP = left_pad(prompt_ids, self.pad_id)
        B, P = input_ids_BP.shape
        T = sampling.max_new_tokens
        at_once = min(B, self.max_rows or B) if self.ragged else B
        slots = CacheSlots.empty(StaticInferenceContext(at_once, P + T), P + T, P, self.device)
        waiting = deque(range(B))
        tokens_BT = torch.full((B, T), self.pad_id, dtype=torch.long)
        logprobs_BT = torch.zeros(B, T)
        seeds_B = None if seeds is None else torch.tensor(list(seeds), dtype=torch.long)
        logits_AV = self._admit(slots, waiting, input_ids_BP, keep_BP)
        done_A = torch.zeros(len(slots), dtype=torch.bool)  # static batch (all rows, never dropped): finished
        while len(slots):
            seeds_A = None if seeds_B is None else seeds_B[slots.rows_A]
            tokens_A, logprobs_A = self._sample(logits_AV, sampling, seeds_A, slots.positions_A, len(slots))
            tokens_BT[slots.rows_A, slots.positions_A] = tokens_A
            logprobs_BT[slots.rows_A, slots.positions_A] = logprobs_A
            slots.pending_A, slots.positions_A = tokens_A, slots.positions_A + 1
            finished_A = (tokens_A == self.eos_id) | (slots.positions_A == T)
            if self.ragged:
                slots.drop(finished_A)
            else:
                done_A |= finished_A
                if bool(done_A.all()):
                    break
            parts = [self._decode(slots, P)] if len(slots) else []
            parts.append(self._admit(slots, waiting, input_ids_BP, keep_BP))
            parts = [part for part in parts if part is not None]
            logits_AV = torch.cat(parts) if parts else None
        mask_BT = response_mask_from_eos(tokens_BT, self.eos_id)
        return GenerationOutput(
            tokens_BT.masked_fill(mask_BT == 0, self.pad_id), mask_BT, logprobs_BT * mask_BT
        )

    def _decode(self, slots: CacheSlots, longest_prompt: int) -> torch.Tensor | None:
        """One decode step of every slot's pending token at the shared column."""
        slots.shift(keep_columns=longest_prompt)
        context = slots.context
        context.enable_decode_mode()
        context.batch_size_offset, context.sequence_len_offset = 0, slots.column
        mask = slots.decode_mask()
        logits = self._forward(slots.pending_A[:, None].to(self.device), mask, context)
        slots.column += 1
        return logits

    def _admit(self, slots: CacheSlots, waiting: deque, input_ids_BP: torch.Tensor, keep_BP: torch.Tensor):
        """Prefill waiting prompts into the free slots, each ending at the shared column (the column its
        first token will be written at); returns their logits [k, V] in slot order (None: none admitted,
        or not the last stage). Ragged: one forward per length bucket over its own columns (megatron's
        static context writes a bucket at rows batch_size_offset.. and columns sequence_len_offset..)."""
        free = slots.context.max_batch_size - len(slots)
        rows = [waiting.popleft() for _ in range(min(free, len(waiting)))]
        if not rows:
            return None
        end, first_slot = slots.column, len(slots)
        lengths = keep_BP[rows].sum(dim=1).tolist()
        order = sorted(range(len(rows)), key=lambda i: (lengths[i], rows[i]))
        buckets = prefill_buckets([lengths[i] for i in order]) if self.ragged else [(0, len(rows))]
        slots.add([rows[i] for i in order], [lengths[i] for i in order])
        keep_kE = slots.keep_AC[first_slot:, :end]
        causal_EE = torch.ones(end, end, dtype=torch.bool, device=self.device).tril()
        context = slots.context
        context.enable_prefill_mode()
        parts = []
        # a first forward allocates the cache (torch.empty) and writes all columns [0, end) of its rows;
        # the rows it did not write are then zeroed: a bucket reads its rows' earlier columns, masked
        # (softmax weight 0), but 0 x NaN garbage would still be NaN
        for first, stop in reversed(buckets):
            allocated = bool(context.key_value_memory_dict)
            # the allocating forward covers every column it reads, [0, end): nothing unwritten is read
            width = max(lengths[i] for i in order[first:stop]) if allocated else end
            batch_rows = torch.tensor([rows[i] for i in order[first:stop]])
            context.batch_size_offset = first_slot + first
            context.sequence_len_offset = end - width
            allowed = causal_EE[end - width :][None] & keep_kE[first:stop, None, :]  # [k, width, end]
            ids = input_ids_BP[batch_rows, input_ids_BP.shape[1] - width :].to(self.device)
            parts.append(self._forward(ids, ~allowed[:, None], context))
            if not allocated:
                _zero_unwritten(
                    context, rows=(first_slot + first, first_slot + stop), columns=(end - width, end)
                )
        return None if parts[0] is None else torch.cat(parts[::-1])

    def _forward(self, ids_BS: torch.Tensor, mask: torch.Tensor, context) -> torch.Tensor | None:
        """One forward of S new tokens through this rank's stage; the last stage returns [B, V/t_g]."""
        g = self.groups
        B, S = ids_BS.shape
        if not g.is_first_stage:
            hidden_SBH = torch.empty(S, B, self.cfg.hidden_size, dtype=self.dtype, device=self.device)
            dist.recv(hidden_SBH, g.rank_of(g.tp_rank, g.pp_rank - 1, g.dp_rank))
            self.model.set_input_tensor(hidden_SBH)
        start = context.sequence_len_offset
        positions_BS = torch.arange(start, start + S, device=self.device).expand(B, S)
        # runtime_gather_output: megatron all-gathers the vocab shards over the generation TP group
        out = self.model(ids_BS, positions_BS, mask, inference_context=context, runtime_gather_output=True)
        context.increment_sequence_len_offset(S)
        if not g.is_last_stage:
            dist.send(out.contiguous(), g.rank_of(g.tp_rank, g.pp_rank + 1, g.dp_rank))
            return None
        return out[:, -1]  # static batching keeps only the last position's logits: [B, 1, V] -> [B, V]

    def _sample(self, logits_BV, sampling: SamplingParams, seeds_B, position, B: int):
        """Sample on the last stage's TP rank 0; every rank of the replica gets (tokens_B, logprobs_B)."""
        g = self.groups
        packed_B2 = torch.zeros(B, 2, dtype=torch.float64, device=self.device)  # token ids exact in f64
        if logits_BV is not None and g.tp_rank == 0:
            tokens_B, logp_B = sample_tokens(logits_BV, sampling, seeds_B, position)
            packed_B2[:, 0], packed_B2[:, 1] = tokens_B.double(), logp_B.double()
        if g.tensor * g.pipeline > 1:
            dist.broadcast(packed_B2, g.rank_of(0, g.pipeline - 1, g.dp_rank), group=g.mp)
        packed_B2 = packed_B2.cpu()
        return packed_B2[:, 0].long(), packed_B2[:, 1].float()


PREFILL_BUCKETS = 4
"""Prefill forwards at most (each a fixed cost); 4 cut a uniform 1..48 spread's padding from 49 % to 18 %."""


def prefill_buckets(sorted_lengths: Sequence[int], buckets: int = PREFILL_BUCKETS) -> list[tuple[int, int]]:
    """[first, stop) ranges of ascending `sorted_lengths`, at most `buckets` of them, minimising the
    prefill's computed tokens sum(rows x longest). Rows of one length always share a group, so this is
    an optimal partition of the m distinct lengths into contiguous groups (a group costs its rows x its
    last, longest, length): dynamic programming, O(buckets m^2), m <= the longest prompt."""
    values = sorted(set(sorted_lengths))
    if not values:
        return []
    rows_upto = [0]  # rows_upto[i]: rows with one of the first i distinct lengths
    for v in values:
        rows_upto.append(rows_upto[-1] + sum(1 for x in sorted_lengths if x == v))
    m, inf = len(values), float("inf")
    cost = [[0.0] + [inf] * m] + [[inf] * (m + 1) for _ in range(buckets)]
    cut = [[0] * (m + 1) for _ in range(buckets + 1)]
    for k in range(1, buckets + 1):
        for i in range(1, m + 1):
            for j in range(k - 1, i):
                c = cost[k - 1][j] + (rows_upto[i] - rows_upto[j]) * values[i - 1]
                if c < cost[k][i]:
                    cost[k][i], cut[k][i] = c, j
    k = min(range(1, min(buckets, m) + 1), key=lambda k: (cost[k][m], k))  # fewest among the cheapest
    out, i = [], m
    while i > 0:
        out.append((rows_upto[cut[k][i]], rows_upto[i]))
        i, k = cut[k][i], k - 1
    return out[::-1]


def _zero_unwritten(context, rows: tuple[int, int], columns: tuple[int, int]) -> None:
    """Zero every layer's freshly allocated cache except rows x columns, which the first forward wrote."""
    for keys, values in context.key_value_memory_dict.values():
        for cache in (keys, values):
            written = cache[columns[0] : columns[1], rows[0] : rows[1]].clone()
            cache.zero_()
            cache[columns[0] : columns[1], rows[0] : rows[1]] = written
