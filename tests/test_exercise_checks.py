"""The checks of the chapters' smaller exercises, which their own test cells once graded in the student's kernel: the
chapter's solution earns the point, and a typical wrong answer fails with a message that names what is wrong."""

import math

import nbformat
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from aiayn.course import assignments as course
from aiayn.course import checks as CHECKS
from aiayn.feed_forward import PositionwiseFeedForward
from aiayn.positional import sinusoidal_encoding
from aiayn.training import LabelSmoothingLoss

KEYS = [
    "shift_right",
    "mha_parameters",
    "ffn_from_convs",
    "embed",
    "tying_saves",
    "fit_shift",
    "decoder_layer_params",
    "pre_ln_extra_parameters",
    "band_mask",
    "causal_layers_needed",
    "peak",
    "kl_smoothed",
]


def why(key, answer) -> str:
    """The one check's failure ("" when it passes)."""
    ((_, message),) = CHECKS.results(key, answer)
    return message


@pytest.mark.parametrize("key", KEYS)
def test_the_chapter_s_solution_earns_the_point(key):
    a = CHECKS.ASSIGNMENTS[key]
    path = next(p for p in course.sources() if course._slug(p.stem) == a.notebook)
    nb = nbformat.read(path, as_version=4)
    (exercise,) = [e for e in course.find_exercises(nb, path.stem) if key in e.assignments]
    namespace = {"torch": torch, "math": math, "F": F, "nn": nn, "PositionwiseFeedForward": PositionwiseFeedForward}
    namespace |= {"sinusoidal_encoding": sinusoidal_encoding, "LabelSmoothingLoss": LabelSmoothingLoss}
    exec(nb.cells[exercise.solution_cell].source, namespace)
    assert a.points == 1 and why(key, namespace) == ""


def test_a_decoder_input_that_keeps_the_last_token():
    def too_long(y, bos_id):
        return torch.cat([torch.full_like(y[:, :1], bos_id), y], 1)

    def bos_last(y, bos_id):
        return torch.cat([y[:, :-1], torch.full_like(y[:, :1], bos_id)], 1)

    assert "drop y's last column" in why("shift_right", too_long)
    assert "bos_id goes first" in why("shift_right", bos_last)


def test_a_parameter_count_without_biases_or_with_h_d_k_as_d_model():
    from aiayn.multi_head import MultiHeadAttention

    assert "the biases are missing" in why("mha_parameters", lambda d_model, h, d_k: 4 * d_model * h * d_k)
    assert "counts h * d_k as d_model" in why("mha_parameters", lambda d_model, h, d_k: 4 * d_model**2 + 4 * d_model)

    def built(d_model, h, d_k):
        return sum(p.numel() for p in MultiHeadAttention(d_model, h, d_k).parameters())

    assert "calls aiayn.multi_head.MultiHeadAttention" in why("mha_parameters", built)


def test_a_decoder_layer_counted_as_an_encoder_layer_or_with_two_norms():
    def layer(d_model, d_ff, h, d_k, attention_blocks=2, norms=3):
        attention = 4 * d_model * h * d_k + 3 * h * d_k + d_model
        return attention_blocks * attention + 2 * d_model * d_ff + d_ff + d_model + norms * 2 * d_model

    assert "an encoder layer" in why("decoder_layer_params", lambda *s: layer(*s, attention_blocks=1, norms=2))
    assert "two LayerNorms counted" in why("decoder_layer_params", lambda *s: layer(*s, norms=2))


def test_pre_ln_counted_for_one_stack():
    assert "that is half" in why("pre_ln_extra_parameters", lambda: 2 * 512)
    assert "unnormalised" in why("pre_ln_extra_parameters", lambda: 0)
    from aiayn.model import PRESETS, parameter_count

    base = PRESETS["base"]

    def counted():
        return parameter_count(base.replace(norm_first=True)) - parameter_count(base)

    assert "calls aiayn.model.parameter_count" in why("pre_ln_extra_parameters", counted)


def test_tying_that_saves_one_table():
    assert "that is one table" in why("tying_saves", lambda V, d_model: V * d_model)


