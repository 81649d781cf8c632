"""§3.3: the position-wise feed-forward network (aiayn.feed_forward)."""

import pytest
import torch
from torch import nn

from aiayn.feed_forward import PositionwiseFeedForward


def ffn(d_model=16, d_ff=64, seed=0, **kw):
    torch.manual_seed(seed)
    return PositionwiseFeedForward(d_model, d_ff, **kw).eval()


def test_shape():
    assert ffn()(torch.randn(3, 7, 16)).shape == (3, 7, 16)


def test_equation_2():
    f, x = ffn(), torch.randn(2, 5, 16)
    expected = torch.relu(x @ f.W_1.weight.T + f.W_1.bias) @ f.W_2.weight.T + f.W_2.bias
    torch.testing.assert_close(f(x), expected, rtol=0, atol=1e-6)


def test_parameter_count_of_the_base_model():
    f = PositionwiseFeedForward(512, 2048)
    assert sum(p.numel() for p in f.parameters()) == 2 * 512 * 2048 + 2048 + 512 == 2_099_712


def test_equals_two_convolutions_with_kernel_size_1():
    f, x = ffn(), torch.randn(2, 9, 16)
    conv_1, conv_2 = nn.Conv1d(16, 64, 1), nn.Conv1d(64, 16, 1)
    with torch.no_grad():
        conv_1.weight.copy_(f.W_1.weight[:, :, None])
        conv_1.bias.copy_(f.W_1.bias)
        conv_2.weight.copy_(f.W_2.weight[:, :, None])
        conv_2.bias.copy_(f.W_2.bias)
        conv = conv_2(conv_1(x.transpose(1, 2)).relu()).transpose(1, 2)
        torch.testing.assert_close(conv, f(x), rtol=0, atol=1e-6)


def test_position_wise():
    f, x = ffn(), torch.randn(2, 6, 16)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    with torch.no_grad():
        torch.testing.assert_close(f(x[:, perm]), f(x)[:, perm], rtol=0, atol=1e-6)
        x2 = x.clone()
        x2[:, 2] += 5.0  # change one position: every other output stays exactly the same
        out, out2 = f(x), f(x2)
    keep = [0, 1, 3, 4, 5]
    assert torch.equal(out2[:, keep], out[:, keep])
    assert not torch.allclose(out2[:, 2], out[:, 2])


def test_dropout_only_in_training():
    f, x = ffn(P_drop=0.5), torch.randn(1, 4, 16)
    assert torch.equal(f(x), f(x))
    f.train()
    torch.manual_seed(0)
    a = f(x)
    torch.manual_seed(1)
    assert not torch.allclose(a, f(x))


@pytest.mark.parametrize(
    "kwargs, word",
    [
        (dict(d_model=0, d_ff=4), "d_model"),
        (dict(d_model=4, d_ff=-2), "d_ff"),
        (dict(d_model=4, d_ff=8, P_drop=1.0), "P_drop"),
    ],
)
def test_bad_config_raises(kwargs, word):
    with pytest.raises(ValueError, match=word):
        PositionwiseFeedForward(**kwargs)
