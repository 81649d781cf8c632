"""§3.1: configuration, layers, the full model, and its parameter counts."""

import dataclasses
import math
import re

import pytest
import torch
from torch import nn

from aiayn.model import (
    PRESETS,
    SublayerConnection,
    Transformer,
    TransformerConfig,
    count_parameters,
    make_model,
    parameter_count,
)

SMALL = dict(vocab_size=60, N=2, d_model=32, d_ff=64, h=4, P_drop=0.0, max_len=64)


def small_model(**kw):
    torch.manual_seed(0)
    return make_model(TransformerConfig(**{**SMALL, **kw})).eval()


def batch():
    src = torch.tensor([[5, 6, 7, 8, 9, 0, 0], [3, 4, 5, 6, 7, 8, 9]])  # 0 = padding
    tgt = torch.tensor([[1, 10, 11, 12, 13, 14], [1, 20, 21, 22, 23, 24]])
    return src, tgt


# --- configuration -------------------------------------------------------------------------------------------


def test_presets_and_replace():
    assert set(PRESETS) == {"base", "big", "multi30k"}
    base = PRESETS["base"]
    assert (base.N, base.d_model, base.d_ff, base.h, base.P_drop, base.eps_ls) == (6, 512, 2048, 8, 0.1, 0.1)
    big = PRESETS["big"]
    assert (big.N, big.d_model, big.d_ff, big.h, big.P_drop) == (6, 1024, 4096, 16, 0.3)
    assert not base.norm_first and base.tie_weights
    assert base.replace(N=2).N == 2 and base.N == 6
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.N = 3


@pytest.mark.parametrize(
    "bad, words",
    [
        (dict(h=7), "d_model=512 is not divisible by h=7"),
        (dict(d_model=100, h=8), "not divisible"),
        (dict(P_drop=1.0), "P_drop must lie in [0, 1)"),
        (dict(P_drop=-0.1), "P_drop"),
        (dict(eps_ls=1.5), "eps_ls"),
        (dict(P_drop_inner=1.0), "P_drop_inner must lie in [0, 1)"),
        (dict(P_drop_inner="0.1"), "P_drop_inner"),
        (dict(N=0), "N must be a positive integer"),
        (dict(d_ff=-3), "d_ff must be a positive integer"),
        (dict(vocab_size=0), "vocab_size"),
        (dict(d_k=0), "d_k must be a positive integer"),
        (dict(pad_id=37000), "pad_id"),
    ],
)
def test_bad_config_raises_value_error_naming_the_problem(bad, words):
    with pytest.raises(ValueError) as err:
        PRESETS["base"].replace(**bad)
    assert words in str(err.value)


@pytest.mark.parametrize("layers", ["aiayn", "torch"])
def test_dropout_inside_the_sublayers_is_p_drop_unless_p_drop_inner_says(layers):
    """P_drop_inner=0.0 keeps dropout where §5.4 puts it (sublayer outputs and embedding sums) and takes it off the
    attention weights and the FFN's hidden units, in ours and in the floor; None leaves P_drop everywhere."""
    from aiayn.floor import build

    for inner, expected in ((None, 0.3), (0.0, 0.0), (0.05, 0.05)):
        model = build(make_model_config(P_drop=0.3, P_drop_inner=inner), layers)
        inside, outside = set(), set()
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.MultiheadAttention):
                inside.add(module.dropout)
            elif hasattr(module, "P_drop") and not hasattr(module, "W_1"):  # our multi-head attention
                inside.add(module.P_drop)
            elif isinstance(module, torch.nn.Dropout):
                # the FFN's hidden units: ours feed_forward.dropout, nn.Transformer*Layer's own .dropout
                hidden = name.endswith("feed_forward.dropout") or re.search(r"layers\.\d+\.dropout$", name)
                (inside if hidden else outside).add(module.p)
        assert inside == {expected} and outside == {0.3}, (inner, inside, outside)


def make_model_config(**changes):
    return PRESETS["multi30k"].replace(N=1, **changes)


def test_make_model_unknown_preset():
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        make_model("huge")


