"""Token-budget batches and collate of §5.1."""

import random

import pytest
import torch

from aiayn.batching import collate, example_lengths, padded_tokens, padding_fraction, token_batches


@pytest.fixture(scope="module")
def lengths():
    rng = random.Random(1)
    return [(rng.randint(2, 40), rng.randint(2, 45)) for _ in range(2000)]


@pytest.mark.parametrize("max_tokens", [90, 500, 2048, 10_000])
def test_budget_and_each_example_once(lengths, max_tokens):
    batches = token_batches(lengths, max_tokens, seed=3)
    assert all(padded_tokens(b, lengths) <= max_tokens for b in batches)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert all(len(b) > 0 for b in batches)


def test_padded_tokens_counts_both_sides():
    lengths = [(3, 5), (4, 2), (1, 1)]
    assert padded_tokens([0, 1], lengths) == 2 * 4 + 2 * 5
    assert padding_fraction([[0, 1]], lengths) == pytest.approx(1 - 14 / 18)
    assert padding_fraction([[0], [1], [2]], lengths) == 0.0


def test_deterministic_with_seed(lengths):
    assert token_batches(lengths, 2048, seed=7) == token_batches(lengths, 2048, seed=7)
    assert token_batches(lengths, 2048, seed=7) != token_batches(lengths, 2048, seed=8)


def test_no_shuffle_is_sorted(lengths):
    batches = token_batches(lengths, 2048, shuffle=False)
    order = [i for b in batches for i in b]
    keys = [(max(lengths[i]), lengths[i]) for i in order]
    assert keys == sorted(keys)
    assert order == sorted(range(len(lengths)), key=lambda i: (max(lengths[i]), lengths[i]))


def test_batches_are_greedy_full():
    lengths = [(5, 5)] * 10  # each pair costs 10 padded tokens
    assert token_batches(lengths, 30, shuffle=False) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]


def test_too_long_example_raises():
    with pytest.raises(ValueError, match="example 1 has 60 source \\+ 50 target tokens"):
        token_batches([(3, 3), (60, 50)], 100)
    assert token_batches([(50, 50)], 100) == [[0]]


def test_example_lengths_add_eos_bos():
    assert example_lengths([([5, 6], [7]), ([], [8, 9, 10])]) == [(3, 2), (1, 4)]


def test_collate_shapes_and_specials():
    batch = [([10, 11, 12], [20, 21]), ([13], [22, 23, 24, 25])]
    src, tgt_in, tgt_out = collate(batch)
    assert src.shape == (2, 4) and tgt_in.shape == (2, 5) and tgt_out.shape == (2, 5)
    assert src.dtype == tgt_in.dtype == tgt_out.dtype == torch.long
    assert src.tolist() == [[10, 11, 12, 2], [13, 2, 0, 0]]
    assert tgt_in.tolist() == [[1, 20, 21, 0, 0], [1, 22, 23, 24, 25]]
    assert tgt_out.tolist() == [[20, 21, 2, 0, 0], [22, 23, 24, 25, 2]]
    # teacher forcing: the decoder's output at t is its input at t + 1
    real = tgt_in[:, 1:] != 0
    assert torch.equal(tgt_in[:, 1:][real], tgt_out[:, :-1][real])


def test_collate_custom_ids_and_empty_target():
    src, tgt_in, tgt_out = collate([([7], [])], pad_id=9, bos_id=5, eos_id=6)
    assert src.tolist() == [[7, 6]] and tgt_in.tolist() == [[5]] and tgt_out.tolist() == [[6]]
    with pytest.raises(ValueError):
        collate([])


def test_collated_size_matches_budget(lengths):
    pairs = [([4] * (s - 1), [5] * (t - 1)) for s, t in lengths]
    assert example_lengths(pairs) == lengths
    for b in token_batches(lengths, 1000, seed=0)[:20]:
        src, tgt_in, _ = collate([pairs[i] for i in b])
        assert src.numel() + tgt_in.numel() == padded_tokens(b, lengths) <= 1000


# --- EpochBatches: built once, reordered every epoch -------------------------------------------------------------


@pytest.fixture(scope="module")
def pairs():
    rng = random.Random(2)
    return [
        (
            [rng.randint(4, 99) for _ in range(rng.randint(1, 30))],
            [rng.randint(4, 99) for _ in range(rng.randint(1, 35))],
        )
        for _ in range(1500)
    ]


def test_epoch_batches_unshuffled_equal_token_batches_and_collate(pairs):
    from aiayn.batching import EpochBatches

    ours = EpochBatches(pairs, 700, shuffle=False)(0)
    theirs = [collate([pairs[i] for i in b]) for b in token_batches(example_lengths(pairs), 700, shuffle=False)]
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
        assert a.tokens == int((b[2] != 0).sum())


@pytest.mark.parametrize("pad_multiple", [1, 8])
def test_epoch_batches_hold_every_pair_once_within_the_budget(pairs, pad_multiple):
    from aiayn.batching import EpochBatches

    batches = EpochBatches(pairs, 700, seed=5, pad_multiple=pad_multiple)
    seen = []
    for epoch in range(3):
        epoch_batches = batches(epoch)
        assert len(epoch_batches) == len(batches)
        rows = []
        for src, tgt_in, tgt_out in epoch_batches:
            assert src.numel() + tgt_in.numel() <= 700
            assert src.size(1) % pad_multiple == 0 and tgt_in.size(1) % pad_multiple == 0
            for s, t in zip(src.tolist(), tgt_out.tolist()):
                s, t = [i for i in s if i], [i for i in t if i]
                rows.append((tuple(s[:-1]), tuple(t[:-1])))  # without </s>
        assert sorted(rows) == sorted((tuple(s), tuple(t)) for s, t in pairs)
        assert all(b.tokens == int((b[2] != 0).sum()) for b in epoch_batches)
        seen.append([b[0].tolist() for b in epoch_batches])
    assert seen[0] != seen[1] != seen[2]  # a new order every epoch
    assert [b[0].tolist() for b in batches(1)] == seen[1]  # and the same order for the same epoch


def test_epoch_batches_keep_widths_and_mix_equal_lengths(pairs):
    """Reordering only swaps pairs of equal lengths: each batch keeps its size and width, but not its pairs."""
    from aiayn.batching import EpochBatches

    batches = EpochBatches(pairs, 700, seed=0)
    shapes = lambda epoch: sorted(tuple(t.shape for t in b) for b in batches(epoch))  # noqa: E731
    assert shapes(0) == shapes(1)
    contents = lambda epoch: sorted(b[0].tolist() for b in batches(epoch))  # noqa: E731
    assert contents(0) != contents(1)


def test_epoch_batches_refuse_empty_and_oversized_input():
    from aiayn.batching import EpochBatches

    with pytest.raises(ValueError, match="at least one"):
        EpochBatches([], 100)
    with pytest.raises(ValueError, match="raise max_tokens"):
        EpochBatches([([5] * 60, [6] * 60)], 100)


def test_batch_moves_with_its_token_count():
    from aiayn.batching import Batch

    batch = Batch(
        torch.ones(2, 3, dtype=torch.long), torch.ones(2, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.long), 8
    )
    moved = batch.to("cpu")
    src, tgt_in, tgt_out = moved
    assert moved.tokens == 8 and src.shape == (2, 3) and isinstance(moved, tuple)
