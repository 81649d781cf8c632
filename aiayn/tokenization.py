# Generated from book/09_data.ipynb by `python -m aiayn._export`. Edit the chapter, not this file.

# book/09_data.ipynb: From text to words: spaCy's tokenisers
"""Tokenisation for §5.1: spaCy words, then one byte-pair-encoding
vocabulary shared by English and German."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Iterable, Sequence

from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import models, trainers

SPACE = "\u2581"  # "▁": the word followed a space (as in SentencePiece)
LANGS = ("en", "de")
_SPACY: dict = {}  # lang -> spaCy's tokeniser, made on first use


# book/09_data.ipynb: From text to words: spaCy's tokenisers
def spacy_tokenizer(lang: str):
    """spaCy's rule-based tokeniser for `lang` ("en" or "de").

    `spacy.blank` needs no model download."""
    if lang not in LANGS:
        raise ValueError(f"unknown language {lang!r}; expected one of {LANGS}")
    if lang not in _SPACY:
        # imported here: a run from the encoded cache (aiayn.corpus)
        # needs no spaCy
        import spacy

        _SPACY[lang] = spacy.blank(lang).tokenizer
    return _SPACY[lang]


def pretokenize(sentence: str, lang: str = "en") -> list[str]:
    """spaCy's words, each prefixed with SPACE if a space preceded it, so
    that the text can be rebuilt exactly."""
    words, space_before = [], False
    for token in spacy_tokenizer(lang)(sentence):
        words.append(
            (SPACE if space_before else "") + token.text.replace(" ", SPACE)
        )
        space_before = bool(token.whitespace_)
    if space_before:  # a trailing space has no next word to carry it
        words.append(SPACE)
    return words


def word_counts(
    sentences: Iterable[str | tuple[str, ...]], langs: Sequence[str] = LANGS
) -> Counter:
    """How often each pre-tokenised word occurs; an item is a sentence in
    langs[0] or a tuple such as (en, de)."""
    counts = Counter()
    for item in sentences:
        for lang, sentence in zip(
            langs, (item,) if isinstance(item, str) else item
        ):
            counts.update(pretokenize(sentence, lang))
    return counts


# book/09_data.ipynb: Subwords: a joint byte-pair encoding
class Tokenizer:
    """Joint BPE over spaCy words with one vocabulary for both languages
    (§5.1; Sennrich et al., 2016)."""

    PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
    pad_id, bos_id, eos_id, unk_id = 0, 1, 2, 3
    # byte fallback: ids 4..259 spell any unknown character
    BYTES = tuple(f"<0x{b:02X}>" for b in range(256))

    def __init__(
        self,
        vocab: dict[str, int],
        merges: Sequence[tuple[str, str]],
        langs: Sequence[str] = LANGS,
    ):
        specials = (self.PAD, self.BOS, self.EOS, self.UNK) + self.BYTES
        misplaced = any(vocab.get(t) != i for i, t in enumerate(specials))
        if misplaced or sorted(vocab.values()) != list(range(len(vocab))):
            raise ValueError(
                "vocab must map the special tokens and the 256 byte tokens "
                "to ids 0..259 and the other tokens to the following ids "
                "without gaps"
            )
        self.vocab, self.langs = dict(vocab), tuple(langs)
        self.merges = [tuple(m) for m in merges]
        self.pieces = sorted(self.vocab, key=self.vocab.get)  # id -> piece
        self._bpe = models.BPE(vocab=self.vocab, merges=self.merges,
                               unk_token=self.UNK, byte_fallback=True)
        self._cache: dict[str, list[int]] = {}

    @classmethod
    def train(
        cls,
        sentences: Iterable[str | tuple[str, ...]],
        vocab_size: int,
        langs: Sequence[str] = LANGS,
    ) -> "Tokenizer":
        """Learn BPE merges from the TRAINING sentences only.

        An item is a sentence in langs[0], or a tuple such as an (en, de)
        pair whose i-th sentence is split into words with the rules of
        langs[i]."""
        return cls.from_word_counts(
            word_counts(sentences, langs), vocab_size, langs
        )

    @classmethod
    def from_word_counts(
        cls, counts: Counter, vocab_size: int, langs: Sequence[str] = LANGS
    ) -> "Tokenizer":
        """Learn BPE merges from word frequencies (from `word_counts`)."""
        if vocab_size <= 260:
            raise ValueError(
                "vocab_size must exceed the 260 special and byte tokens, "
                f"got {vocab_size}"
            )
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            show_progress=False,
            special_tokens=[cls.PAD, cls.BOS, cls.EOS, cls.UNK, *cls.BYTES],
        )
        # no normaliser: the text is kept as it is
        hf = _HFTokenizer(models.BPE(unk_token=cls.UNK))
        hf.train_from_iterator(
            (word for word, n in sorted(counts.items()) for _ in range(n)),
            trainer=trainer,
        )
        model = json.loads(hf.to_str())["model"]
        return cls(model["vocab"], model["merges"], langs)

    def encode(self, sentence: str, lang: str | None = None) -> list[int]:
        """Token ids of `sentence` (no BOS/EOS); `lang` picks spaCy's word
        rules, default langs[0]."""
        return self.encode_words(pretokenize(sentence, lang or self.langs[0]))

    def encode_words(self, words: Iterable[str]) -> list[int]:
        """Token ids of words already split by `pretokenize`; each word's
        segmentation is cached."""
        ids = []
        for word in words:
            if word not in self._cache:
                self._cache[word] = [
                    token.id for token in self._bpe.tokenize(word)
                ]
            ids.extend(self._cache[word])
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids`: PAD, BOS and EOS are skipped, byte tokens are
        reassembled into characters."""
        out, pending = [], bytearray()
        for i in map(int, ids):
            if not 0 <= i < len(self.pieces):
                raise ValueError(
                    f"token id {i} is outside the vocabulary "
                    f"(0..{len(self.pieces) - 1})"
                )
            if 4 <= i < 260:
                pending.append(i - 4)
                continue
            if pending:
                out.append(pending.decode("utf-8", errors="replace"))
                pending.clear()
            if i not in (self.pad_id, self.bos_id, self.eos_id):
                out.append(self.pieces[i])
        out.append(pending.decode("utf-8", errors="replace"))
        return "".join(out).replace(SPACE, " ")

    def tokens(self, sentence: str, lang: str | None = None) -> list[str]:
        """The pieces `encode` produces, as strings (to read segmentations)."""
        return [self.pieces[i] for i in self.encode(sentence, lang)]

    def __len__(self) -> int:
        return len(self.pieces)

    def __eq__(self, other) -> bool:
        mine = (self.vocab, self.merges, self.langs)
        return isinstance(other, Tokenizer) and mine == (
            other.vocab, other.merges, other.langs)

    def save(self, path) -> None:
        """Write the vocabulary and merges to a JSON file."""
        data = {
            "format": "aiayn-bpe",
            "version": 1,
            "langs": list(self.langs),
            "vocab": self.vocab,
            "merges": [list(m) for m in self.merges],
        }
        Path(path).write_text(
            json.dumps(data, ensure_ascii=False), encoding="utf-8"
        )

    @classmethod
    def load(cls, path) -> "Tokenizer":
        """Read a tokenizer written by `save`."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"no tokenizer file at {path}; train one with "
                f"Tokenizer.train(...) and .save({str(path)!r})"
            )
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("format") != "aiayn-bpe":
                raise ValueError("not an aiayn-bpe file")
            return cls(data["vocab"], data["merges"], data["langs"])
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(
                f"{path} is not a valid tokenizer file ({err}); delete it "
                "and train again"
            ) from err


# book/09_data.ipynb: Subwords: a joint byte-pair encoding
def encode_pairs(
    tokenizer: Tokenizer,
    pairs: Iterable[tuple[str, str]],
    langs: tuple[str, str] = ("en", "de"),
) -> list[tuple[list[int], list[int]]]:
    """Token ids of each (source, target) pair; `langs` names the pair's
    languages, ("de", "en") for DE→EN."""
    src_lang, tgt_lang = langs
    return [
        (tokenizer.encode(src, src_lang), tokenizer.encode(tgt, tgt_lang))
        for src, tgt in pairs
    ]


def multi30k_tokenizer(vocab_size: int = 8000, path=None) -> Tokenizer:
    """The book's tokenizer: joint BPE learned on Multi30k's training split;
    cached at `path` if given."""
    from aiayn.data import load

    if path is not None and Path(path).is_file():
        return Tokenizer.load(path)
    tokenizer = Tokenizer.train(load("train"), vocab_size)
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        tokenizer.save(path)
    return tokenizer
