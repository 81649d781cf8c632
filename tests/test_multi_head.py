"""§3.2.2-3.2.3: multi-head attention, its masks, and the incremental key/value cache (aiayn.multi_head)."""

import pytest
import torch

from aiayn.attention import padding_mask, subsequent_mask
from aiayn.multi_head import MultiHeadAttention


def layer(d_model=32, h=4, seed=0, **kw):
    torch.manual_seed(seed)
    return MultiHeadAttention(d_model, h, **kw).eval()


def test_shapes_and_weights():
    mha = layer()
    q, kv = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    out, w = mha(q, kv, kv, need_weights=True)
    assert out.shape == (2, 5, 32)
    assert w.shape == (2, 4, 5, 7)
    out_fast, none = mha(q, kv, kv)
    assert none is None
    torch.testing.assert_close(out_fast, out, rtol=0, atol=1e-6)


def test_default_d_k_and_parameter_count_of_the_base_model():
    mha = MultiHeadAttention(512, 8)
    assert mha.d_k == 64 and mha.h == 8
    assert sum(p.numel() for p in mha.parameters()) == 4 * 512 * 512 + 4 * 512 == 1_050_624


def test_explicit_d_k():
    mha = MultiHeadAttention(10, 3, d_k=4)
    assert mha.W_Q.weight.shape == (12, 10) and mha.W_O.weight.shape == (10, 12)
    assert sum(p.numel() for p in mha.parameters()) == 3 * (10 * 12 + 12) + (12 * 10 + 10)
    x = torch.randn(2, 5, 10)
    assert mha(x, x, x)[0].shape == (2, 5, 10)


def test_d_model_not_divisible_by_h_raises():
    with pytest.raises(ValueError, match=r"d_model=10 is not divisible by h=3"):
        MultiHeadAttention(10, 3)


@pytest.mark.parametrize(
    "kwargs, word",
    [
        (dict(d_model=0, h=1), "d_model"),
        (dict(d_model=8, h=0), "h"),
        (dict(d_model=8, h=2, d_k=-1), "d_k"),
        (dict(d_model=8, h=2, P_drop=1.0), "P_drop"),
        (dict(d_model=8, h=2, P_drop=-0.1), "P_drop"),
    ],
)
def test_bad_sizes_raise(kwargs, word):
    with pytest.raises(ValueError, match=word):
        MultiHeadAttention(**kwargs)


def test_per_head_weights_sum_to_one_on_unmasked_rows():
    mha = layer()
    tokens = torch.tensor([[3, 4, 5, 6, 7, 8], [3, 4, 5, 0, 0, 0]])
    x = torch.randn(2, 6, 32)
    mask = subsequent_mask(6) & padding_mask(tokens, 0)
    _, w = mha(x, x, x, mask, need_weights=True)  # (2, 4, 6, 6)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 6), rtol=0, atol=1e-6)
    assert torch.all(w.masked_select(~mask.expand_as(w)) == 0)


def test_no_attention_to_padding():
    mha = layer()
    tokens = torch.tensor([[3, 4, 5, 6, 7], [3, 4, 0, 0, 0]])
    q, kv = torch.randn(2, 4, 32), torch.randn(2, 5, 32)
    mask = padding_mask(tokens, 0)
    out, _ = mha(q, kv, kv, mask)
    kv2 = kv.clone()
    kv2[tokens == 0] = torch.randn(3, 32) * 100
    out2, _ = mha(q, kv2, kv2, mask)
    torch.testing.assert_close(out2, out, rtol=0, atol=1e-5)


def test_no_look_ahead_in_masked_self_attention():
    mha = layer()
    x = torch.randn(1, 6, 32)
    out, _ = mha(x, x, x, subsequent_mask(6))
    x2 = x.clone()
    x2[:, 4] += 10.0  # change position 4
    out2, _ = mha(x2, x2, x2, subsequent_mask(6))
    assert torch.equal(out2[:, :4], out[:, :4])
    assert not torch.allclose(out2[:, 4:], out[:, 4:])


def test_cache_gives_the_outputs_of_full_recomputation():
    torch.manual_seed(1)
    self_attn, cross_attn = MultiHeadAttention(32, 4).eval(), MultiHeadAttention(32, 4).eval()
    x, memory = torch.randn(2, 7, 32), torch.randn(2, 9, 32)
    src_mask = padding_mask(torch.tensor([[1] * 9, [1] * 5 + [0] * 4]), 0)
    y, _ = self_attn(x, x, x, subsequent_mask(7))
    full, w_full = cross_attn(y, memory, memory, src_mask, need_weights=True)
    self_cache, cross_cache, outs = {}, {}, []
    for t in range(7):
        x_t = x[:, t : t + 1]
        y_t, _ = self_attn(x_t, x_t, x_t, cache=self_cache)
        assert self_cache["k"].shape == (2, 4, t + 1, 8)
        z_t, w_t = cross_attn(y_t, memory, memory, src_mask, cache=cross_cache, static_kv=True, need_weights=True)
        assert cross_cache["k"].shape == (2, 4, 9, 8)
        torch.testing.assert_close(w_t[:, :, 0], w_full[:, :, t], rtol=0, atol=1e-6)
        outs.append(z_t)
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=0, atol=1e-6)


def test_static_kv_cache_projects_the_memory_once():
    mha = layer()
    memory, q = torch.randn(2, 5, 32), torch.randn(2, 1, 32)
    cache = {}
    first, _ = mha(q, memory, memory, cache=cache, static_kv=True)
    k = cache["k"]
    second, _ = mha(q, torch.full_like(memory, float("nan")), None, cache=cache, static_kv=True)  # key ignored
    assert cache["k"] is k
    assert torch.equal(first, second)


def test_dropout_only_in_training():
    mha = MultiHeadAttention(16, 2, P_drop=0.5)
    x = torch.randn(1, 4, 16)
    mha.eval()
    assert torch.equal(mha(x, x, x)[0], mha(x, x, x)[0])
    mha.train()
    torch.manual_seed(0)
    a = mha(x, x, x)[0]
    torch.manual_seed(1)
    b = mha(x, x, x)[0]
    assert not torch.allclose(a, b)
