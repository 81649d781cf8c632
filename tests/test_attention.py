"""§3.2.1: scaled dot-product attention, its masks, and the fast path (aiayn.attention)."""

import math

import pytest
import torch

from aiayn.attention import attend, attention, padding_mask, subsequent_mask


def qkv(batch=2, h=3, len_q=5, len_k=7, d_k=8, d_v=4, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(batch, h, n, d, generator=g, requires_grad=requires_grad)
        for n, d in [(len_q, d_k), (len_k, d_k), (len_k, d_v)]
    )


def test_shapes():
    q, k, v = qkv()
    out, weights = attention(q, k, v)
    assert out.shape == (2, 3, 5, 4)
    assert weights.shape == (2, 3, 5, 7)
    fast, none = attend(q, k, v)
    assert fast.shape == (2, 3, 5, 4) and none is None
    out2, w2 = attend(q, k, v, need_weights=True)
    assert torch.equal(out2, out) and torch.equal(w2, weights)


def test_equation_1_by_hand():
    q, k, v = qkv()
    expected = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8), dim=-1) @ v
    torch.testing.assert_close(attention(q, k, v)[0], expected, rtol=0, atol=1e-6)


def test_subsequent_mask_rows():
    assert subsequent_mask(4).tolist() == [
        [True, False, False, False],
        [True, True, False, False],
        [True, True, True, False],
        [True, True, True, True],
    ]
    m = subsequent_mask(6)
    assert m.dtype == torch.bool and m.shape == (6, 6)
    for i in range(6):
        assert m[i].sum().item() == i + 1


def test_padding_mask():
    tokens = torch.tensor([[5, 6, 7, 0], [8, 0, 0, 0]])
    m = padding_mask(tokens, pad_id=0)
    assert m.shape == (2, 1, 1, 4) and m.dtype == torch.bool
    assert m[:, 0, 0].tolist() == [[True, True, True, False], [True, False, False, False]]


def test_causal_weights_are_zero_above_the_diagonal():
    q, k, v = qkv(len_q=6, len_k=6)
    _, w = attention(q, k, v, subsequent_mask(6))
    assert torch.all(w.masked_select(~subsequent_mask(6).expand_as(w)) == 0)
    assert torch.all(w[..., 0, 0] == 1)  # the first position sees only itself


@pytest.mark.parametrize("path", ["explicit", "fast"])
def test_no_attention_to_padding(path):
    q, k, v = qkv(len_k=6)
    tokens = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0]])
    mask = padding_mask(tokens, 0)
    fn = attention if path == "explicit" else attend
    out = fn(q, k, v, mask)[0]
    k2, v2 = k.clone(), v.clone()
    pad = (tokens == 0)[:, None, :]  # (batch, 1, len_k) over heads
    k2[pad.expand(2, 3, 6)] = 1e4
    v2[pad.expand(2, 3, 6)] = -1e4
    torch.testing.assert_close(fn(q, k2, v2, mask)[0], out, rtol=0, atol=1e-6)
    _, w = attention(q, k, v, mask)
    assert torch.all(w[0, :, :, 4:] == 0) and torch.all(w[1, :, :, 2:] == 0)


def _masks(len_q=5, len_k=7):
    tokens = torch.tensor([[1] * 7, [1] * 3 + [0] * 4])
    empty_row = torch.ones(len_q, len_k, dtype=torch.bool)
    empty_row[2] = False
    return {
        "none": None,
        "padding": padding_mask(tokens, 0),
        "causal": subsequent_mask(7)[:len_q],
        "causal&padding": subsequent_mask(7)[:len_q] & padding_mask(tokens, 0),
        "all padding": padding_mask(torch.zeros(2, 7, dtype=torch.long), 0),
        "one empty row": empty_row,
    }


@pytest.mark.parametrize("name", list(_masks()))
def test_fast_path_equals_explicit(name):
    mask = _masks()[name]
    q, k, v = qkv()
    explicit, _ = attention(q, k, v, mask)
    fast, _ = attend(q, k, v, mask)
    assert explicit.dtype == torch.float32
    torch.testing.assert_close(fast, explicit, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", list(_masks()))
def test_attend_written_out_is_the_explicit_formula_without_weights(name):
    mask = _masks()[name]
    q, k, v = qkv()
    explicit, _ = attention(q, k, v, mask)
    written, weights = attend(q, k, v, mask, fused=False)
    assert weights is None
    torch.testing.assert_close(written, explicit, rtol=0, atol=0)
    _, wanted = attend(q, k, v, mask, need_weights=True, fused=False)
    torch.testing.assert_close(wanted, attention(q, k, v, mask)[1], rtol=0, atol=0)


def test_the_two_routes_agree_under_bf16_autocast():
    """Under a CPU's bf16 autocast, as --recipe cpu-fast trains, Equation (1) written out (its softmax asked for in
    fp32) and the fused kernel agree with the fp32 result to bf16 rounding."""
    q, k, v = qkv()
    mask = subsequent_mask(k.size(-2))[: q.size(-2)]
    exact, _ = attention(q, k, v, mask)
    q, k, v = (x.to(torch.bfloat16) for x in (q, k, v))  # as the projections hand them over under autocast
    with torch.autocast("cpu", torch.bfloat16):
        written, _ = attend(q, k, v, mask, fused=False)
        fused, _ = attend(q, k, v, mask)
    for out in (written, fused):
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(out.float(), exact, rtol=0, atol=0.03)


@pytest.mark.parametrize("path", ["explicit", "fast"])
def test_fully_masked_rows_are_zero_and_finite_with_finite_gradients(path):
    q, k, v = qkv(requires_grad=True)
    mask = _masks()["one empty row"]
    fn = attention if path == "explicit" else attend
    out = fn(q, k, v, mask)[0]
    assert torch.all(out[..., 2, :] == 0)
    assert out.isfinite().all()
    (out * torch.randn_like(out)).sum().backward()
    for t in (q, k, v):
        assert t.grad.isfinite().all()
    assert torch.all(q.grad[..., 2, :] == 0)


@pytest.mark.parametrize("path", ["explicit", "fast"])
def test_all_padding_sentence_gives_zero_output(path):
    q, k, v = qkv(requires_grad=True)
    mask = padding_mask(torch.tensor([[1] * 7, [0] * 7]), 0)
    fn = attention if path == "explicit" else attend
    out = fn(q, k, v, mask)[0]
    assert torch.all(out[1] == 0) and out.isfinite().all()
    out.sum().backward()
    assert all(t.grad.isfinite().all() for t in (q, k, v))


def test_weights_sum_to_one_on_unmasked_rows_and_zero_on_empty_rows():
    q, k, v = qkv()
    _, w = attention(q, k, v, _masks()["one empty row"])
    sums = w.sum(-1)  # (batch, h, len_q)
    torch.testing.assert_close(sums[..., [0, 1, 3, 4]], torch.ones(2, 3, 4), rtol=0, atol=1e-6)
    assert torch.all(sums[..., 2] == 0)


def test_non_boolean_mask_is_rejected():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="boolean"):
        attention(q, k, v, torch.ones(5, 7))
    with pytest.raises(TypeError, match="boolean"):
        attend(q, k, v, torch.ones(5, 7))
