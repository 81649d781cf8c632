# Generated from book/02_attention.ipynb by `python -m aiayn._export`. Edit the chapter, not this file.

# book/02_attention.ipynb: The equation
import math

import torch
import torch.nn.functional as F


# book/02_attention.ipynb: The equation
def _allow_empty_rows(mask: torch.Tensor):
    """A query with no key to attend to would divide 0 by 0 in the softmax.

    Let such a row attend everywhere (its result is replaced by zeros
    afterwards) and return (the mask to use, the empty rows).
    """
    if mask.dtype != torch.bool:
        raise TypeError("attention masks are boolean (True = may attend), "
                        f"got dtype {mask.dtype}")
    empty = ~mask.any(dim=-1, keepdim=True)  # (..., len_q, 1)
    return mask | empty, empty


def attention(query, key, value, mask=None, dropout_p: float = 0.0):
    """Scaled dot-product attention, §3.2.1, Equation (1), with the weights.

    softmax(Q K^T / sqrt(d_k)) V. ``mask`` is boolean and broadcasts to
    (..., len_q, len_k): True means "may attend" (§3.2.3). A query whose
    keys are all masked gets zero weights and a zero output, never NaN.
    """
    d_k = query.size(-1)
    scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)  # (..., q, k)
    if mask is not None:
        mask, empty = _allow_empty_rows(mask)
        # the paper's "setting to -inf"
        scores = scores.masked_fill(~mask, float("-inf"))
    # the softmax in fp32 at least, also where autocast makes the scores
    # bf16 or fp16 (as PyTorch's fused kernel computes it)
    at_least_fp32 = torch.promote_types(scores.dtype, torch.float32)
    # (..., len_q, len_k), rows sum to 1
    weights = scores.softmax(dim=-1, dtype=at_least_fp32).to(value.dtype)
    if mask is not None:
        weights = weights.masked_fill(empty, 0.0)
    if dropout_p > 0:
        weights = F.dropout(weights, dropout_p)
    return weights @ value, weights  # (..., len_q, d_v), (..., len_q, len_k)


# book/02_attention.ipynb: Masks: who may attend to whom
def subsequent_mask(size: int, device=None) -> torch.Tensor:
    """Causal mask, §3.2.3: True where query i may attend to key j, j <= i."""
    ones = torch.ones(size, size, dtype=torch.bool, device=device)
    return ones.tril()  # (size, size)


def padding_mask(tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """True for real tokens, False for padding; broadcasts over heads and
    queries."""
    return (tokens != pad_id)[:, None, None, :]  # (batch, 1, 1, len_k)


# book/02_attention.ipynb: The fast path
def attend(query, key, value, mask=None, dropout_p: float = 0.0,
           need_weights: bool = False, fused: bool = True):
    """Equation (1) through PyTorch's fused kernel, unless the weights are
    wanted or ``fused`` is False: then as ``attention`` writes it out.

    Returns (output, weights) if ``need_weights``, else (output, None).
    Masks as in ``attention``.
    """
    if need_weights or not fused:
        out, weights = attention(query, key, value, mask, dropout_p)
        return out, (weights if need_weights else None)
    sdpa = F.scaled_dot_product_attention
    if mask is None:
        return sdpa(query, key, value, dropout_p=dropout_p), None
    mask, empty = _allow_empty_rows(mask)
    out = sdpa(query, key, value, attn_mask=mask, dropout_p=dropout_p)
    return out.masked_fill(empty, 0.0), None  # (..., len_q, d_v)
