# Generated from book/07_model.ipynb by `python -m aiayn._export`. Edit the chapter, not this file.

# book/07_model.ipynb: §3.1 Encoder and decoder stacks: the full model
from dataclasses import dataclass, replace

from torch import nn

from aiayn.attention import padding_mask, subsequent_mask
from aiayn.embeddings import Embeddings
from aiayn.feed_forward import PositionwiseFeedForward
from aiayn.multi_head import MultiHeadAttention
from aiayn.positional import PositionalEncoding


# book/07_model.ipynb: The configuration
@dataclass(frozen=True)
class TransformerConfig:
    """Hyperparameters with the paper's names (Table 3).

    ``d_k=None`` means d_model / h; ``d_v=None`` means d_k.
    """

    vocab_size: int = 37000
    N: int = 6
    d_model: int = 512
    d_ff: int = 2048
    h: int = 8
    d_k: int | None = None
    d_v: int | None = None
    P_drop: float = 0.1
    # dropout inside the sublayers, on the attention weights and the FFN's
    # hidden activations, which the paper does not describe (tensor2tensor's
    # attention_dropout and relu_dropout): None means P_drop, as the book's
    # recipes train; 0.0 keeps dropout where §5.4 puts it alone
    P_drop_inner: float | None = None
    eps_ls: float = 0.1
    max_len: int = 512
    learned_positions: bool = False
    # False: post-LN as in the paper; True: pre-LN (an option, see §3.1)
    norm_first: bool = False
    tie_weights: bool = True  # three-way tying, §3.4
    pad_id: int = 0

    def __post_init__(self):
        for name in ("vocab_size", "N", "d_model", "d_ff", "h", "max_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(
                    f"{name} must be a positive integer, got {value!r}")
        if self.d_k is None and self.d_model % self.h:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by h={self.h}; "
                "choose h dividing d_model, or set d_k explicitly")
        for name in ("d_k", "d_v"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int)
                                      or value <= 0):
                raise ValueError(
                    f"{name} must be a positive integer or None, "
                    f"got {value!r}")
        for name in ("P_drop", "eps_ls", "P_drop_inner"):
            value = getattr(self, name)
            if not (value is None and name == "P_drop_inner"
                    or isinstance(value, (int, float))
                    and 0.0 <= value < 1.0):
                raise ValueError(f"{name} must lie in [0, 1), got {value!r}")
        if not 0 <= self.pad_id < self.vocab_size:
            raise ValueError(
                f"pad_id={self.pad_id} is not a token id of a vocabulary "
                f"of {self.vocab_size}")

    @property
    def inner_drop(self) -> float:
        """The dropout on attention weights and FFN hidden activations."""
        return self.P_drop if self.P_drop_inner is None else self.P_drop_inner

    def replace(self, **changes) -> "TransformerConfig":
        """A copy with some fields changed (and checked again)."""
        return replace(self, **changes)


# book/07_model.ipynb: The configuration
PRESETS = {
    "base": TransformerConfig(),
    "big": TransformerConfig(d_model=1024, d_ff=4096, h=16, P_drop=0.3),
    "multi30k": TransformerConfig(vocab_size=8000, N=4, d_model=256,
                                  d_ff=1024, h=4, P_drop=0.3, max_len=256),
}


# book/07_model.ipynb: Residual connection and layer normalisation
class SublayerConnection(nn.Module):
    """§3.1: LayerNorm(x + Dropout(Sublayer(x))) (post-LN); pre-LN computes
    x + Dropout(Sublayer(LayerNorm(x)))."""

    def __init__(self, d_model: int, P_drop: float, norm_first: bool = False):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(P_drop)
        self.norm_first = norm_first

    def forward(self, x, sublayer):
        """x: (batch, len, d_model); sublayer maps it to the same shape."""
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