def test_an_unscaled_embedding_and_the_book_s_class():
    from aiayn.embeddings import Embeddings

    assert "not multiplied by sqrt(d_model)" in why("embed", lambda table, tokens: table(tokens))

    def via_class(table, tokens):
        e = Embeddings(*table.weight.shape)
        e.lut = table
        return e(tokens)

    assert "calls aiayn.embeddings.Embeddings" in why("embed", via_class)


def test_an_ffn_without_its_relu_and_one_that_runs_the_convolutions():
    def linear_only(conv_1, conv_2):
        w1, w2 = nn.Linear(conv_1.in_channels, conv_1.out_channels), nn.Linear(conv_2.in_channels, conv_2.out_channels)
        with torch.no_grad():
            for w, conv in ((w1, conv_1), (w2, conv_2)):
                w.weight.copy_(conv.weight[:, :, 0]), w.bias.copy_(conv.bias)
        return nn.Sequential(w1, w2)

    class Convolved(nn.Module):  # the convolutions themselves, not a PositionwiseFeedForward
        def __init__(self, conv_1, conv_2):
            super().__init__()
            self.conv_1, self.conv_2 = conv_1, conv_2

        def forward(self, x):
            return self.conv_2(self.conv_1(x.transpose(1, 2)).relu()).transpose(1, 2)

    def no_biases(conv_1, conv_2):  # the weights copied, the biases left as PyTorch made them
        f = PositionwiseFeedForward(conv_1.in_channels, conv_1.out_channels)
        with torch.no_grad():
            f.W_1.weight.copy_(conv_1.weight[:, :, 0]), f.W_2.weight.copy_(conv_2.weight[:, :, 0])
        return f

    assert "the ReLU is missing" in why("ffn_from_convs", linear_only)
    assert "calls torch.nn.Conv1d.forward" in why("ffn_from_convs", Convolved)
    assert "off by" in why("ffn_from_convs", no_biases)


def test_a_shift_fitted_the_other_way_round_or_on_too_few_positions():
    def fit(k, d_model, n=2000, transposed=False):
        table = sinusoidal_encoding(n + k, d_model).double()
        M_T = torch.linalg.lstsq(table[:n], table[k:]).solution
        return (M_T if transposed else M_T.T).float()

    assert "M transposed" in why("fit_shift", lambda k, d_model: fit(k, d_model, transposed=True))
    assert "to 1e-4: off by" in why("fit_shift", lambda k, d_model: fit(k, d_model, n=200))


