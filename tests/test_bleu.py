"""§6.1's metric: aiayn.bleu equals sacreBLEU (13a tokens, 'exp' smoothing) to 1e-6, on Multi30k and edge cases."""

import math
import random

import pytest
import sacrebleu
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

from aiayn.bleu import bleu_from_stats, brevity_penalty, corpus_bleu, ngram_stats, tokenize_13a
from aiayn.data import load


def assert_equals_sacrebleu(hyps, refs, lowercase=False, tokenize="13a"):
    """Score, precisions, BP, lengths and n-gram counts all equal sacreBLEU's; refs is one stream or a list of them."""
    streams = [refs] if all(isinstance(r, str) for r in refs) else refs
    ours = corpus_bleu(hyps, refs, lowercase=lowercase, tokenize=tokenize)
    theirs = sacrebleu.corpus_bleu(hyps, streams, lowercase=lowercase, tokenize=tokenize)
    assert ours.score == pytest.approx(theirs.score, abs=1e-6)
    assert ours.precisions == pytest.approx(theirs.precisions, abs=1e-6)
    assert ours.bp == pytest.approx(theirs.bp, abs=1e-6)
    assert (ours.sys_len, ours.ref_len) == (theirs.sys_len, theirs.ref_len)
    assert (ours.counts, ours.totals) == (list(theirs.counts), list(theirs.totals))
    return ours


@pytest.fixture(scope="module")
def test2016(multi30k_cache):
    pairs = load("test2016", cache=multi30k_cache)
    return [en for en, de in pairs], [de for en, de in pairs]


# --- tokenisation -------------------------------------------------------------------------------------------------


def test_tokenize_13a_equals_sacrebleu_on_test2016(test2016):
    english, german = test2016
    assert len(german) == 1000
    sacre = Tokenizer13a()
    for line in english + german:
        assert tokenize_13a(line) == sacre(line)


@pytest.mark.parametrize(
    "line",
    [
        'Ein 3.5-jähriges Kind (mit "Hut") isst 2-3 Äpfel, oder? &amp; das war\'s.',
        "1,000.50 $ at 10:30 -- a/b [c] {d} <e> ~f^ `g` |h| \\i @j #k %l *m +n =o _p",
        "&quot;quoted&quot; &lt;tag&gt; &amp;&amp; <skipped> gone",
        "line-\nbreak and\nnewline",
        "",
        "   ",
        ".,",
        "3.",
        ".5",
        "a.b,c",
        "Mr. Smith's e-mail: x@y.org!",
    ],
)
def test_tokenize_13a_equals_sacrebleu_on_hard_cases(line):
    assert tokenize_13a(line) == Tokenizer13a()(line)


# --- corpus BLEU on Multi30k --------------------------------------------------------------------------------------


def perturb(lines, seed):
    """Drop, shuffle, repeat and re-case words in some lines, so that every n-gram order loses matches."""
    rng = random.Random(seed)
    out = []
    for line in lines:
        words = line.split()
        kind = rng.randrange(5)
        if kind == 1:  # drop words
            words = [w for w in words if rng.random() > 0.3]
        elif kind == 2:  # shuffle words
            rng.shuffle(words)
        elif kind == 3:  # longer than the reference: repeat a stretch
            i = rng.randrange(len(words))
            words = words + words[i : i + 4]
        elif kind == 4:  # change the case of some words
            words = [w.upper() if rng.random() < 0.3 else w.lower() for w in words]
        out.append(" ".join(words))
    return out


@pytest.mark.parametrize("lowercase", [False, True])
def test_equals_sacrebleu_on_perturbed_test2016(test2016, lowercase):
    english, german = test2016
    assert corpus_bleu(german, german, lowercase=lowercase).score == pytest.approx(100.0, abs=1e-9)
    for seed in range(3):
        result = assert_equals_sacrebleu(perturb(german, seed), german, lowercase=lowercase)
        assert 20 < result.score < 100
    assert assert_equals_sacrebleu(english, german, lowercase=lowercase).score < 10  # English against German


def test_equals_sacrebleu_with_two_reference_streams(test2016):
    english, german = test2016
    other = perturb(german, seed=10)
    assert_equals_sacrebleu(perturb(german, seed=11), [german, other])
    assert_equals_sacrebleu(english, [german, english])


def test_any_iterables_are_accepted(test2016):
    """Generators (a file read line by line, a map over outputs) score as the lists they yield."""
    english, german = test2016
    hyps = perturb(german, seed=12)
    want = corpus_bleu(hyps, german)
    got = corpus_bleu((h for h in hyps), (r for r in german))
    assert (got.score, got.sys_len, got.ref_len) == (want.score, want.sys_len, want.ref_len)
    two = corpus_bleu(iter(hyps), [iter(german), (e for e in english)])
    assert two.score == pytest.approx(corpus_bleu(hyps, [german, english]).score, abs=1e-12)


def test_tokenize_none_equals_sacrebleu(test2016):
    _, german = test2016
    assert_equals_sacrebleu(perturb(german, seed=5), german, tokenize="none")


# --- random corpora -----------------------------------------------------------------------------------------------

