# Generated from book/11_decoding.ipynb by `python -m aiayn._export`. Edit the chapter, not this file.

# book/11_decoding.ipynb: BLEU, from scratch
"""§6.1's metric: corpus BLEU (Papineni et al., 2002) as sacreBLEU computes
it: 13a tokens, 'exp' smoothing."""
import math
import re
from collections import Counter
from dataclasses import dataclass

# mteval-v13a.pl's language-dependent part, as sacreBLEU writes it
_13A_RULES = [
    # symbols and most punctuation
    (re.compile(r"([\{-\~\[-\` -\&\(-\+\:-\@\/])"), r" \1 "),
    # period and comma, unless after a digit
    (re.compile(r"([^0-9])([\.,])"), r"\1 \2 "),
    # period and comma, unless before a digit
    (re.compile(r"([\.,])([^0-9])"), r" \1 \2"),
    # a dash after a digit
    (re.compile(r"([0-9])(-)"), r"\1 \2 "),
]


def tokenize_13a(line: str) -> str:
    """sacreBLEU's default tokenisation '13a' (WMT's mteval-v13a.pl),
    reimplemented: tokens joined by spaces."""
    line = line.replace("<skipped>", "").replace("-\n", "").replace("\n", " ")
    if "&" in line:
        line = (line.replace("&quot;", '"').replace("&amp;", "&")
                .replace("&lt;", "<").replace("&gt;", ">"))
    line = f" {line} "
    for pattern, replacement in _13A_RULES:
        line = pattern.sub(replacement, line)
    return " ".join(line.split())


# book/11_decoding.ipynb: BLEU, from scratch
def ngrams(tokens: list[str], n: int) -> Counter:
    """The multiset of n-grams (tuples of n consecutive tokens)."""
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def ngram_stats(hypothesis: list[str], references: list[list[str]],
                max_n: int = 4):
    """One sentence's sufficient statistics: (hyp_len, ref_len, matches per
    n, totals per n), n = 1..max_n.

    ref_len is the length of the reference closest to the hypothesis (the
    shorter one on a tie).
    """
    ref_len = min((len(r) for r in references),
                  key=lambda n: (abs(n - len(hypothesis)), n))
    matches, totals = [], []
    for n in range(1, max_n + 1):
        hyp_counts = ngrams(hypothesis, n)
        max_ref = Counter()  # the largest count of each n-gram in any one
        for r in references:  # reference
            max_ref |= ngrams(r, n)
        matches.append(sum(min(c, max_ref[g])  # clipped counts
                           for g, c in hyp_counts.items()))
        totals.append(sum(hyp_counts.values()))
    return len(hypothesis), ref_len, matches, totals


# book/11_decoding.ipynb: BLEU, from scratch
def brevity_penalty(sys_len: int, ref_len: int) -> float:
    """BP = 1 if the output is at least as long as the references, else
    exp(1 - r/c) (0 for an empty output)."""
    if sys_len >= ref_len:
        return 1.0
    return math.exp(1 - ref_len / sys_len) if sys_len > 0 else 0.0


@dataclass
class BLEUScore:
    """A corpus BLEU score (0-100) with its parts: precisions in percent, BP,
    lengths and n-gram counts."""
    score: float
    precisions: list[float]
    bp: float
    sys_len: int
    ref_len: int
    counts: list[int]
    totals: list[int]

    def __str__(self) -> str:
        p = "/".join(f"{x:.1f}" for x in self.precisions)
        return (f"BLEU = {self.score:.2f} {p} (BP = {self.bp:.3f} "
                f"hyp_len = {self.sys_len} ref_len = {self.ref_len})")


def bleu_from_stats(sys_len: int, ref_len: int, matches: list[int],
                    totals: list[int]) -> BLEUScore:
    """Equations (bleu-pn) to (bleu-score) with sacreBLEU's 'exp' smoothing
    of orders that have no match."""
    bp = brevity_penalty(sys_len, ref_len)
    precisions = [0.0] * len(matches)
    counts = sys_len, ref_len, list(matches), list(totals)
    if sum(matches) == 0:  # nothing matches at all: BLEU is 0
        return BLEUScore(0.0, precisions, bp, *counts)
    smooth = 1.0
    for n, (m, total) in enumerate(zip(matches, totals)):
        if total == 0:  # the outputs are too short to have n-grams of this
            break       # order (nor of higher ones)
        if m == 0:  # 'exp': the k-th order without a match gets 1/(2^k total)
            smooth *= 2
            precisions[n] = 100.0 / (smooth * total)
        else:
            precisions[n] = 100.0 * m / total
    if min(precisions) == 0.0:
        score = 0.0
    else:
        log_mean = sum(math.log(p) for p in precisions) / len(precisions)
        score = bp * math.exp(log_mean)
    return BLEUScore(score, precisions, bp, *counts)


def corpus_bleu(hypotheses, references, lowercase: bool = False,
                tokenize: str = "13a", max_n: int = 4) -> BLEUScore:
    """Corpus BLEU equal to ``sacrebleu.corpus_bleu(hypotheses,
    [references])`` (13a tokens, 'exp' smoothing).

    ``references`` holds one string per hypothesis, or, as in sacreBLEU, a
    list of such streams (several references; None leaves a gap).
    ``tokenize="none"`` splits on whitespace only.
    """
    # any iterables, generators too
    hypotheses, references = list(hypotheses), list(references)
    if all(isinstance(r, str) for r in references):
        streams = [references]
    else:
        streams = [list(s) for s in references]
    for s in streams:
        if len(s) != len(hypotheses):
            raise ValueError(
                f"{len(hypotheses)} hypotheses but a reference stream of "
                f"{len(s)} lines; give one reference per hypothesis")
    if tokenize not in ("13a", "none"):
        raise ValueError(f"tokenize must be '13a' (sacreBLEU's default) or "
                         f"'none', got {tokenize!r}")

    def words(line: str) -> list[str]:
        line = line.lower() if lowercase else line
        if tokenize == "13a":
            line = tokenize_13a(line.rstrip())
        return line.split()

    sys_len = ref_len = 0
    matches, totals = [0] * max_n, [0] * max_n
    for i, hyp in enumerate(hypotheses):
        refs = [words(s[i]) for s in streams if s[i] is not None]
        h, r, m, t = ngram_stats(words(hyp), refs, max_n)
        sys_len, ref_len = sys_len + h, ref_len + r
        matches = [a + b for a, b in zip(matches, m)]
        totals = [a + b for a, b in zip(totals, t)]
    return bleu_from_stats(sys_len, ref_len, matches, totals)