def test_a_band_one_diagonal_wide_or_of_integers():
    def band(n, r, width=lambda r: (r - 1) // 2):
        i = torch.arange(n)
        return (i[:, None] - i[None, :]).abs() <= width(r)

    assert "a band of half-width" in why("band_mask", lambda n, r: band(n, r, lambda r: (r + 1) // 2))
    assert "expected a bool tensor" in why("band_mask", lambda n, r: band(n, r).int())
    assert "only positions j <= i" in why("band_mask", lambda n, r: band(n, r).tril())


def test_a_causal_reach_of_k_per_layer_or_of_no_layer():
    assert "reaches k - 1 positions back, not k" in why("causal_layers_needed", lambda j, k: max(1, math.ceil(j / k)))
    assert "at least 1" in why("causal_layers_needed", lambda j, k: math.ceil(j / (k - 1)))


def test_a_peak_without_its_factor_or_at_the_warmup_s_slope():
    from aiayn.training import rate

    assert "factor is not applied" in why("peak", lambda d_model, warmup, factor: (d_model * warmup) ** -0.5)
    assert "the warmup's slope" in why("peak", lambda d_model, warmup, factor: factor * d_model**-0.5 * warmup**-1.5)
    assert "calls aiayn.training.rate" in why("peak", lambda d_model, warmup, f: rate(warmup, d_model, warmup, f))


def test_a_kl_of_logits_averaged_or_the_cross_entropy():
    def kl(logits, target, eps_ls=0.1, pad_id=0, log_p=True, reduction="sum"):
        q = LabelSmoothingLoss(eps_ls, pad_id).target_distribution(target, logits.size(-1))
        return F.kl_div(logits.log_softmax(-1) if log_p else logits, q, reduction=reduction)

    assert "F.kl_div takes log-probabilities" in why("kl_smoothed", lambda *a: kl(*a, log_p=False))
    assert "reduction='batchmean'" in why("kl_smoothed", lambda *a: kl(*a, reduction="batchmean"))

    def ignored(logits, target, eps_ls=0.1, pad_id=0):
        return kl(logits, target, 0.1, pad_id)

    def cross_entropy(logits, target, eps_ls=0.1, pad_id=0):
        return LabelSmoothingLoss(eps_ls, pad_id)(logits, target)

    assert "eps_ls is ignored" in why("kl_smoothed", ignored)
    assert "the cross-entropy" in why("kl_smoothed", cross_entropy)


def test_answers_kept_from_one_grading_fail_the_next(monkeypatch):
    """The inputs are drawn afresh by each grading: a table of one grading's answers fails the next."""
    from aiayn.model import count_parameters
    from aiayn.multi_head import MultiHeadAttention

    kept = {}
    monkeypatch.setattr(CHECKS, "SEED", 1)
    rng = CHECKS._rng("mha_parameters")  # the check's draws
    for d_model, h, d_k in [(512, 8, 64)] + [CHECKS._sizes(rng) for _ in range(3)]:
        kept[d_model, h, d_k] = count_parameters(MultiHeadAttention(d_model, h, d_k))
    assert why("mha_parameters", lambda *sizes: kept[sizes]) == ""
    monkeypatch.setattr(CHECKS, "SEED", 2)
    assert "KeyError" in why("mha_parameters", lambda *sizes: kept[sizes])


def test_a_table_of_the_fixed_cases_fails_the_decoding_checks():
    """A fourteenth trial's: answers looked up in a table of the checks' fixed cases (readable in checks.py) passed the
    length penalty, clipped matches and brevity penalty; each check now draws more inputs for every grading."""
    from collections import Counter

    def lp(length, alpha):
        return ((5 + length) / 6) ** alpha

    def clipped(hyp, ref, n):
        h, r = (Counter(zip(*[s[k:] for k in range(n)])) for s in (hyp, ref))
        return sum((h & r).values()), sum(h.values())

    def bp(c, r):
        return 1.0 if c >= r else (math.exp(1 - r / c) if c else 0.0)

    fixed_lp = {(alpha, float(n)): lp(float(n), alpha) for alpha in (0.0, 0.6, 1.0, 2.0) for n in range(60)}
    pairs = ["the the the the|the cat sat on the mat", "a man rides a bike on a road|a man rides a bicycle on a street"]
    pairs += ["|a b c", "a b|"]
    fixed_clipped = {(h, r, n): clipped(h.split(), r.split(), n) for h, r in map(lambda p: p.split("|"), pairs)
                     for n in range(1, 5)}  # fmt: skip
    fixed_bp = {(c, r): bp(c, r) for c, r in [(10, 10), (12, 10), (9, 10), (1, 30), (0, 5), (0, 0)]}

    def lp_table(length, alpha):
        return torch.tensor([fixed_lp[(alpha, float(n))] for n in length.tolist()], dtype=torch.float64)

    tables = {
        "length_penalty": lp_table,
        "clipped_matches": lambda hyp, ref, n: fixed_clipped[(" ".join(hyp), " ".join(ref), n)],
        "brevity_penalty": lambda c, r: fixed_bp[(c, r)],
    }
    for key, table in tables.items():
        assert why(key, table) != "", key
    for key, right in (("length_penalty", lp), ("clipped_matches", clipped), ("brevity_penalty", bp)):
        assert why(key, right) == "", key


def test_the_results_chapter_s_closed_form_is_the_book_s_answer_to_peak():
    """A fourteenth trial's: the results chapter's peak_lr, fed the settings as a run's metrics, answered peak."""
    from aiayn.results import peak_lr

    def borrowed(d_model, warmup, factor):
        return peak_lr({"train_config": {"factor": factor, "warmup": warmup}, "model_config": {"d_model": d_model}})

    assert "calls aiayn.results.peak_lr" in why("peak", borrowed)