# --- parameter counts ----------------------------------------------------------------------------------------


def test_base_count_at_37000_is_exact():
    c = PRESETS["base"].replace(vocab_size=37000)
    assert parameter_count(c) == 63_082_496
    assert count_parameters(make_model(c)) == 63_082_496


def test_big_count_at_37000_is_exact():
    c = PRESETS["big"].replace(vocab_size=37000)
    with torch.device("meta"):  # shapes only: no memory, no initialisation cost
        assert count_parameters(make_model(c)) == parameter_count(c) == 214_245_376


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_count_equals_closed_form(name):
    with torch.device("meta"):
        model = make_model(name)
    assert count_parameters(model) == parameter_count(PRESETS[name])


@pytest.mark.parametrize(
    "change",
    [
        dict(d_k=16),
        dict(d_k=32),
        dict(N=2),
        dict(N=8),
        dict(d_model=256),
        dict(d_model=1024),
        dict(d_ff=1024),
        dict(d_ff=4096),
        dict(h=16),
        dict(norm_first=True),
        dict(learned_positions=True),
        dict(tie_weights=False),
    ],
)
def test_table3_variations_count_equals_closed_form(change):
    c = PRESETS["base"].replace(**change)
    with torch.device("meta"):
        assert count_parameters(make_model(c)) == parameter_count(c)


def test_multi30k_preset_built_for_real():
    model = make_model("multi30k")
    assert count_parameters(model) == parameter_count(PRESETS["multi30k"])


# --- layers and the model ------------------------------------------------------------------------------------


def test_sublayer_post_ln_and_pre_ln():
    x, f = torch.randn(2, 3, 8), nn.Linear(8, 8)
    torch.testing.assert_close(SublayerConnection(8, 0.0)(x, f), nn.functional.layer_norm(x + f(x), (8,)))
    torch.testing.assert_close(
        SublayerConnection(8, 0.0, norm_first=True)(x, f), x + f(nn.functional.layer_norm(x, (8,)))
    )


def test_shapes_and_generator_tied():
    model = small_model()
    src, tgt = batch()
    memory, src_mask = model.encode(src)
    assert memory.shape == (2, 7, 32) and src_mask.shape == (2, 1, 1, 7)
    assert model.decode(tgt, memory, src_mask).shape == (2, 6, 32)
    assert model(src, tgt).shape == (2, 6, 60)
    assert isinstance(model, Transformer) and model.config.vocab_size == 60
    assert model.generator.weight is model.src_embed.lut.weight is model.tgt_embed.lut.weight


def test_initialisation_tensor2tensor():
    """The shared table N(0, 1/d_model), W^Q/W^K/W^V Xavier with gain 1/sqrt(2), every other matrix Xavier,
    biases zero, LayerNorm gains one."""
    torch.manual_seed(0)
    model = make_model(TransformerConfig(vocab_size=4000, N=1, d_model=64, d_ff=128, h=4))
    table = model.src_embed.lut.weight
    assert table.std().item() == pytest.approx(64**-0.5, rel=0.02) and abs(table.mean().item()) < 0.005
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            assert torch.equal(p, torch.zeros_like(p)), name
        elif p.dim() == 2 and p is not table:
            bound = math.sqrt(6 / sum(p.shape)) / (
                math.sqrt(2) if name.endswith(("Q.weight", "K.weight", "V.weight")) else 1
            )
            assert 0.9 * bound < p.abs().max() <= bound, name
        elif p is not table:
            assert torch.equal(p, torch.ones_like(p)), name  # LayerNorm gains


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("t", [1, 3, 5])
def test_no_look_ahead(norm_first, t):
    model = small_model(norm_first=norm_first)
    src, tgt = batch()
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        out = model.decode(tgt, memory, src_mask)
        changed = tgt.clone()
        changed[:, t] = 42
        out2 = model.decode(changed, memory, src_mask)
    diff = (out - out2).abs().amax(dim=(0, 2))  # per position
    assert torch.equal(diff[:t], torch.zeros(t))  # nothing before t changes
    assert diff[t] > 0  # position t itself does


