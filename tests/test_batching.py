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
