# Generated from book/06_positional_encoding.ipynb by `python -m aiayn._export`. Edit the chapter, not this file.

# book/06_positional_encoding.ipynb: The sinusoids
import math

import torch
from torch import nn


# book/06_positional_encoding.ipynb: The sinusoids
def sinusoidal_encoding(max_len: int, d_model: int) -> torch.Tensor:
    """§3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d_model)),
    PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))."""
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    inv_freq = torch.exp(two_i * (-math.log(10000.0) / d_model))  # omega_i
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * inv_freq)
    pe[:, 1::2] = torch.cos(pos * inv_freq)[:, : d_model // 2]
    return pe.float()  # (max_len, d_model)


# book/06_positional_encoding.ipynb: $PE_{pos+k}$ is a linear function of $P...
def shift_matrix(k: int, d_model: int) -> torch.Tensor:
    """§3.5: the block-diagonal rotation M_k with PE[pos + k] = M_k @ PE[pos]
    for every pos (even d_model)."""
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    angle = k * torch.exp(two_i * (-math.log(10000.0) / d_model))
    cos, sin = torch.cos(angle), torch.sin(angle)  # (d_model / 2,)
    rows = torch.stack([cos, sin], -1), torch.stack([-sin, cos], -1)
    blocks = torch.stack(rows, -2)  # (d_model / 2, 2, 2)
    return torch.block_diag(*blocks).float()  # (d_model, d_model)


# book/06_positional_encoding.ipynb: The layer: add, then dropout
class PositionalEncoding(nn.Module):
    """§3.5 and §5.4: add position information to the embeddings, then
    apply dropout to the sum.

    ``learned=True`` is Table 3 row (E): a trained embedding per position
    instead of sinusoids.
    """

    def __init__(self, d_model: int, max_len: int, P_drop: float = 0.0,
                 learned: bool = False):
        super().__init__()
        self.max_len = max_len
        self.dropout = nn.Dropout(P_drop)
        if learned:  # (max_len, d_model)
            table = torch.randn(max_len, d_model) * d_model**-0.5
            self.pe = nn.Parameter(table)
        else:
            self.register_buffer("pe", sinusoidal_encoding(max_len, d_model),
                                 persistent=False)

    def forward(self, x, start: int = 0):
        """x: (batch, len, d_model); start > 0 when decoding step by step."""
        end = start + x.size(1)
        if end > self.max_len:
            raise ValueError(
                f"sequence of length {end} exceeds max_len={self.max_len}; "
                "shorten the input or build the model with a larger max_len")
        return self.dropout(x + self.pe[start:end])
