# Generated from book/09_data.ipynb by `python -m aiayn._export`. Edit the chapter, not this file.

"""Batches for §5.1: sentence pairs of similar length share a batch whose padded size stays within a token budget."""
from __future__ import annotations

import random
from typing import Sequence

import torch
from torch import Tensor


def example_lengths(pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[tuple[int, int]]:
    """(source, target) lengths as `collate` makes them: each side gains one token (EOS, or BOS)."""
    return [(len(src) + 1, len(tgt) + 1) for src, tgt in pairs]


def padded_tokens(batch: Sequence[int], lengths: Sequence[tuple[int, int]]) -> int:
    """Size of a batch's two padded tensors, padding included: n·max(src) + n·max(tgt)."""
    n = len(batch)
    return n * max(lengths[i][0] for i in batch) + n * max(lengths[i][1] for i in batch)


def padding_fraction(batches: Sequence[Sequence[int]], lengths: Sequence[tuple[int, int]]) -> float:
    """Share of all padded source and target positions that hold padding rather than tokens."""
    real = sum(lengths[i][0] + lengths[i][1] for batch in batches for i in batch)
    return 1 - real / sum(padded_tokens(batch, lengths) for batch in batches)


def token_batches(lengths: Sequence[tuple[int, int]], max_tokens: int, shuffle: bool = True,
                  seed: int = 0) -> list[list[int]]:
    """Indices grouped into batches of similar length whose padded source + target tokens, n·max(src) + n·max(tgt),
    stay within `max_tokens` (§5.1); with `shuffle` the batch order is random and equal lengths are mixed."""
    rng = random.Random(seed)
    order = list(range(len(lengths)))
    if shuffle:
        rng.shuffle(order)  # examples of equal length meet different partners each epoch
    order.sort(key=lambda i: (max(lengths[i]), lengths[i]))  # stable; the longer side first keeps both maxima low
    batches, batch, max_src, max_tgt = [], [], 0, 0
    for i in order:
        src, tgt = lengths[i]
        if src + tgt > max_tokens:
            raise ValueError(f"example {i} has {src} source + {tgt} target tokens, more than max_tokens={max_tokens} "
                             f"on its own; raise max_tokens or drop examples that long")
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


def collate(batch: list[tuple[list[int], list[int]]], pad_id: int = 0, bos_id: int = 1,
            eos_id: int = 2) -> tuple[Tensor, Tensor, Tensor]:
    """Pad (source ids, target ids) pairs into src = x + EOS, tgt_in = BOS + y, tgt_out = y + EOS (teacher forcing)."""
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
