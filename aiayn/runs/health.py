"""Signs that a translation run went wrong, read from its outputs (§6.1).

A model can finish training, average its checkpoints and score a BLEU of 2 while ignoring its source: it has learned
the target language, not the translation. The signs are cheap to read and each names what to do:

- most outputs are the same sentence, or few are distinct (the decoder writes one sentence whatever the input);
- the source barely helps: validation NLL with the sources of other sentences is hardly worse than with the right ones;
- the validation perplexity is far above what a converged Multi30k run reaches (under 10).

Not about the model or decoding (aiayn.model, aiayn.decoding): it reads what a finished run wrote, and what its model
says about the validation set.
"""

from __future__ import annotations

from collections import Counter

import torch

from aiayn.training import token_nll

# Thresholds, each far from what a working run shows: on Multi30k test 2016 a trained model's most common output
# covers well under 1% of the sentences and over 95% of them are distinct; with the wrong sources the NLL per token
# rises by several nats.
MOST_COMMON_MAX = 0.10  # the most common output may cover at most this share of the sentences
DISTINCT_MIN = (
    0.90  # at least this share of the outputs must be distinct (a six-layer run that ignored its source: 70%)
)
SOURCE_GAIN_MIN = 0.5  # nats per target token that the right source must be worth
VAL_PPL_MAX = 30.0  # a run that ends above this validation perplexity has not converged


def output_spread(hypotheses: list[str]) -> dict:
    """How alike the outputs are: the most common one, its share, and the share of distinct outputs."""
    if not hypotheses:
        return {"sentences": 0, "distinct": 0.0, "most_common": "", "most_common_share": 0.0}
    text, count = Counter(hypotheses).most_common(1)[0]
    return {
        "sentences": len(hypotheses),
        "distinct": len(set(hypotheses)) / len(hypotheses),
        "most_common": text,
        "most_common_share": count / len(hypotheses),
    }


@torch.no_grad()
def source_gain(model, batches, pad_id: int = 0, seed: int = 0) -> dict:
    """Validation NLL per target token with each batch's own sources, and with the sources rolled by one sentence
    within the batch (each target then reads another sentence's source). A model that uses its source loses
    nats with the wrong one; a model that ignores it loses nothing. Batches are (src, tgt_in, tgt_out)."""
    model.eval()
    device = next(model.parameters()).device
    totals = torch.zeros(3, dtype=torch.float64)
    for src, tgt_in, tgt_out in batches:
        src, tgt_in, tgt_out = (t.to(device) for t in (src, tgt_in, tgt_out))
        if src.size(0) < 2:
            continue
        for k, source in enumerate((src, src.roll(1, dims=0))):
            totals[k] += token_nll(model(source, tgt_in), tgt_out, pad_id).item()
        totals[2] += (tgt_out != pad_id).sum().item()
    if not totals[2]:
        raise ValueError("source_gain needs batches of at least two sentences with target tokens")
    right, wrong = (totals[:2] / totals[2]).tolist()
    return {"nll": right, "nll_wrong_source": wrong, "gain": wrong - right}


def warnings(
    spread: dict | None = None, gain: dict | None = None, val_ppl: float | None = None, split: str = "test"
) -> list[str]:
    """The signs of a failed run, each as a sentence that says what was seen and what to try; empty when none."""
    out = []
    if spread and spread["sentences"]:
        if spread["most_common_share"] > MOST_COMMON_MAX:
            out.append(
                f"outputs collapsed: {spread['most_common_share']:.0%} of the {split} outputs are the same "
                f"sentence ({spread['most_common'][:60]!r}); the model ignores its source. Lower the learning "
                f"rate (--factor) or lengthen the warmup, and train again"
            )
        elif spread["distinct"] < DISTINCT_MIN:
            out.append(
                f"outputs alike: only {spread['distinct']:.0%} of the {split} outputs are distinct; the model "
                f"barely reads its source. Lower the learning rate or train longer"
            )
    if gain and gain["gain"] < SOURCE_GAIN_MIN:
        out.append(
            f"the source is worth only {gain['gain']:.2f} nats per target token (validation NLL "
            f"{gain['nll']:.2f} with the right sources, {gain['nll_wrong_source']:.2f} with another "
            f"sentence's); the model ignores its source"
        )
    if val_ppl is not None and val_ppl > VAL_PPL_MAX:
        out.append(
            f"validation perplexity {val_ppl:.1f} is far above a converged run's (under 10): the run has "
            f"not converged. Train longer, or check the learning rate"
        )
    return out
