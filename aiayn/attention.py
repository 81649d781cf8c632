import math

import torch
import torch.nn.functional as F


def subsequent_mask(size: int, device=None) -> torch.Tensor:
    """Causal mask (§3.2.3): True where query position i may attend to key position j <= i."""
    return torch.ones(size, size, dtype=torch.bool, device=device).tril()  # (size, size)


def padding_mask(tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """True for real tokens, shaped to broadcast over heads and queries."""
    return (tokens != pad_id)[:, None, None, :]  # (batch, 1, 1, len_k)


def attention(query, key, value, mask=None, dropout_p: float = 0.0):
    """Scaled dot-product attention, Equation (1): softmax(QK^T / sqrt(d_k)) V, returning the weights too.

    ``mask`` is boolean and broadcastable to (..., len_q, len_k): True means "may attend".
    A query whose keys are all masked gets zero weights and a zero output, never NaN.
    """
    d_k = query.size(-1)
    scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)  # (..., len_q, len_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1).nan_to_num(0.0)  # rows with every key masked -> 0
    if dropout_p > 0:
        weights = F.dropout(weights, dropout_p)
    return weights @ value, weights  # (..., len_q, d_v), (..., len_q, len_k)


def attend(query, key, value, mask=None, dropout_p: float = 0.0, need_weights: bool = False):
    """Equation (1) by the fastest route: PyTorch's fused kernel unless the weights are wanted."""
    if need_weights:
        return attention(query, key, value, mask, dropout_p)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout_p)
    if mask is not None:  # match `attention` on fully masked rows
        out = out.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    return out, None
