# Generated from book/09_data.ipynb by `python -m aiayn._export`. Edit the chapter, not this file.

# book/09_data.ipynb: Batching by a token budget
"""Batches for §5.1: sentence pairs of similar length share a batch whose
padded size stays within a token budget."""
from __future__ import annotations

import itertools
import random
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor


# book/09_data.ipynb: Batching by a token budget
def example_lengths(
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
) -> list[tuple[int, int]]:
    """(source, target) lengths as `collate` makes them: each side gains one
    token (EOS, or BOS)."""
    return [(len(src) + 1, len(tgt) + 1) for src, tgt in pairs]


def padded_tokens(
    batch: Sequence[int], lengths: Sequence[tuple[int, int]]
) -> int:
    """Size of a batch's two padded tensors, padding included:
    n·max(src) + n·max(tgt)."""
    n = len(batch)
    max_src = max(lengths[i][0] for i in batch)
    max_tgt = max(lengths[i][1] for i in batch)
    return n * max_src + n * max_tgt


def padding_fraction(
    batches: Sequence[Sequence[int]], lengths: Sequence[tuple[int, int]]
) -> float:
    """Share of all padded source and target positions that hold padding
    rather than tokens."""
    real = sum(
        lengths[i][0] + lengths[i][1] for batch in batches for i in batch
    )
    return 1 - real / sum(padded_tokens(batch, lengths) for batch in batches)


# book/09_data.ipynb: Batching by a token budget
def token_batches(
    lengths: Sequence[tuple[int, int]],
    max_tokens: int,
    shuffle: bool = True,
    seed: int = 0,
) -> list[list[int]]:
    """Indices grouped into batches of similar length whose padded source +
    target tokens, n·max(src) + n·max(tgt), stay within `max_tokens` (§5.1);
    with `shuffle` the batch order is random and equal lengths are mixed."""
    rng = random.Random(seed)
    order = list(range(len(lengths)))
    if shuffle:
        rng.shuffle(order)  # equal lengths meet new partners each epoch
    # stable; sorting by the longer side first keeps both maxima low
    order.sort(key=lambda i: (max(lengths[i]), lengths[i]))
    batches, batch, max_src, max_tgt = [], [], 0, 0
    for i in order:
        src, tgt = lengths[i]
        if src + tgt > max_tokens:
            raise ValueError(
                f"example {i} has {src} source + {tgt} target tokens, more "
                f"than max_tokens={max_tokens} on its own; raise max_tokens "
                "or drop examples that long"
            )
        new_src, new_tgt = max(max_src, src), max(max_tgt, tgt)
        if batch and (len(batch) + 1) * (new_src + new_tgt) > max_tokens:
            batches.append(batch)
            batch, new_src, new_tgt = [], src, tgt
        batch.append(i)
        max_src, max_tgt = new_src, new_tgt
    if batch:
        batches.append(batch)
    if shuffle:
        rng.shuffle(batches)
    return batches


# book/09_data.ipynb: Batching by a token budget
def collate(
    batch: list[tuple[list[int], list[int]]],
    pad_id: int = 0,
    bos_id: int = 1,
    eos_id: int = 2,
) -> tuple[Tensor, Tensor, Tensor]:
    """Pad (source ids, target ids) pairs into src = x + EOS,
    tgt_in = BOS + y, tgt_out = y + EOS (teacher forcing)."""
    if not batch:
        raise ValueError("collate needs at least one (source, target) pair")
    S = max(len(src) for src, _ in batch) + 1
    T = max(len(tgt) for _, tgt in batch) + 1
    src_t = torch.full((len(batch), S), pad_id, dtype=torch.long)  # (B, S)
    tgt_in = torch.full((len(batch), T), pad_id, dtype=torch.long)  # (B, T)
    tgt_out = torch.full((len(batch), T), pad_id, dtype=torch.long)  # (B, T)
    for b, (src, tgt) in enumerate(batch):
        src_t[b, : len(src) + 1] = torch.tensor([*src, eos_id])
        tgt_in[b, : len(tgt) + 1] = torch.tensor([bos_id, *tgt])
        tgt_out[b, : len(tgt) + 1] = torch.tensor([*tgt, eos_id])
    return src_t, tgt_in, tgt_out