# book/07_model.ipynb: The encoder and decoder layers
class EncoderLayer(nn.Module):
    """§3.1: multi-head self-attention, then the position-wise FFN, each
    wrapped in a SublayerConnection."""

    def __init__(self, c: TransformerConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(c.d_model, c.h, c.d_k,
                                            c.inner_drop, c.d_v)
        self.feed_forward = PositionwiseFeedForward(c.d_model, c.d_ff,
                                                    c.inner_drop)
        self.sublayer = nn.ModuleList(
            SublayerConnection(c.d_model, c.P_drop, c.norm_first)
            for _ in range(2))

    def forward(self, x, src_mask):
        """x: (batch, S, d_model), src_mask: (batch, 1, 1, S)."""
        x = self.sublayer[0](x, lambda x: self.self_attn(x, x, x, src_mask)[0])
        return self.sublayer[1](x, self.feed_forward)


# book/07_model.ipynb: The encoder and decoder layers
class DecoderLayer(nn.Module):
    """§3.1: masked self-attention, attention over the encoder output, then
    the FFN."""

    def __init__(self, c: TransformerConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(c.d_model, c.h, c.d_k,
                                            c.inner_drop, c.d_v)
        self.src_attn = MultiHeadAttention(c.d_model, c.h, c.d_k,
                                           c.inner_drop, c.d_v)
        self.feed_forward = PositionwiseFeedForward(c.d_model, c.d_ff,
                                                    c.inner_drop)
        self.sublayer = nn.ModuleList(
            SublayerConnection(c.d_model, c.P_drop, c.norm_first)
            for _ in range(3))

    def forward(self, x, memory, src_mask, tgt_mask,
                cache: dict | None = None):  # x: (batch, T, d_model)
        self_cache = src_cache = None
        if cache is not None:
            self_cache = cache.setdefault("self", {})
            src_cache = cache.setdefault("src", {})
        x = self.sublayer[0](x, lambda x: self.self_attn(
            x, x, x, tgt_mask, cache=self_cache)[0])
        x = self.sublayer[1](x, lambda x: self.src_attn(
            x, memory, memory, src_mask, cache=src_cache, static_kv=True)[0])
        return self.sublayer[2](x, self.feed_forward)


# book/07_model.ipynb: The stacks
class Encoder(nn.Module):
    """A stack of N identical encoder layers (pre-LN adds a final
    LayerNorm)."""

    def __init__(self, c: TransformerConfig):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(c) for _ in range(c.N))
        self.norm = nn.LayerNorm(c.d_model) if c.norm_first else nn.Identity()

    def forward(self, x, src_mask):  # (batch, S, d_model) -> the same shape
        for layer in self.layers:
            x = layer(x, src_mask)
        return self.norm(x)


class Decoder(nn.Module):
    """A stack of N identical decoder layers (pre-LN adds a final
    LayerNorm)."""

    def __init__(self, c: TransformerConfig):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.N))
        self.norm = nn.LayerNorm(c.d_model) if c.norm_first else nn.Identity()

    def forward(self, x, memory, src_mask, tgt_mask,
                cache: list | None = None):  # x: (batch, T, d_model)
        for i, layer in enumerate(self.layers):
            layer_cache = None if cache is None else cache[i]
            x = layer(x, memory, src_mask, tgt_mask, layer_cache)
        return self.norm(x)


