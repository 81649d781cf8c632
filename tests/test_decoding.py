"""§6.1: beam search against exhaustive search, greedy, the key/value cache, length limits, translate(), averaging."""

import copy
import itertools

import pytest
import torch
from torch import nn

from aiayn.decoding import (
    BOS,
    EOS,
    average_checkpoints,
    beam_search,
    greedy_decode,
    length_penalty,
    output_limits,
    translate,
    translate_ids,
)
from aiayn.model import TransformerConfig, make_model
from aiayn.tokenization import Tokenizer

SMALL = TransformerConfig(vocab_size=12, N=2, d_model=32, d_ff=64, h=4, P_drop=0.1, max_len=64)
SRC = torch.tensor(
    [
        [5, 6, 7, 8, 9, 2],  # a padded batch: 6, 3, 5 and 2 source tokens (</s> included)
        [4, 11, 2, 0, 0, 0],
        [7, 7, 3, 10, 2, 0],
        [9, 2, 0, 0, 0, 0],
    ]
)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy 2-core machine the threads wait on each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny(config=SMALL, seed=0):
    torch.manual_seed(seed)
    return make_model(config)


def copy_trained(steps=80, seed=0):
    """SMALL after a few updates on copying 2-7 symbols: its outputs end with </s> at different lengths."""
    model = tiny(seed=seed)
    g = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    pos = torch.arange(8)
    for _ in range(steps):
        n, x = torch.randint(2, 8, (32, 1), generator=g), torch.randint(4, 12, (32, 8), generator=g)
        tgt = torch.where(pos < n, x, torch.where(pos == n, EOS, 0))  # (32, 8): symbols, </s>, padding
        tgt_in = torch.cat([torch.full((32, 1), BOS), torch.where(pos < n, x, 0)[:, :-1]], 1)
        loss = nn.functional.cross_entropy(model(tgt, tgt_in).flatten(0, 1), tgt.flatten(), ignore_index=0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


@pytest.fixture(scope="module")
def model():
    return copy_trained()


def count_decoder_calls(model):
    """Wrap model.decode so that every decoding step is counted."""
    calls, decode = [], model.decode
    model.decode = lambda *args, **kw: (calls.append(1), decode(*args, **kw))[1]
    return calls


def with_eos_bias(model, bias):
    """A copy of ``model`` whose pre-softmax layer adds ``bias`` to the logit of </s>."""
    model = copy.deepcopy(model)
    generator = nn.Linear(model.config.d_model, model.config.vocab_size, bias=True)
    with torch.no_grad():
        generator.weight.copy_(model.generator.weight)
        generator.bias.zero_()
        generator.bias[EOS] = bias
    model.generator = generator
    return model


# --- beam search finds the exhaustive optimum with a beam of |V|^L ------------------------------------------------


def exhaustive_search(model, src, L, alpha):
    """Score every output the search can produce, (token ids without </s>, log p / lp), best first.

    An output ends with </s> after at most L - 1 other tokens, or has L tokens and no </s> (the length limit);
    |y| counts </s>. <pad> and <s> are never generated. Log-probabilities come from teacher forcing (model.forward).
    """
    words = [i for i in range(model.config.vocab_size) if i not in (0, BOS, EOS)]
    outputs = [list(p) + [EOS] for k in range(L) for p in itertools.product(words, repeat=k)]
    outputs += [list(p) for p in itertools.product(words, repeat=L)]
    tgt_in = torch.full((len(outputs), L), words[0])  # positions after the output are never attended to
    tgt_in[:, 0] = BOS
    for row, y in enumerate(outputs):
        tgt_in[row, 1 : len(y)] = torch.tensor(y[:-1], dtype=torch.long)
    with torch.no_grad():
        logp = model.eval()(src.expand(len(outputs), -1), tgt_in).double().log_softmax(-1)  # (outputs, L, V)
    results = []
    for row, y in enumerate(outputs):
        total = sum(logp[row, j, token].item() for j, token in enumerate(y))
        results.append(([t for t in y if t != EOS], total / length_penalty(len(y), alpha)))
    return sorted(results, key=lambda r: -r[1])


@pytest.mark.parametrize("alpha", [0.0, 0.6])
@pytest.mark.parametrize("L", [2, 3])
def test_beam_as_large_as_all_outputs_finds_the_exhaustive_optimum(alpha, L):
    V = 6
    model = tiny(SMALL.replace(vocab_size=V, N=1, d_model=16, d_ff=32, h=2, P_drop=0.0), seed=36)
    src = torch.tensor([[3, 4, 5, 2], [5, 2, 0, 0], [4, 4, 3, 2], [3, 2, 0, 0]])
    hyps, scores = beam_search(model, src, beam_size=V**L, alpha=alpha, max_len=L)
    greedy_misses = 0
    for i in range(src.size(0)):
        row = src[i : i + 1, : int((src[i] != 0).sum())]
        ranked = exhaustive_search(model, row, L, alpha)
        (best, best_score), (_, second_score) = ranked[0], ranked[1]
        assert best_score - second_score > 1e-4  # a unique optimum: the comparison of sequences is meaningful
        assert hyps[i] == best
        assert scores[i].item() == pytest.approx(best_score, abs=1e-5)
        greedy_misses += beam_search(model, row, beam_size=1, alpha=alpha, max_len=L)[0][0] != best
    assert greedy_misses > 0  # the search problem is not trivial: a beam of 1 misses the optimum here


def test_beam_search_rejects_an_empty_beam(model):
    with pytest.raises(ValueError, match="beam_size must be at least 1, got 0"):
        beam_search(model, SRC, beam_size=0)


# --- beam size 1 is greedy search; the cache; batching ------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_size_one_is_greedy(model, alpha):
    greedy, greedy_scores = greedy_decode(model, SRC)
    beam, beam_scores = beam_search(model, SRC, beam_size=1, alpha=alpha)
    assert beam == greedy
    lengths = torch.tensor(
        [
            min(len(y) + 1, limit)  # |y| counts </s>, or is the limit
            for y, limit in zip(greedy, output_limits(model, SRC).tolist())
        ]
    )
    assert len(set(lengths.tolist())) == 4 and (lengths < torch.tensor([56, 53, 55, 52])).all()  # all end with </s>
    torch.testing.assert_close(beam_scores, greedy_scores / length_penalty(lengths, alpha), rtol=0, atol=1e-5)


def test_greedy_scores_are_the_log_probabilities_of_the_outputs(model):
    hyps, scores = greedy_decode(model, SRC)
    limits = output_limits(model, SRC).tolist()
    for i, (y, limit) in enumerate(zip(hyps, limits)):
        out = y + [EOS] if len(y) < limit else y
        tgt_in = torch.tensor([[BOS] + out[:-1]])
        with torch.no_grad():
            logp = model.eval()(SRC[i : i + 1], tgt_in).log_softmax(-1)[0]
        assert scores[i].item() == pytest.approx(sum(logp[j, t].item() for j, t in enumerate(out)), abs=1e-4)


def test_cache_gives_the_same_outputs_as_recomputing(model):
    tokens, scores = greedy_decode(model, SRC, use_cache=True)
    tokens_full, scores_full = greedy_decode(model, SRC, use_cache=False)
    assert tokens == tokens_full
    torch.testing.assert_close(scores, scores_full, rtol=0, atol=1e-5)
    for K, alpha in [(1, 0.6), (3, 0.0), (4, 0.6), (6, 1.0)]:
        tokens, scores = beam_search(model, SRC, beam_size=K, alpha=alpha, use_cache=True)
        tokens_full, scores_full = beam_search(model, SRC, beam_size=K, alpha=alpha, use_cache=False)
        assert tokens == tokens_full
        torch.testing.assert_close(scores, scores_full, rtol=0, atol=1e-5)


def test_batched_decoding_equals_decoding_each_sentence_alone(model):
    greedy, greedy_scores = greedy_decode(model, SRC)
    beam, beam_scores = beam_search(model, SRC, beam_size=4, alpha=0.6)
    for i in range(SRC.size(0)):
        alone = SRC[i : i + 1, : int((SRC[i] != 0).sum())]  # no padding
        tokens, scores = greedy_decode(model, alone)
        assert tokens[0] == greedy[i] and scores[0].item() == pytest.approx(greedy_scores[i].item(), abs=1e-5)
        tokens, scores = beam_search(model, alone, beam_size=4, alpha=0.6)
        assert tokens[0] == beam[i] and scores[0].item() == pytest.approx(beam_scores[i].item(), abs=1e-5)


def test_decoding_switches_dropout_off_and_restores_the_training_flag():
    model = tiny()  # P_drop = 0.1
    model.train()
    greedy, _ = greedy_decode(model, SRC)
    beam, _ = beam_search(model, SRC, beam_size=3)
    assert model.training
    model.eval()
    assert greedy_decode(model, SRC)[0] == greedy and beam_search(model, SRC, beam_size=3)[0] == beam
    assert not model.training


def test_beam_trace_holds_the_2k_best_candidates_of_the_first_sentence(model):
    trace = []
    beam_search(model, SRC, beam_size=3, alpha=0.6, trace=trace)
    assert len(trace) >= 1 and all(len(step["token"]) == 6 for step in trace)
    first = trace[0]
    assert first["parent"] == [0] * 6  # at the start only slot 0 holds a hypothesis
    assert first["score"] == sorted(first["score"], reverse=True)


# --- §6.1: maximum output length = input length + 50, early termination ------------------------------------------


def test_output_limit_is_input_length_plus_50_capped_by_positions(model):
    assert output_limits(model, SRC).tolist() == [56, 53, 55, 52]  # non-padding source tokens + 50
    assert output_limits(model, SRC, max_len=7).tolist() == [7, 7, 7, 7]
    short = tiny(SMALL.replace(max_len=20))
    assert output_limits(short, SRC).tolist() == [20, 20, 20, 20]
    assert output_limits(short, SRC, max_len=100).tolist() == [20, 20, 20, 20]  # a 21st token would need position 20


def test_a_model_that_never_ends_stops_at_the_limit():
    never = with_eos_bias(tiny(), -1e4)
    calls = count_decoder_calls(never)
    hyps, _ = greedy_decode(never, SRC)
    assert [len(y) for y in hyps] == [56, 53, 55, 52] and len(calls) == 56
    calls.clear()
    hyps, scores = beam_search(never, SRC, beam_size=2, alpha=0.6)
    assert [len(y) for y in hyps] == [56, 53, 55, 52] and len(calls) == 56
    assert torch.isfinite(scores).all()
    capped = with_eos_bias(tiny(SMALL.replace(max_len=20)), -1e4)  # + 50 would need positions the model lacks
    assert [len(y) for y in greedy_decode(capped, SRC)[0]] == [20] * 4
    assert [len(y) for y in beam_search(capped, SRC, beam_size=2)[0]] == [20] * 4


def test_search_terminates_early_once_every_beam_has_ended(model):
    trained = copy.deepcopy(model)
    calls = count_decoder_calls(trained)
    hyps, _ = beam_search(trained, SRC, beam_size=4)
    assert len(calls) < 56 and len(calls) > max(len(y) for y in hyps)  # stops after the longest output, not at 56
    eager = with_eos_bias(tiny(), 1e2)  # </s> is by far the likeliest first token
    calls = count_decoder_calls(eager)
    hyps, scores = greedy_decode(eager, SRC)
    assert hyps == [[]] * 4 and len(calls) == 1
    torch.testing.assert_close(scores, torch.zeros(4), rtol=0, atol=1e-5)
    calls.clear()
    hyps, scores = beam_search(eager, SRC, beam_size=3, alpha=0.6)
    # step 1 keeps </s> and two live hypotheses; step 2 ends those with </s>: every slot has ended, 2 steps of 56
    assert hyps == [[]] * 4 and len(calls) == 2
    torch.testing.assert_close(scores, torch.zeros(4), rtol=0, atol=1e-5)


def test_length_penalty_is_gnmts():
    assert length_penalty(1, 0.6) == 1.0 and length_penalty(7, 0.0) == 1.0
    assert length_penalty(10, 0.6) == pytest.approx(2.5**0.6, rel=1e-12)
    assert length_penalty(torch.tensor([1.0, 25.0]), 1.0).tolist() == [1.0, 5.0]


# --- translate(): strings in, strings out, awkward input ----------------------------------------------------------

SENTENCES = [
    ("Two dogs play in the snow.", "Zwei Hunde spielen im Schnee."),
    ("A man in a blue shirt is standing on a ladder.", "Ein Mann in einem blauen Hemd steht auf einer Leiter."),
    ("A little girl climbing into a wooden playhouse.", "Ein kleines Mädchen klettert in ein Spielhaus aus Holz."),
    ("A woman sits on a bench.", "Eine Frau sitzt auf einer Bank."),
]


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.train(SENTENCES * 5, vocab_size=600)


@pytest.fixture(scope="module")
def translator(tok):
    return tiny(TransformerConfig(vocab_size=len(tok), N=1, d_model=16, d_ff=32, h=2, P_drop=0.0, max_len=64))


def test_translate_is_beam_search_with_k4_alpha06(tok, translator):
    sentence = "Zwei Hunde spielen im Schnee."
    src = torch.tensor([tok.encode(sentence) + [EOS]])
    hyp = beam_search(translator, src, beam_size=4, alpha=0.6)[0][0]
    assert translate(translator, tok, sentence) == tok.decode(hyp)
    assert isinstance(translate(translator, tok, sentence), str)


def test_translate_splits_words_by_the_source_language(tok, translator):
    sentence = "Don't go."  # spaCy's English rules split it into "Do" and "n't"; its German rules keep "Don't"
    assert tok.encode(sentence, "de") != tok.encode(sentence, "en")
    src = torch.tensor([tok.encode(sentence, "de") + [EOS]])
    hyp = beam_search(translator, src, beam_size=4, alpha=0.6)[0][0]
    assert translate(translator, tok, sentence, lang="de") == tok.decode(hyp)


def test_translate_keeps_the_order_of_a_batch(tok, translator):
    sentences = ["Eine Frau sitzt.", "Zwei Hunde spielen im Schnee auf einer Bank.", "Ein Mann.", "Holz"]
    alone = [translate(translator, tok, s) for s in sentences]
    assert translate(translator, tok, sentences) == alone
    assert translate(translator, tok, sentences, batch_size=3) == alone


@pytest.mark.parametrize("blank", ["", " ", "   ", "\t\n"])
def test_translate_empty_or_blank_sentence_gives_empty_string_without_the_model(tok, translator, blank):
    model = copy.deepcopy(translator)
    calls = count_decoder_calls(model)
    assert translate(model, tok, blank) == ""
    assert translate(model, tok, [blank, blank]) == ["", ""]
    assert calls == []
    assert translate(model, tok, [blank, "Ein Mann."])[0] == ""


def test_translate_too_long_input_raises_naming_the_sentence(tok, translator):
    long = "Zwei Hunde spielen im Schnee. " * 8
    n = len(tok.encode(long))
    assert n + 1 > 64
    with pytest.raises(
        ValueError,
        match=rf"sentence 1 has {n} tokens plus </s>, but the model has only 64 positions "
        r"\(max_len\); split the sentence",
    ):
        translate(translator, tok, ["Ein Mann.", long])


def test_translate_boundary_is_max_len_tokens_including_eos(tok):
    sentence = "Zwei Hunde spielen im Schnee."
    n = len(tok.encode(sentence))
    exact = tiny(TransformerConfig(vocab_size=len(tok), N=1, d_model=16, d_ff=32, h=2, P_drop=0.0, max_len=n + 1))
    assert isinstance(translate(exact, tok, sentence), str)
    short = tiny(TransformerConfig(vocab_size=len(tok), N=1, d_model=16, d_ff=32, h=2, P_drop=0.0, max_len=n))
    with pytest.raises(ValueError, match="max_len"):
        translate(short, tok, sentence)


def test_translate_characters_outside_the_vocabulary_do_not_crash(tok, translator):
    sentence = "Ein Hund 🐕 läuft über die Brücke ∑ 漢字."
    ids = tok.encode(sentence)
    assert any(4 <= i < 260 for i in ids)  # spelled with byte tokens
    out = translate(translator, tok, [sentence, "\u0000\u200b Ω"])
    assert all(isinstance(s, str) for s in out)


@pytest.mark.parametrize(
    "bad, message",
    [
        (None, "translate takes a sentence \\(str\\) or a list of sentences, got NoneType"),
        (42, "got int"),
        (b"Ein Mann.", "got bytes"),
        (["Ein Mann.", [5, 6, 7]], "sentence 1 is a list, not a str; translate takes text"),
        ([torch.tensor([5, 6])], "sentence 0 is a Tensor"),
    ],
)
def test_translate_says_what_to_pass_when_given_no_text(tok, translator, bad, message):
    with pytest.raises(TypeError, match=message):
        translate(translator, tok, bad)


def test_translate_ids_is_translate_without_the_tokenizer(tok, translator):
    sentences = ["Eine Frau sitzt.", "", "Zwei Hunde spielen im Schnee auf einer Bank.", "Ein Mann."]
    ids = [tok.encode(s) if s else [] for s in sentences]
    out = translate_ids(translator, (x for x in ids), batch_size=2)  # any iterable of id sequences
    assert [tok.decode(h) if h else "" for h in out] == translate(translator, tok, sentences)
    assert out[1] == []
    alone = beam_search(translator, torch.tensor([ids[3] + [EOS]]), beam_size=4, alpha=0.6)[0][0]
    assert out[3] == alone
    short = translate_ids(translator, [ids[0]], max_len=3)[0]
    assert len(short) <= 3


# --- §6.1 checkpoint averaging ------------------------------------------------------------------------------------


def test_averaging_identical_checkpoints_returns_that_checkpoint_exactly():
    state = tiny().state_dict()
    half = {k: v.half() for k, v in state.items()}
    for s in (state, half):
        averaged = average_checkpoints([s] * 5)
        assert averaged.keys() == s.keys()
        assert all(torch.equal(averaged[k], s[k]) and averaged[k].dtype == s[k].dtype for k in s)


def test_averaging_two_state_dicts_gives_the_mean():
    a = {"w": torch.tensor([1.0, 2.0, -3.0]), "b": torch.tensor([[0.0, 4.0]], dtype=torch.float64)}
    b = {"w": torch.tensor([3.0, 6.0, 3.0]), "b": torch.tensor([[1.0, -4.0]], dtype=torch.float64)}
    averaged = average_checkpoints([a, b])
    assert torch.equal(averaged["w"], torch.tensor([2.0, 4.0, 0.0]))
    assert torch.equal(averaged["b"], torch.tensor([[0.5, 0.0]], dtype=torch.float64))
    three = average_checkpoints([a, b, {"w": torch.tensor([2.0, 1.0, 3.0]), "b": b["b"]}])
    assert torch.equal(three["w"], torch.tensor([2.0, 3.0, 1.0]))


def test_averaging_models_loads_into_the_model_and_keeps_ties(tmp_path):
    states = [tiny(seed=s).state_dict() for s in range(3)]
    paths = []
    for i, s in enumerate(states):  # files, one of them a training checkpoint with the weights under "model"
        paths.append(tmp_path / f"ckpt{i}.pt")
        torch.save({"model": s, "step": i} if i == 1 else s, paths[-1])
    averaged = average_checkpoints(paths)
    for key in states[0]:
        expected = (states[0][key].double() + states[1][key].double() + states[2][key].double()) / 3
        assert torch.equal(averaged[key], expected.float())
    model = tiny()
    model.load_state_dict(averaged)
    assert model.generator.weight is model.src_embed.lut.weight


def test_averaging_takes_integer_buffers_from_the_last_checkpoint():
    a = {"w": torch.tensor([1.0]), "step": torch.tensor(100), "seen": torch.tensor([True, False]), "epoch": 1}
    b = {"w": torch.tensor([2.0]), "step": torch.tensor(200), "seen": torch.tensor([False, False]), "epoch": 2}
    averaged = average_checkpoints([a, b])
    assert averaged["w"].item() == 1.5
    assert averaged["step"].item() == 200 and averaged["step"].dtype == torch.int64
    assert averaged["seen"].tolist() == [False, False] and averaged["epoch"] == 2
    averaged["step"] += 1  # a copy, not the last checkpoint's tensor
    assert b["step"].item() == 200


def test_averaging_bad_input_raises_clear_errors():
    with pytest.raises(ValueError, match="needs at least one checkpoint"):
        average_checkpoints([])
    a = {"w": torch.zeros(2), "b": torch.zeros(1)}
    with pytest.raises(
        ValueError,
        match=r"checkpoint 0 does not match the last one: missing \['b'\], "
        r"unexpected \['c'\]",
    ):
        average_checkpoints([{"w": torch.zeros(2), "c": torch.zeros(1)}, a])
    with pytest.raises(ValueError, match=r"checkpoint 1 has w of shape \(3,\), the last one \(2,\)"):
        average_checkpoints([a, {"w": torch.zeros(3), "b": torch.zeros(1)}, a])
