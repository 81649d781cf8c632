"""The encoded cache of §5.1: spaCy's words and the BPE ids, made once and read without spaCy."""

import shutil
import subprocess
import sys

import pytest

from aiayn import corpus, data
from aiayn.tokenization import Tokenizer


@pytest.fixture(scope="module")
def cache(multi30k_cache, tmp_path_factory):
    """A data cache of its own (the verified .gz files), with the words and a BPE-1000 encoding made in it."""
    folder = tmp_path_factory.mktemp("data")
    for name in data.SHA256:
        shutil.copyfile(multi30k_cache / name, folder / name)
    corpus.encoded(1000, folder)
    return folder


def test_the_cache_holds_the_chapter_tokenizer_and_its_ids(cache):
    encoded = corpus.encoded(1000, cache)
    assert encoded.path == corpus.encoded_path(1000, cache) and len(encoded.tokenizer) == 1000
    assert encoded.tokenizer == Tokenizer.train(data.load("train", cache=cache), 1000)  # learned on train only
    assert {split: len(sides["de"]) for split, sides in encoded.ids.items()} == {
        split: n for split, (_, n) in data.SPLITS.items()
    }
    val = data.load("val", cache=cache)
    for (en, de), en_ids, de_ids in list(zip(val, encoded.ids["val"]["en"], encoded.ids["val"]["de"]))[:50]:
        assert en_ids == encoded.tokenizer.encode(en, "en") and de_ids == encoded.tokenizer.encode(de, "de")
    assert encoded.pairs("val", "de-en")[3] == (encoded.ids["val"]["de"][3], encoded.ids["val"]["en"][3])


def test_a_cached_encoding_is_read_without_splitting_a_word(cache, monkeypatch):
    import aiayn.tokenization

    def refuse(*args, **kwargs):
        raise AssertionError("spaCy was asked to split a sentence")

    monkeypatch.setattr(aiayn.tokenization, "pretokenize", refuse)
    assert len(corpus.encoded(1000, cache).tokenizer) == 1000
    other = corpus.encoded(600, cache)  # a new size is learned from the cached words, still without spaCy
    assert len(other.tokenizer) == 600 and corpus.encoded_path(600, cache).is_file()


def test_unreadable_files_are_made_again(cache, capsys):
    path = corpus.encoded_path(1000, cache)
    good = corpus.encoded(1000, cache)
    path.write_bytes(path.read_bytes()[:100])  # as if a copy was cut short
    again = corpus.encoded(1000, cache)
    assert "unreadable" in capsys.readouterr().err and again.tokenizer == good.tokenizer and again.ids == good.ids
    words = corpus.words_path(cache)
    kept = words.read_bytes()
    words.write_bytes(b"not gzip")
    assert corpus.words(cache)["val"]["en"][0] == corpus.words(cache)["val"]["en"][0]
    assert "unreadable" in capsys.readouterr().err and words.read_bytes() == kept  # made again, byte for byte


def test_without_spacy_and_without_words_the_error_says_what_to_do(cache, tmp_path, monkeypatch):
    empty = tmp_path / "data"
    empty.mkdir()
    for name in data.SHA256:
        shutil.copyfile(cache / name, empty / name)
    monkeypatch.setitem(sys.modules, "spacy", None)  # `import spacy` now fails
    with pytest.raises(corpus.CorpusError, match="python -m aiayn.corpus prepare"):
        corpus.encoded(1000, empty)


def test_the_key_is_made_from_the_data_checksums(monkeypatch):
    assert len(corpus.KEY) == 12 and corpus.words_path().name == f"words-{corpus.KEY}.json.gz"
    assert corpus.encoded_path(8000).name == f"bpe8000-{corpus.KEY}.pt"


def test_command_line(cache):
    env = {"AIAYN_DATA": str(cache), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "aiayn.corpus", "prepare", "--bpe-size", "1000"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and "BPE 1000: 1000 tokens, 67092 sentences encoded" in done.stdout
    info = subprocess.run([sys.executable, "-m", "aiayn.corpus", "info"], env=env, capture_output=True, text=True)
    assert f"bpe1000-{corpus.KEY}.pt" in info.stdout and f"words-{corpus.KEY}.json.gz" in info.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "aiayn.corpus", "prepare", "--bpe-size", "100"], env=env, capture_output=True, text=True
    )
    assert bad.returncode == 1 and "must exceed the 260" in bad.stderr