# book/07_model.ipynb: The full model
class Transformer(nn.Module):
    """Figure 1: the encoder-decoder model, with source, target and
    pre-softmax weights tied (§3.4)."""

    def __init__(self, c: TransformerConfig):
        super().__init__()
        self.config = c
        self.src_embed = Embeddings(c.vocab_size, c.d_model)
        self.tgt_embed = (self.src_embed if c.tie_weights
                          else Embeddings(c.vocab_size, c.d_model))
        self.src_pe = PositionalEncoding(c.d_model, c.max_len, c.P_drop,
                                         c.learned_positions)
        self.tgt_pe = PositionalEncoding(c.d_model, c.max_len, c.P_drop,
                                         c.learned_positions)
        self.encoder = Encoder(c)
        self.decoder = Decoder(c)
        # the pre-softmax linear transformation
        self.generator = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_weights:
            self.generator.weight = self.src_embed.lut.weight

    def encode(self, src):
        """src (batch, S) -> memory (batch, S, d_model) and the source
        padding mask (batch, 1, 1, S)."""
        src_mask = padding_mask(src, self.config.pad_id)  # (batch, 1, 1, S)
        x = self.src_pe(self.src_embed(src))
        return self.encoder(x, src_mask), src_mask

    def decode(self, tgt, memory, src_mask, cache: list | None = None,
               start: int = 0):
        """tgt (batch, T) -> decoder output (batch, T, d_model). With a
        cache, tgt holds only the new positions."""
        T = tgt.size(1)
        if cache is None:  # causal and padding mask over the whole prefix
            real = (tgt != self.config.pad_id)[:, None, None, :]
            # (batch, 1, T, T)
            tgt_mask = subsequent_mask(T, tgt.device) & real
        elif T == 1:  # one new token sees every cached position and itself
            tgt_mask = None
        else:  # several new tokens after `start` cached ones: (T, start + T)
            tgt_mask = subsequent_mask(start + T, tgt.device)[start:]
        x = self.tgt_pe(self.tgt_embed(tgt), start)
        return self.decoder(x, memory, src_mask, tgt_mask, cache)

    def new_cache(self) -> list:
        """One empty key/value cache per decoder layer, for incremental
        decoding."""
        return [{} for _ in range(self.config.N)]

    def forward(self, src, tgt):
        """Teacher forcing: logits (batch, T, vocab) for next-token
        prediction at every target position."""
        memory, src_mask = self.encode(src)
        return self.generator(self.decode(tgt, memory, src_mask))


# book/07_model.ipynb: Initialisation
def _init_weights(model: nn.Module) -> None:
    """Embedding tables N(0, 1/d_model) (tensor2tensor), W^Q, W^K, W^V
    Xavier-uniform with gain 1/sqrt(2) (fairseq), every other matrix
    Xavier-uniform; biases zero."""
    for name, p in model.named_parameters():
        if name.endswith("lut.weight"):  # the (shared) embedding table
            nn.init.normal_(p, 0.0, p.size(-1) ** -0.5)
        elif name.endswith(("W_Q.weight", "W_K.weight", "W_V.weight")):
            nn.init.xavier_uniform_(p, gain=2**-0.5)
        elif p.dim() > 1 and not name.endswith("pe"):
            nn.init.xavier_uniform_(p)
        elif name.endswith("bias"):
            nn.init.zeros_(p)


def make_model(config: TransformerConfig | str = "base",
               **overrides) -> Transformer:
    """Build a Transformer from a config or a preset name ("base", "big",
    "multi30k")."""
    if isinstance(config, str):
        if config not in PRESETS:
            raise ValueError(f"unknown preset {config!r}; "
                             f"choose one of {', '.join(PRESETS)}")
        config = PRESETS[config]
    config = config.replace(**overrides) if overrides else config
    model = Transformer(config)
    _init_weights(model)
    return model


# book/07_model.ipynb: A model summary
def count_parameters(model: nn.Module) -> int:
    """Trainable parameters, each shared tensor counted once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def parameter_count(c: TransformerConfig) -> int:
    """The closed form of count_parameters(make_model(c)): embeddings plus
    N encoder and N decoder layers."""
    d, dk = c.d_model, (c.d_k or c.d_model // c.h)
    dv = c.d_v or dk
    # W_Q and W_K, then W_V, then W_O, with biases
    attn = (2 * (d * c.h * dk + c.h * dk) + (d * c.h * dv + c.h * dv)
            + (c.h * dv * d + d))
    ffn = d * c.d_ff + c.d_ff + c.d_ff * d + d
    norm = 2 * d
    embed = c.vocab_size * d * (1 if c.tie_weights else 3)
    learned_pe = 2 * c.max_len * d if c.learned_positions else 0
    final_norms = 2 * norm if c.norm_first else 0
    encoder = c.N * (attn + ffn + 2 * norm)
    decoder = c.N * (2 * attn + ffn + 3 * norm)
    return embed + learned_pe + encoder + decoder + final_norms
