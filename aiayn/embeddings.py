# Generated from book/05_embeddings.ipynb by `python -m aiayn._export`. Edit the chapter, not this file.

# book/05_embeddings.ipynb: The embedding layer
import math

from torch import nn


# book/05_embeddings.ipynb: The embedding layer
class Embeddings(nn.Module):
    """§3.4: learned token embeddings, multiplied by sqrt(d_model)."""

    def __init__(self, vocab_size: int, d_model: int,
                 pad_id: int | None = None):
        super().__init__()
        self.d_model = d_model
        # the table E, (vocab_size, d_model)
        self.lut = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)

    def forward(self, tokens):  # (batch, len) -> (batch, len, d_model)
        return self.lut(tokens) * math.sqrt(self.d_model)