WORDS = [
    "a",
    "A",
    "the",
    "The",
    "dog",
    "Dog",
    "runs",
    "ran",
    "3.5",
    "2-3",
    "1,000",
    ",",
    ".",
    "!",
    "(",
    ")",
    "e-mail",
    "don't",
    "&amp;",
    "x/y",
    "über",
    "Straße",
    "ÄPFEL",
    "äpfel",
    '"',
    "$5",
    "10:30",
    "end.",
]


def random_corpus(rng, n):
    """n reference lines of 0..15 random words, and hypotheses that copy, edit, shorten or replace them."""
    refs, hyps = [], []
    for _ in range(n):
        ref = [rng.choice(WORDS) for _ in range(rng.randint(1, 15))]
        hyp = [w for w in ref if rng.random() > 0.2]
        hyp += [rng.choice(WORDS) for _ in range(rng.randint(0, 4))]
        if rng.random() < 0.3:
            rng.shuffle(hyp)
        if rng.random() < 0.1:
            hyp = [rng.choice(WORDS) for _ in range(rng.randint(0, 3))]
        joiner = "" if rng.random() < 0.1 else " "  # some lines glue words together: tokenisation must split them
        refs.append(" ".join(ref))
        hyps.append(joiner.join(hyp))
    return hyps, refs


@pytest.mark.parametrize("lowercase", [False, True])
@pytest.mark.parametrize("n, seed", [(1, 0), (2, 1), (5, 2), (20, 3), (100, 4), (500, 5)])
def test_equals_sacrebleu_on_random_corpora(n, seed, lowercase):
    rng = random.Random(seed)
    for _ in range(5):
        hyps, refs = random_corpus(rng, n)
        assert_equals_sacrebleu(hyps, refs, lowercase=lowercase)


# --- edge cases ---------------------------------------------------------------------------------------------------

REFS = ["A man rides a bike down the street.", "Two dogs play in the snow.", "A girl in a red dress smiles."]


def test_an_empty_hypothesis_line():
    result = assert_equals_sacrebleu(["A man rides a bike down the street.", "", "A girl in a dress smiles."], REFS)
    assert result.bp < 1.0 and result.sys_len == 9 + 0 + 7


def test_an_all_empty_hypothesis_corpus():
    result = assert_equals_sacrebleu(["", "", ""], REFS)
    assert (result.score, result.bp, result.sys_len, result.ref_len) == (0.0, 0.0, 0, 24)
    assert result.precisions == [0.0] * 4 and result.totals == [0] * 4


def test_no_matching_ngrams_at_all():
    result = assert_equals_sacrebleu(["Völlig andere Wörter hier", "nichts", "gar nichts passt"], REFS)
    assert result.score == 0.0 and result.counts == [0, 0, 0, 0] and result.precisions == [0.0] * 4


def test_hypotheses_longer_than_references_have_no_brevity_penalty():
    hyps = [r[:-1] + " and then some more words." for r in REFS]
    result = assert_equals_sacrebleu(hyps, REFS)
    assert result.bp == 1.0 and result.sys_len > result.ref_len


def test_exp_smoothing_of_orders_without_a_match():
    hyps = ["man rides bike street", "dogs play snow girl", "red dress two the"]  # 1- and 2-grams match, 3/4 none
    result = assert_equals_sacrebleu(hyps, REFS)
    assert result.counts == [9, 3, 0, 0] and result.score > 0
    assert result.precisions[2] == pytest.approx(100 / (2 * result.totals[2]), rel=1e-12)  # 1st order without a match
    assert result.precisions[3] == pytest.approx(100 / (4 * result.totals[3]), rel=1e-12)  # 2nd: 1 / (2^2 total)
    geometric = math.exp(sum(math.log(p) for p in result.precisions) / 4)
    assert result.score == pytest.approx(result.bp * geometric, rel=1e-12)


def test_outputs_too_short_for_4grams_score_zero():
    result = assert_equals_sacrebleu(["A man", "Two dogs play", "A girl"], REFS)
    assert result.counts[0] > 0 and result.totals[3] == 0 and result.score == 0.0


def test_parts_by_hand():
    assert brevity_penalty(10, 10) == 1.0 and brevity_penalty(12, 10) == 1.0 and brevity_penalty(0, 5) == 0.0
    assert brevity_penalty(8, 10) == pytest.approx(math.exp(1 - 10 / 8), rel=1e-15)
    # the closest reference length, the shorter one on a tie; clipping by the largest count in any one reference
    refs = ["the cat".split(), "the the x y z".split()]
    assert ngram_stats("the the the".split(), refs, max_n=2) == (3, 2, [2, 1], [3, 2])
    assert ngram_stats(list("abcd"), [list("abc"), list("abcde")])[1] == 3
    perfect = bleu_from_stats(4, 4, [4, 3, 2, 1], [4, 3, 2, 1])
    assert perfect.score == pytest.approx(100.0, rel=1e-12) and (perfect.precisions, perfect.bp) == ([100.0] * 4, 1.0)


def test_bad_input_raises_clear_errors():
    with pytest.raises(ValueError, match="3 hypotheses but a reference stream of 2 lines"):
        corpus_bleu(["a", "b", "c"], ["a", "b"])
    with pytest.raises(ValueError, match="tokenize must be '13a'"):
        corpus_bleu(["a"], ["a"], tokenize="intl")
