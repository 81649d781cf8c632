"""§3.4: scaled embeddings and three-way weight tying."""

import math

import torch
from torch import nn

from aiayn.embeddings import Embeddings
from aiayn.model import PRESETS, count_parameters, make_model, parameter_count


def test_shape_and_sqrt_d_model_scale():
    emb = Embeddings(100, 64)
    tokens = torch.tensor([[1, 2, 3], [4, 5, 6]])
    out = emb(tokens)
    assert out.shape == (2, 3, 64)
    assert torch.equal(out, emb.lut.weight[tokens] * math.sqrt(64))


def test_pad_id_row_is_zero():
    emb = Embeddings(10, 8, pad_id=0)
    assert torch.equal(emb(torch.tensor([[0]])), torch.zeros(1, 1, 8))


def test_three_way_tying_is_one_tensor():
    model = make_model("multi30k", vocab_size=50, N=1, d_model=16, d_ff=32, h=2)
    w = model.src_embed.lut.weight
    assert model.generator.weight is w
    assert model.tgt_embed.lut.weight is w
    assert model.generator.weight.data_ptr() == model.tgt_embed.lut.weight.data_ptr()
    # counted once
    assert count_parameters(model) == parameter_count(model.config)
    assert sum(1 for p in model.parameters() if p is w) == 1


def test_untied_has_three_tables():
    model = make_model("multi30k", vocab_size=50, N=1, d_model=16, d_ff=32, h=2, tie_weights=False)
    tables = {id(model.src_embed.lut.weight), id(model.tgt_embed.lut.weight), id(model.generator.weight)}
    assert len(tables) == 3
    tied = parameter_count(model.config.replace(tie_weights=True))
    assert count_parameters(model) == parameter_count(model.config) == tied + 2 * 50 * 16


def test_tied_gradient_is_sum_of_uses():
    emb = Embeddings(20, 8)
    gen = nn.Linear(8, 20, bias=False)
    gen.weight = emb.lut.weight
    x = emb(torch.tensor([[3]]))
    gen(x).sum().backward()
    # d/dW of sum(W @ (sqrt(8) W[3])) : every row gets sqrt(8) W[3], row 3 also gets sqrt(8) * sum of rows
    w = emb.lut.weight.detach()
    expected = torch.zeros_like(w) + math.sqrt(8) * w[3]
    expected[3] += math.sqrt(8) * w.sum(0)
    torch.testing.assert_close(emb.lut.weight.grad, expected)


def test_tying_saves_two_tables_base_and_big():
    for name in ("base", "big"):
        c = PRESETS[name].replace(vocab_size=37000)
        assert parameter_count(c.replace(tie_weights=False)) - parameter_count(c) == 2 * 37000 * c.d_model