def test_source_padding_is_ignored():
    model = small_model()
    src, tgt = batch()
    longer = nn.functional.pad(src, (0, 4), value=0)  # four more padding columns
    with torch.no_grad():
        a = model.decode(tgt, *model.encode(src))
        b = model.decode(tgt, *model.encode(longer))
    torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_cached_decoding_equals_full_decoding():
    model = small_model()
    src, tgt = batch()
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        full = model.decode(tgt, memory, src_mask)
        cache = model.new_cache()
        assert len(cache) == model.config.N
        steps = [model.decode(tgt[:, i : i + 1], memory, src_mask, cache=cache, start=i) for i in range(tgt.size(1))]
        torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-6, rtol=0)
        cache = model.new_cache()  # a prefix of several tokens, then one more
        first = model.decode(tgt[:, :4], memory, src_mask, cache=cache)
        rest = model.decode(tgt[:, 4:], memory, src_mask, cache=cache, start=4)
        torch.testing.assert_close(torch.cat([first, rest], 1), full, atol=1e-6, rtol=0)


def to_torch_transformer(model: Transformer) -> nn.Transformer:
    """Copy our weights into PyTorch's nn.Transformer (post-LN, batch-first, no dropout).

    nn.Transformer always ends each stack with an extra LayerNorm (encoder.norm, decoder.norm). The paper's post-LN
    model has no such final norm (each layer already ends in LayerNorm), so we replace both by identities.
    PyTorch keeps W_Q, W_K, W_V stacked in in_proj_weight, in that order.
    """
    c = model.config
    ref = nn.Transformer(c.d_model, c.h, c.N, c.N, c.d_ff, dropout=0.0, batch_first=True, norm_first=False)
    ref.encoder.norm, ref.decoder.norm = nn.Identity(), nn.Identity()
    ref.encoder.use_nested_tensor = False

    def attn(dst, src):
        dst.in_proj_weight.data.copy_(torch.cat([src.W_Q.weight, src.W_K.weight, src.W_V.weight]))
        dst.in_proj_bias.data.copy_(torch.cat([src.W_Q.bias, src.W_K.bias, src.W_V.bias]))
        dst.out_proj.load_state_dict(src.W_O.state_dict())

    def rest(dst, src, norms):
        dst.linear1.load_state_dict(src.feed_forward.W_1.state_dict())
        dst.linear2.load_state_dict(src.feed_forward.W_2.state_dict())
        for norm, sub in zip(norms, src.sublayer):
            norm.load_state_dict(sub.norm.state_dict())

    for dst, src in zip(ref.encoder.layers, model.encoder.layers):
        attn(dst.self_attn, src.self_attn)
        rest(dst, src, [dst.norm1, dst.norm2])
    for dst, src in zip(ref.decoder.layers, model.decoder.layers):
        attn(dst.self_attn, src.self_attn)
        attn(dst.multihead_attn, src.src_attn)
        rest(dst, src, [dst.norm1, dst.norm2, dst.norm3])
    return ref.eval()


@pytest.mark.parametrize("size", [dict(), dict(N=3, d_model=64, d_ff=128, h=8)])
def test_equals_pytorch_nn_transformer(size):
    model = small_model(**size)
    with torch.no_grad():  # randomise LayerNorms too, so that copying them is tested
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    ref = to_torch_transformer(model)
    assert count_parameters(ref) == count_parameters(model) - model.config.vocab_size * model.config.d_model
    src, tgt = batch()
    pad = src == model.config.pad_id  # PyTorch: True = padding
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        ours = model.decode(tgt, memory, src_mask)
        x_src, x_tgt = model.src_pe(model.src_embed(src)), model.tgt_pe(model.tgt_embed(tgt))
        theirs = ref(
            x_src,
            x_tgt,
            tgt_mask=nn.Transformer.generate_square_subsequent_mask(tgt.size(1)),
            src_key_padding_mask=pad,
            memory_key_padding_mask=pad,
        )
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
