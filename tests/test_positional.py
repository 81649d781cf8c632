"""§3.5: the sinusoidal encoding, its identities, and the layer."""

import math

import pytest
import torch

from aiayn.positional import PositionalEncoding, shift_matrix, sinusoidal_encoding


def test_shape_and_formula():
    pe = sinusoidal_encoding(50, 16)
    assert pe.shape == (50, 16) and pe.dtype == torch.float32
    for pos in (0, 7, 49):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-7)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-7)


def test_position_zero_and_norms():
    pe = sinusoidal_encoding(300, 512)
    assert torch.equal(pe[0, 0::2], torch.zeros(256)) and torch.equal(pe[0, 1::2], torch.ones(256))
    torch.testing.assert_close(pe.norm(dim=-1), torch.full((300,), 16.0))  # sqrt(d_model / 2)
    assert pe.abs().max() <= 1.0


def test_dot_product_depends_only_on_offset():
    d = 128
    pe = sinusoidal_encoding(400, d)
    k = torch.arange(100)
    omega = torch.exp(torch.arange(0, d, 2, dtype=torch.float64) * (-math.log(10000.0) / d))
    closed = torch.cos(k[:, None] * omega).sum(-1).float()  # sum_i cos(k omega_i)
    for pos in (0, 123, 299):
        torch.testing.assert_close(pe[pos] @ pe[pos + k].T, closed, atol=1e-3, rtol=0)


@pytest.mark.parametrize("k", [1, 2, 17, 100, 500])
def test_pe_pos_plus_k_is_fixed_linear_map_of_pe_pos(k):
    pe = sinusoidal_encoding(2000, 512)
    M = shift_matrix(k, 512)
    assert M.shape == (512, 512)
    assert (pe[:-k] @ M.T - pe[k:]).abs().max() < 1e-5  # every position, one matrix


def test_shift_matrix_is_block_diagonal_rotation_group():
    M = shift_matrix(5, 64)
    mask = torch.block_diag(*[torch.ones(2, 2)] * 32).bool()
    assert torch.equal(M[~mask], torch.zeros((~mask).sum()))
    torch.testing.assert_close(M @ M.T, torch.eye(64), atol=1e-6, rtol=0)
    torch.testing.assert_close(shift_matrix(2, 64) @ shift_matrix(3, 64), M, atol=1e-6, rtol=0)
    torch.testing.assert_close(shift_matrix(0, 64), torch.eye(64))


def test_layer_adds_pe_with_start_and_dropout_on_sum():
    layer = PositionalEncoding(8, max_len=20, P_drop=0.5).eval()
    x = torch.randn(2, 6, 8)
    assert torch.equal(layer(x), x + sinusoidal_encoding(20, 8)[:6])
    assert torch.equal(layer(x[:, 2:], start=2), layer(x)[:, 2:])
    layer.train()
    torch.manual_seed(0)
    y = layer(x)
    kept = y != 0
    assert 0 < kept.float().mean() < 1
    torch.testing.assert_close(y[kept], ((x + layer.pe[:6]) * 2)[kept])  # dropout acts on the sum, scaled 1/(1-p)


def test_beyond_max_len_raises_clear_error():
    layer = PositionalEncoding(8, max_len=10)
    layer(torch.zeros(1, 10, 8))
    with pytest.raises(ValueError, match="exceeds max_len=10"):
        layer(torch.zeros(1, 11, 8))
    with pytest.raises(ValueError, match="length 12 exceeds max_len=10"):
        layer(torch.zeros(1, 3, 8), start=9)


def test_learned_option_has_parameters_only_up_to_max_len():
    layer = PositionalEncoding(8, max_len=10, learned=True)
    params = list(layer.parameters())
    assert len(params) == 1 and params[0].shape == (10, 8)
    assert len(list(PositionalEncoding(8, max_len=10).parameters())) == 0  # sinusoids are a buffer
    assert "pe" not in PositionalEncoding(8, max_len=10).state_dict()  # not persistent: rebuilt from the formula
