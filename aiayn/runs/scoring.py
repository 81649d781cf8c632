"""How a finished run is scored and checked: cased sacreBLEU and the literature's lowercased Moses-tokenised BLEU, the
length of test 2016's references against Wu et al.'s count, and the signs of a failed run (``aiayn.runs.health``).

Not about the paper's BLEU itself: chapter 11 (``aiayn.bleu``) writes corpus BLEU from its definition; this module only
calls sacreBLEU the way the literature's tables were made, and keeps the chapter's figure beside it.
"""

from __future__ import annotations

from sacrebleu.metrics import BLEU

from aiayn import bleu, data
from aiayn.runs import health
from aiayn.runs.config import ExperimentError

WU_REF_LEN = 12103  # test 2016 German references, lowercased and Moses-tokenised (Wu et al., 2021)


def moses_tokenize(lines, lang: str) -> list[str]:
    """The literature's preprocessing: lowercase, then Moses-tokenise (sacremoses defaults) for ``lang``."""
    try:
        from sacremoses import MosesTokenizer
    except ImportError:
        raise ExperimentError("the lowercased Moses-tokenised BLEU needs sacremoses: pip install sacremoses") from None
    tokenizer = MosesTokenizer(lang=lang)
    return [tokenizer.tokenize(line.lower(), return_str=True) for line in lines]


def score(hypotheses: list[str], references: list[str], lang: str) -> dict:
    """Cased sacreBLEU (13a) with its signature, and lowercased Moses-tokenised BLEU (tokenize="none")."""
    out = {}
    for name, metric, hyps, refs in (
        ("sacrebleu", BLEU(), hypotheses, references),
        (
            "tok_lc",
            BLEU(tokenize="none", force=True),
            moses_tokenize(hypotheses, lang),
            moses_tokenize(references, lang),
        ),
    ):
        s = metric.corpus_score(hyps, [refs])
        out[name] = {
            "score": s.score,
            "signature": str(metric.get_signature()),
            "precisions": s.precisions,
            "bp": s.bp,
            "sys_len": s.sys_len,
            "ref_len": s.ref_len,
            "text": str(s),
        }
    out["sacrebleu"]["aiayn_bleu"] = bleu.corpus_bleu(hypotheses, references).score  # the chapter's own BLEU
    return out


def check_reference_length() -> dict:
    """Tokens of the lowercased Moses-tokenised test 2016 German references; Wu et al. report 12,103."""
    refs = [de for _, de in data.load("test2016", "en", "de")]
    n = sum(len(line.split()) for line in moses_tokenize(refs, "de"))
    return {"test2016_de_tokens": n, "expected": WU_REF_LEN, "ok": n == WU_REF_LEN}


def run_checks(model, val_batches, val: dict, hypotheses: dict[str, list[str]]) -> dict:
    """The signs of a failed run (aiayn.runs.health): how alike each split's outputs are, what the source is worth on
    validation, and the validation perplexity; ``warnings`` lists the ones that fail."""
    spread = {split: health.output_spread(hyps) for split, hyps in hypotheses.items()}
    gain = health.source_gain(model, val_batches)
    warnings = [w for split, s in spread.items() for w in health.warnings(spread=s, split=split)]
    warnings += health.warnings(gain=gain, val_ppl=val["ppl"])
    return {"outputs": spread, "source": gain, "warnings": warnings}
