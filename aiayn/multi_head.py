# Generated from book/03_multi_head.ipynb by `python -m aiayn._export`. Edit the chapter, not this file.

# book/03_multi_head.ipynb: The equations
import torch
from torch import nn

from aiayn.attention import attend


# book/03_multi_head.ipynb: The equations
class MultiHeadAttention(nn.Module):
    """§3.2.2, Figure 2 (right): h heads of Equation (1) on learned
    projections, concatenated, then W^O.

    ``d_k`` defaults to d_model / h and ``d_v`` to d_k, as in the paper;
    Table 3 row (B) varies d_k and keeps d_v. With a ``cache`` dict the
    layer decodes incrementally: self-attention appends the new keys and
    values, cross-attention (``static_kv=True``) projects the encoder
    output once and reuses it.
    """

    def __init__(self, d_model: int, h: int, d_k: int | None = None,
                 P_drop: float = 0.0, d_v: int | None = None):
        super().__init__()
        sizes = [("d_model", d_model), ("h", h)]
        sizes += [(n, v) for n, v in (("d_k", d_k), ("d_v", d_v))
                  if v is not None]
        for name, value in sizes:
            if not isinstance(value, int) or value <= 0:
                raise ValueError(
                    f"{name} must be a positive integer, got {value!r}")
        if not 0.0 <= P_drop < 1.0:
            raise ValueError(f"P_drop must lie in [0, 1), got {P_drop!r}")
        if d_k is None:
            if d_model % h:
                raise ValueError(
                    f"d_model={d_model} is not divisible by h={h}; "
                    "choose h dividing d_model or set d_k")
            d_k = d_model // h
        d_v = d_v or d_k
        self.h, self.d_k, self.d_v, self.P_drop = h, d_k, d_v, P_drop
        self.fused = True  # Equation (1)'s route: see attend (chapter 2)
        # the h matrices W_i^Q side by side, and so on
        self.W_Q = nn.Linear(d_model, h * d_k)
        self.W_K = nn.Linear(d_model, h * d_k)
        self.W_V = nn.Linear(d_model, h * d_v)
        self.W_O = nn.Linear(h * d_v, d_model)

    def split_heads(self, x):  # (batch, len, h * d) -> (batch, h, len, d)
        return x.unflatten(-1, (self.h, -1)).transpose(1, 2)

    def forward(self, query, key, value, mask=None,
                cache: dict | None = None, static_kv: bool = False,
                need_weights: bool = False):
        """Returns the output (batch, len_q, d_model) and, if
        ``need_weights``, the weights (batch, h, len_q, len_k)."""
        q = self.split_heads(self.W_Q(query))  # (batch, h, len_q, d_k)
        if cache is not None and static_kv and "k" in cache:
            # the encoder output, projected at the first step
            k, v = cache["k"], cache["v"]
        else:
            k = self.split_heads(self.W_K(key))  # (batch, h, len_k, d_k)
            v = self.split_heads(self.W_V(value))  # (batch, h, len_k, d_v)
            if cache is not None:
                if not static_kv and "k" in cache:
                    # self-attention: append the new positions
                    k = torch.cat([cache["k"], k], dim=2)
                    v = torch.cat([cache["v"], v], dim=2)
                cache["k"], cache["v"] = k, v
        dropout_p = self.P_drop if self.training else 0.0
        # (batch, h, len_q, d_v)
        out, weights = attend(q, k, v, mask, dropout_p, need_weights,
                              self.fused)
        # (batch, len_q, h * d_v): Concat(head_1, ..., head_h)
        out = out.transpose(1, 2).flatten(-2)
        return self.W_O(out), weights
