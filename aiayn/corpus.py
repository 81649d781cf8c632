"""Multi30k encoded once (§5.1): spaCy's words of every split, then a joint BPE tokenizer and the token ids, cached.

Training and evaluation read this cache, so a run needs neither spaCy nor any re-tokenisation (the GPU machine the
book's experiments ran on has no spaCy). Two files, in ``encoded/`` under the data cache (``aiayn.data.cache_dir()``):

    words-<key>.json.gz     spaCy's words of every sentence of every split, each side split by its language's rules
    bpe<size>-<key>.pt      the joint BPE tokenizer of that size (learned on the training split) and
                            every sentence's ids

``<key>`` is made from the SHA256 sums of the data files, so a cache can only be read as the data it was made from.
With the words file present, a tokenizer of any size is learned and applied without spaCy.

    python -m aiayn.corpus prepare --bpe-size 8000 1000   # write the words (needs spaCy, once) and two encodings
    python -m aiayn.corpus info                           # what the cache holds

Not about §5.1 itself: the tokenizer is chapter 9's (aiayn.tokenization). This module only keeps what it makes, once, in
a cache.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from aiayn import data
from aiayn.tokenization import LANGS, Tokenizer

FORMAT = "aiayn-corpus-1"  # change when the words or the encoding of a sentence would change
_IDENTITY = "\n".join([FORMAT, *(f"{n} {d}" for n, d in sorted(data.SHA256.items()))])
KEY = hashlib.sha256(_IDENTITY.encode()).hexdigest()[:12]  # the format and the data's checksums


class CorpusError(RuntimeError):
    """The encoded cache is missing or unreadable where it cannot be rebuilt; the message says what to do."""


def folder(cache: Path | None = None) -> Path:
    """Where the encoded files live: encoded/ in the data cache."""
    return Path(cache or data.cache_dir()) / "encoded"


def words_path(cache: Path | None = None) -> Path:
    return folder(cache) / f"words-{KEY}.json.gz"


def encoded_path(bpe_size: int, cache: Path | None = None) -> Path:
    return folder(cache) / f"bpe{bpe_size}-{KEY}.pt"


def _write(path: Path, payload: bytes) -> None:
    data.write_atomic(path, payload)


def _build_words(cache: Path | None) -> dict:
    from aiayn.tokenization import pretokenize  # spaCy is needed here, and only here

    try:
        import spacy  # noqa: F401
    except ImportError:
        raise CorpusError(
            f"{words_path(cache)} is missing and spaCy is not installed, so the sentences cannot be "
            f"split into words here. Run `python -m aiayn.corpus prepare` on a machine with spaCy and copy "
            f"{folder(cache)} here (or set AIAYN_DATA to a cache that holds it)"
        ) from None
    splits = {}
    for split in data.SPLITS:
        pairs = data.load(split, *LANGS, cache=cache)
        splits[split] = {lang: [pretokenize(s[i], lang) for s in pairs] for i, lang in enumerate(LANGS)}
    content = {"format": FORMAT, "key": KEY, "spacy": spacy.__version__, "splits": splits}
    _write(words_path(cache), gzip.compress(json.dumps(content, ensure_ascii=False).encode("utf-8"), mtime=0))
    return splits


def words(cache: Path | None = None) -> dict[str, dict[str, list[list[str]]]]:
    """split -> lang -> the words of each sentence, as `pretokenize` splits them; read from the cache or made once."""
    path = words_path(cache)
    if path.is_file():
        try:
            content = json.loads(gzip.decompress(path.read_bytes()).decode("utf-8"))
            if content.get("format") == FORMAT and content.get("key") == KEY:
                return content["splits"]
        except (OSError, EOFError, ValueError, KeyError):
            pass
        print(f"{path} is unreadable or not for this data; making it again", file=sys.stderr)
    return _build_words(cache)


@dataclass
class Encoded:
    """The tokenizer of one BPE size and the ids of every sentence: ids[split][lang] is a list of id lists."""

    tokenizer: Tokenizer
    ids: dict[str, dict[str, list[list[int]]]]
    path: Path

    def pairs(self, split: str, direction: str = "en-de") -> list[tuple[list[int], list[int]]]:
        """(source ids, target ids) of every sentence pair of a split, for direction "en-de" or "de-en"."""
        src, tgt = direction.split("-")
        return list(zip(self.ids[split][src], self.ids[split][tgt]))


def _flatten(rows: list[list[int]]) -> dict:
    return {
        "flat": torch.tensor([i for row in rows for i in row], dtype=torch.int32),
        "lengths": torch.tensor([len(row) for row in rows], dtype=torch.int32),
    }


def _unflatten(part: dict) -> list[list[int]]:
    return [t.tolist() for t in part["flat"].split(part["lengths"].tolist())]


def _build_encoded(bpe_size: int, cache: Path | None) -> Encoded:
    sentences = words(cache)
    counts = Counter(w for lang in LANGS for sentence in sentences["train"][lang] for w in sentence)
    tokenizer = Tokenizer.from_word_counts(counts, bpe_size)  # the training split only
    ids = {
        split: {lang: [tokenizer.encode_words(s) for s in sides[lang]] for lang in LANGS}
        for split, sides in sentences.items()
    }
    tokenizer_json = io.StringIO()
    json.dump(
        {"vocab": tokenizer.vocab, "merges": [list(m) for m in tokenizer.merges], "langs": list(tokenizer.langs)},
        tokenizer_json,
        ensure_ascii=False,
    )
    payload = io.BytesIO()
    torch.save(
        {
            "format": FORMAT,
            "key": KEY,
            "bpe_size": bpe_size,
            "tokenizer": tokenizer_json.getvalue(),
            "ids": {split: {lang: _flatten(rows) for lang, rows in sides.items()} for split, sides in ids.items()},
        },
        payload,
    )
    path = encoded_path(bpe_size, cache)
    _write(path, payload.getvalue())
    return Encoded(tokenizer, ids, path)


def encoded(bpe_size: int = 8000, cache: Path | None = None) -> Encoded:
    """Multi30k encoded with a joint BPE vocabulary of `bpe_size`: read from the cache, or made (and written) once."""
    path = encoded_path(bpe_size, cache)
    if path.is_file():
        try:
            content = torch.load(path, map_location="cpu", weights_only=True)
            if content.get("format") == FORMAT and content.get("key") == KEY and content.get("bpe_size") == bpe_size:
                t = json.loads(content["tokenizer"])
                ids = {
                    split: {lang: _unflatten(part) for lang, part in sides.items()}
                    for split, sides in content["ids"].items()
                }
                return Encoded(Tokenizer(t["vocab"], t["merges"], t["langs"]), ids, path)
        except Exception:  # noqa: BLE001  any unreadable file is made again from the words
            pass
        print(f"{path} is unreadable or not for this data; making it again", file=sys.stderr)
    return _build_encoded(bpe_size, cache)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m aiayn.corpus", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="write the words (spaCy, once) and the encodings of the given BPE sizes")
    prep.add_argument("--bpe-size", type=int, nargs="+", default=[8000])
    sub.add_parser("info", help="list the cached files")
    args = p.parse_args(argv)
    try:
        if args.command == "prepare":
            for size in args.bpe_size:
                e = encoded(size)
                n = sum(len(rows) for sides in e.ids.values() for rows in sides.values())
                print(f"BPE {size}: {len(e.tokenizer)} tokens, {n} sentences encoded, {e.path}")
        else:
            files = sorted(folder().glob(f"*-{KEY}.*"))
            print("\n".join(f"{f.stat().st_size / 1e6:6.1f} MB  {f}" for f in files) or f"nothing cached in {folder()}")
    except (CorpusError, data.DataError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
