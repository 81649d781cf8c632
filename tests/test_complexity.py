"""§4, Table 1: FLOP counts equal their closed forms exactly, and gradients show the maximum path length."""

import math

import pytest
import torch

from aiayn.attention import attention
from aiayn.complexity import (
    RestrictedSelfAttention,
    OpsAndMemory,
    count_flops,
    exact_flops,
    gradient_reach,
    layers_needed,
    make_layers,
    measure,
    measure_layers,
    stack,
)

CASES = [(1, 1, 1, 1, 1), (1, 7, 6, 3, 3), (2, 10, 16, 5, 5), (3, 33, 8, 7, 9), (2, 5, 12, 9, 11)]  # b, n, d, k, r
KINDS = ["self-attention", "recurrent", "convolutional", "separable", "restricted"]


@pytest.mark.parametrize("b,n,d,k,r", CASES)
def test_flop_counter_equals_closed_form(b, n, d, k, r):
    torch.manual_seed(0)
    x = torch.randn(b, n, d)
    layers = make_layers(d, k, r)
    assert list(layers) == KINDS
    for kind, layer in layers.items():
        assert count_flops(layer, x) == exact_flops(kind, b, n, d, k, r), kind


def test_closed_forms_by_hand():
    assert exact_flops("self-attention", 1, 512, 512) == exact_flops("recurrent", 1, 512, 512) == 4 * 512**3
    assert exact_flops("convolutional", 2, 10, 16, k=5) == 2 * 2 * 5 * 10 * 16 * 16 == 51_200
    assert exact_flops("separable", 1, 7, 6, k=3) == 2 * 3 * 7 * 6 + 2 * 7 * 36 == 756
    assert exact_flops("restricted", 1, 7, 6, r=3) == 4 * 3 * 7 * 6 == 504
    with pytest.raises(ValueError, match="unknown layer type"):
        exact_flops("lstm", 1, 2, 3)


def test_flops_on_meta_device_and_dilation():
    """Counting on the meta device (no arithmetic) gives the same numbers; dilation does not change a
    convolution's count."""
    x = torch.empty(1, 4096, 64, device="meta")
    for kind, layer in make_layers(64, 3, 33).items():
        assert count_flops(layer.to("meta"), x) == exact_flops(kind, 1, 4096, 64, 3, 33), kind
    x = torch.randn(2, 20, 8)
    assert count_flops(stack("dilated", 3, 8), x) == 3 * exact_flops("convolutional", 2, 20, 8, k=3)


def test_layers_keep_shape_and_restricted_is_banded_attention():
    torch.manual_seed(0)
    n, d, r = 9, 8, 5
    x = torch.randn(3, n, d)
    for layer in make_layers(d, 3, r).values():
        assert layer(x).shape == (3, n, d)
    i = torch.arange(n)
    band = (i[:, None] - i[None, :]).abs() <= (r - 1) // 2
    torch.testing.assert_close(RestrictedSelfAttention(r)(x), attention(x, x, x, band)[0])
    torch.testing.assert_close(RestrictedSelfAttention(2 * n + 1)(x), attention(x, x, x)[0])  # a window over all
    with pytest.raises(ValueError, match="odd"):
        RestrictedSelfAttention(4)


def test_operation_counts():
    """Sequential operations: 5n + 6 for the recurrent layer, a constant for every other layer."""
    d = 8
    for kind, layer in make_layers(d).items():
        ops = [measure(layer, n, d, repeats=1)["ops"] for n in (4, 8, 16)]
        if kind == "recurrent":
            assert ops == [5 * n + 6 for n in (4, 8, 16)]
        else:
            assert len(set(ops)) == 1, kind


def test_peak_memory_of_self_attention():
    """Scores and weights, two (batch, n, n) float32 arrays, are alive at once, plus the (batch, n, d) output."""
    b, n, d = 2, 64, 8
    x = torch.randn(b, n, d)  # made outside: not counted
    with torch.no_grad(), OpsAndMemory() as counter:
        make_layers(d)["self-attention"](x)
    assert counter.peak == 4 * (2 * b * n * n + b * n * d)


def test_measure_layers_report():
    results = measure_layers([8, 16], d=8, k=3, r=3, repeats=1)
    assert list(results) == KINDS
    for rows in results.values():
        assert [m["n"] for m in rows] == [8, 16]
        assert all(m["seconds"] > 0 and m["peak_bytes"] > 0 and m["ops"] > 0 for m in rows)


@pytest.mark.parametrize(
    "kind,k,r,reach",
    [
        ("self-attention", 3, 5, [20, 20, 20]),
        ("convolutional", 3, 5, [1, 2, 3]),
        ("convolutional", 5, 5, [2, 4, 6]),
        ("restricted", 3, 5, [2, 4, 6]),
        ("restricted", 3, 7, [3, 6, 9]),
        ("dilated", 3, 5, [1, 4, 13]),
    ],
)
def test_path_length_zero_below_threshold_nonzero_at_it(kind, k, r, reach):
    n, d = 21, 4
    torch.manual_seed(0)
    for L, farthest in zip((1, 2, 3), reach):
        g = gradient_reach(stack(kind, L, d, k, r), n, d)
        assert (g[: farthest + 1] > 0).all() and (g[farthest + 1 :] == 0).all(), (kind, L)
        for j in range(n):
            assert (g[j] > 0) == (L >= layers_needed(kind, j, k, r)), (kind, L, j)


def test_layers_needed_formulas():
    assert [layers_needed("convolutional", j, k=3) for j in (0, 1, 2, 7)] == [1, 1, 2, 7]
    assert [layers_needed("convolutional", j, k=9) for j in (4, 5, 8, 9)] == [1, 2, 2, 3]
    assert [layers_needed("restricted", j, r=33) for j in (16, 17, 1000)] == [1, 2, math.ceil(1000 / 16)]
    assert [layers_needed("dilated", j, k=3) for j in (1, 2, 4, 5, 13, 14, 40, 41)] == [1, 2, 2, 3, 3, 4, 4, 5]
    assert layers_needed("self-attention", 10**6) == 1
    with pytest.raises(ValueError):
        layers_needed("recurrent", 3)


def test_recurrent_reads_left_to_right():
    """Output 0 of a recurrent layer depends on input 0 only; the last output depends on every input."""
    n, d = 10, 4
    torch.manual_seed(0)
    layer = stack("recurrent", 1, d)
    first, last = gradient_reach(layer, n, d, i=0), gradient_reach(layer, n, d, i=n - 1)
    assert first[0] > 0 and (first[1:] == 0).all()
    assert (last > 0).all()
