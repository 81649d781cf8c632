"""Joint BPE tokenizer of §5.1: special ids, exact round trips, byte fallback, save/load."""

import json

import pytest

from aiayn.tokenization import SPACE, Tokenizer, encode_pairs, pretokenize, word_counts

PAIRS = [
    (
        "Two young, White males are outside near many bushes.",
        "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.",
    ),
    ("A little girl climbing into a wooden playhouse.", "Ein kleines Mädchen klettert in ein Spielhaus aus Holz."),
    ("A man in a blue shirt is standing on a ladder.", "Ein Mann in einem blauen Hemd steht auf einer Leiter."),
    ("Two dogs play in the snow.", "Zwei Hunde spielen im Schnee."),
    ("A woman's dark-haired child sits on a bench.", "Das dunkelhaarige Kind einer Frau sitzt auf einer Bank."),
] * 20


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.train(PAIRS, vocab_size=400)


def test_special_ids(tok):
    assert (Tokenizer.pad_id, Tokenizer.bos_id, Tokenizer.eos_id, Tokenizer.unk_id) == (0, 1, 2, 3)
    assert [tok.vocab[t] for t in ("<pad>", "<s>", "</s>", "<unk>")] == [0, 1, 2, 3]
    assert tok.pieces[:4] == ["<pad>", "<s>", "</s>", "<unk>"]
    assert tok.pieces[4] == "<0x00>" and tok.pieces[259] == "<0xFF>"
    assert len(tok) == 400


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ",
        "Two dogs play in the snow.",
        "Zwei Hunde spielen im Schnee.",
        "  double  spaces and a tab\there ",
        "naïve café — 東京 😀",
        "Ω≈ç√∫ unknown: \u0000\u200b",
        "McDonald's dark-haired",
    ],
)
@pytest.mark.parametrize("lang", ["en", "de"])
def test_round_trip_is_exact(tok, text, lang):
    ids = tok.encode(text, lang)
    assert all(isinstance(i, int) and 0 <= i < len(tok) for i in ids)
    assert tok.decode(ids) == text


def test_empty_string(tok):
    assert tok.encode("") == [] and tok.decode([]) == ""


def test_unknown_characters_use_bytes_not_unk(tok):
    ids = tok.encode("😀")
    assert ids == [4 + b for b in "😀".encode("utf-8")]  # <0xF0> <0x9F> <0x98> <0x80>
    assert Tokenizer.unk_id not in ids


def test_decode_skips_pad_bos_eos(tok):
    ids = tok.encode("Two dogs play.")
    assert tok.decode([1, *ids, 2, 0, 0]) == "Two dogs play."
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([len(tok)])


def test_segmentation(tok):
    assert tok.tokens("Two dogs play in the snow.", "en") == [
        "Two",
        "▁d",
        "o",
        "gs",
        "▁play",
        "▁in",
        "▁",
        "t",
        "he",
        "▁s",
        "n",
        "o",
        "w",
        ".",
    ]
    assert tok.tokens("Two play", "en") == ["Two", SPACE + "play"]


def test_pretokenize_language_rules():
    assert pretokenize("Zwei Kinder im Sand.", "de") == ["Zwei", "▁Kinder", "▁im", "▁Sand", "."]
    assert pretokenize("Zwei Kinder im Sand.", "en") == ["Zwei", "▁Kinder", "▁i", "m", "▁Sand", "."]
    assert pretokenize("a ") == ["a", "▁"]
    with pytest.raises(ValueError, match="unknown language"):
        pretokenize("x", "fr")


def test_word_counts_uses_each_sides_language():
    counts = word_counts([("Two dogs.", "Zwei im Sand.")])
    assert counts == {"Two": 1, "▁dogs": 1, ".": 2, "Zwei": 1, "▁im": 1, "▁Sand": 1}


def test_training_is_deterministic(tok):
    assert Tokenizer.train(PAIRS, vocab_size=400) == tok


def test_save_load_equal(tok, tmp_path):
    path = tmp_path / "bpe.json"
    tok.save(path)
    loaded = Tokenizer.load(path)
    assert loaded == tok
    assert loaded.encode("Zwei Hunde im Schnee.", "de") == tok.encode("Zwei Hunde im Schnee.", "de")


def test_load_missing_and_corrupt(tmp_path):
    with pytest.raises(FileNotFoundError, match="Tokenizer.train"):
        Tokenizer.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a valid tokenizer file"):
        Tokenizer.load(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ValueError, match="not a valid tokenizer file"):
        Tokenizer.load(tmp_path / "other.json")


def test_vocab_size_too_small():
    with pytest.raises(ValueError, match="vocab_size"):
        Tokenizer.train(["a b"], vocab_size=100)


def test_encode_pairs_languages(tok):
    pairs = [("Two dogs.", "Zwei im Sand.")]
    assert encode_pairs(tok, pairs) == [(tok.encode("Two dogs.", "en"), tok.encode("Zwei im Sand.", "de"))]
    swapped = encode_pairs(tok, [(de, en) for en, de in pairs], langs=("de", "en"))
    assert swapped == [(tok.encode("Zwei im Sand.", "de"), tok.encode("Two dogs.", "en"))]


def test_multi30k_round_trip_on_test_sets(multi30k_cache, tmp_path):
    from aiayn.data import load
    from aiayn.tokenization import multi30k_tokenizer

    tok = multi30k_tokenizer(8000, tmp_path / "bpe.json")
    assert len(tok) == 8000 and (tmp_path / "bpe.json").is_file()
    assert multi30k_tokenizer(8000, tmp_path / "bpe.json") == tok
    for split in ("test2016", "test2017", "mscoco2017", "test2018"):
        for src, tgt in load(split):
            assert tok.decode(tok.encode(src, "en")) == src
            assert tok.decode(tok.encode(tgt, "de")) == tgt
