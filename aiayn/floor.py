# Generated from book/12_results.ipynb by `python -m aiayn._export`. Edit the chapter, not this file.

# book/12_results.ipynb: The floor: PyTorch's own layers
"""The floor of §6.1: PyTorch's own nn.Transformer layers inside the book's
model, trained and evaluated alike."""
import torch
from torch import nn

from aiayn.embeddings import Embeddings
from aiayn.model import TransformerConfig, _init_weights
from aiayn.positional import PositionalEncoding


class TorchTransformer(nn.Module):
    """nn.Transformer's encoder and decoder layers with the book's shared
    embeddings (× √d_model), positional encoding and tied pre-softmax
    weights. Same interface as aiayn.model.Transformer, without a key/value
    cache."""

    def __init__(self, c: TransformerConfig):
        super().__init__()
        self.config = c
        self.embed = Embeddings(c.vocab_size, c.d_model)
        self.src_pe = PositionalEncoding(c.d_model, c.max_len, c.P_drop,
                                         c.learned_positions)
        self.tgt_pe = PositionalEncoding(c.d_model, c.max_len, c.P_drop,
                                         c.learned_positions)
        self.core = nn.Transformer(c.d_model, c.h, c.N, c.N, c.d_ff,
                                   c.P_drop, batch_first=True,
                                   norm_first=c.norm_first)
        for layer in self.core.modules():  # dropout inside the sublayers
            if isinstance(layer, nn.MultiheadAttention):
                layer.dropout = c.inner_drop
            elif isinstance(layer, (nn.TransformerEncoderLayer,
                                    nn.TransformerDecoderLayer)):
                layer.dropout.p = c.inner_drop  # the FFN's hidden units
        # the prototype nested-tensor path warns at inference; padding masks
        # do the same work
        self.core.encoder.use_nested_tensor = False
        self.generator = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.generator.weight = self.embed.lut.weight
        _init_weights(self)  # the same initialisation as make_model

    def encode(self, src):
        """src (batch, S) -> memory (batch, S, d_model) and the padding mask
        (batch, S), True at padding."""
        padding = src == self.config.pad_id
        memory = self.core.encoder(self.src_pe(self.embed(src)),
                                   src_key_padding_mask=padding)
        return memory, padding

    def decode(self, tgt, memory, padding, cache=None, start: int = 0):
        """tgt (batch, T) -> decoder output (batch, T, d_model); the whole
        prefix every time (no cache)."""
        if cache is not None:
            raise ValueError("TorchTransformer has no key/value cache; "
                             "new_cache() returns None, decode without one")
        causal = nn.Transformer.generate_square_subsequent_mask(
            tgt.size(1), device=tgt.device, dtype=torch.bool)
        return self.core.decoder(
            self.tgt_pe(self.embed(tgt), start), memory, tgt_mask=causal,
            tgt_is_causal=True, tgt_key_padding_mask=tgt == self.config.pad_id,
            memory_key_padding_mask=padding)

    def new_cache(self):
        return None  # beam search then recomputes the prefix at every step

    def forward(self, src, tgt):
        """Teacher forcing: logits (batch, T, vocab)."""
        memory, padding = self.encode(src)
        return self.generator(self.decode(tgt, memory, padding))


def build(config: TransformerConfig, layers: str = "aiayn") -> nn.Module:
    """The book's model ("aiayn") or the same model on PyTorch's layers
    ("torch"), freshly initialised."""
    from aiayn.model import make_model

    if layers == "aiayn":
        return make_model(config)
    if layers == "torch":
        return TorchTransformer(config)
    raise ValueError(f"layers must be 'aiayn' or 'torch', got {layers!r}")