# book/09_data.ipynb: Batches built once
class Batch(tuple):
    """A batch (src, tgt_in, tgt_out) that also knows its number of target
    tokens, counted when it was built."""

    def __new__(
        cls, src: Tensor, tgt_in: Tensor, tgt_out: Tensor, tokens: int
    ):
        batch = super().__new__(cls, (src, tgt_in, tgt_out))
        batch.tokens = tokens
        return batch

    def to(self, device, non_blocking: bool = False) -> "Batch":
        return Batch(
            *(t.to(device, non_blocking=non_blocking) for t in self),
            self.tokens,
        )


def round_up(n: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is at least n."""
    return -(-n // multiple) * multiple


class EpochBatches:
    """Token-budget batches (§5.1) for every epoch, built once; call it with
    the epoch number to get its Batches.

    The pairs are padded once, in the order of `token_batches` and cut at its
    boundaries. An epoch only reorders: pairs with equal (padded) lengths swap
    places at random, and the batches are shuffled.
    """

    def __init__(
        self,
        pairs,
        max_tokens: int,
        shuffle: bool = True,
        seed: int = 0,
        pad_multiple: int = 1,
        device=None,
        pad_id: int = 0,
        bos_id: int = 1,
        eos_id: int = 2,
    ):
        if not pairs:
            raise ValueError(
                "EpochBatches needs at least one (source, target) pair"
            )
        lengths = [
            (round_up(s, pad_multiple), round_up(t, pad_multiple))
            for s, t in example_lengths(pairs)
        ]
        # sorted by length, cut within the budget
        cut = token_batches(lengths, max_tokens, shuffle=False)
        order = [i for batch in cut for i in batch]
        self.sizes = [len(batch) for batch in cut]
        self.widths = [
            (
                max(lengths[i][0] for i in batch),
                max(lengths[i][1] for i in batch),
            )
            for batch in cut
        ]
        keys = [lengths[i] for i in order]
        new_key = [True] + [a != b for a, b in zip(keys, keys[1:])]
        self.group = torch.tensor(  # equal keys, equal id
            list(itertools.accumulate(new_key)), dtype=torch.float64
        )
        self.batch_of_row = torch.arange(len(cut)).repeat_interleave(
            torch.tensor(self.sizes)
        )
        src, tgt_in, tgt_out = collate(  # (n, S_max), (n, T_max)
            [pairs[i] for i in order], pad_id, bos_id, eos_id
        )
        self.target_tokens = (tgt_out != pad_id).sum(1)  # (n,), on the CPU
        # the widest batch, rounded up to pad_multiple
        S = max(w[0] for w in self.widths)
        T = max(w[1] for w in self.widths)
        self.tensors = tuple(
            F.pad(t, (0, width - t.size(1)), value=pad_id).to(device)
            for t, width in ((src, S), (tgt_in, T), (tgt_out, T))
        )
        self.shuffle, self.seed = shuffle, seed

    def __len__(self) -> int:
        return len(self.sizes)

    def __call__(self, epoch: int = 0) -> list[Batch]:
        n = len(self.group)
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + epoch)
            noise = torch.rand(n, generator=g, dtype=torch.float64)
            rows = torch.argsort(self.group + noise)  # mix equal keys
            batch_order = torch.randperm(len(self.sizes), generator=g).tolist()
        else:
            rows, batch_order = torch.arange(n), range(len(self.sizes))
        tokens = (
            torch.zeros(len(self.sizes), dtype=torch.long)
            .index_add_(0, self.batch_of_row, self.target_tokens[rows])
            .tolist()
        )
        on_device = rows.to(self.tensors[0].device)
        src, tgt_in, tgt_out = (
            t.index_select(0, on_device).split(self.sizes)
            for t in self.tensors
        )
        return [
            Batch(
                src[k][:, :S], tgt_in[k][:, :T], tgt_out[k][:, :T], tokens[k]
            )
            for k in batch_order
            for S, T in [self.widths[k]]
        ]
