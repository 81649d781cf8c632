import gzip
import shutil

import pytest

from aiayn import data

UNREACHABLE = ("http://127.0.0.1:9/{name}",)  # the discard port: refused at once, as when offline


def test_split_sizes_and_alignment(multi30k_cache):
    expected = {"train": 29000, "val": 1014, "test2016": 1000, "test2017": 1000, "mscoco2017": 461, "test2018": 1071}
    for split, size in expected.items():
        pairs = data.load(split, cache=multi30k_cache, download=False)
        assert len(pairs) == size
        assert all(en and de for en, de in pairs)
    first = data.load("test2016", cache=multi30k_cache, download=False)[0]
    assert first == (
        "A man in an orange hat starring at something.",
        "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.",
    )


def test_lines_are_stripped_and_nbsp_normalised(multi30k_cache):
    for split in data.SPLITS:
        for pair in data.load(split, cache=multi30k_cache, download=False):
            for side in pair:
                assert side == side.strip() and "\u00a0" not in side
    raw = gzip.open(multi30k_cache / "train.de.gz", "rt", encoding="utf-8").read().split("\n")
    assert sum("\u00a0" in line for line in raw) == 44  # the raw file really has them


def test_reverse_direction(multi30k_cache):
    en_de = data.load("val", cache=multi30k_cache, download=False)
    de_en = data.load("val", src="de", tgt="en", cache=multi30k_cache, download=False)
    assert de_en == [(de, en) for en, de in en_de]


def test_corrupt_file_is_fetched_again(multi30k_cache, tmp_path):
    shutil.copyfile(multi30k_cache / "val.en.gz", tmp_path / "val.en.gz")
    (tmp_path / "val.en.gz").write_bytes(b"not the file")
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    shutil.copyfile(multi30k_cache / "val.en.gz", mirror / "val.en.gz")
    path = data.fetch("val.en.gz", tmp_path, urls=("file://" + str(mirror) + "/{name}",), retries=1)
    assert data.sha256(path) == data.SHA256["val.en.gz"]


def test_mirror_is_used_when_the_first_source_fails(multi30k_cache, tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    shutil.copyfile(multi30k_cache / "val.de.gz", mirror / "val.de.gz")
    urls = UNREACHABLE + ("file://" + str(mirror) + "/{name}",)
    path = data.fetch("val.de.gz", tmp_path / "cache", urls=urls, retries=1)
    assert data.sha256(path) == data.SHA256["val.de.gz"]


def test_corrupt_file_is_reported_without_download(tmp_path):
    (tmp_path / "val.en.gz").write_bytes(b"not the file")
    with pytest.raises(data.DataError, match="corrupt"):
        data.fetch("val.en.gz", tmp_path, download=False)


def test_wrong_bytes_from_the_source_are_rejected(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "val.en.gz").write_bytes(b"tampered")
    with pytest.raises(data.DataError, match="checksum mismatch"):
        data.fetch("val.en.gz", tmp_path / "cache", urls=("file://" + str(src) + "/{name}",), retries=1)
    assert not (tmp_path / "cache" / "val.en.gz").exists()


def test_missing_file_offline_gives_clear_error(tmp_path):
    with pytest.raises(data.DataError) as err:
        data.fetch("train.en.gz", tmp_path, urls=UNREACHABLE, retries=2, timeout=2)
    message = str(err.value)
    assert "could not download" in message and "offline" in message
    assert "python -m aiayn.data prime" in message and str(tmp_path) in message
    assert not list(tmp_path.iterdir())  # nothing half-written left behind


def test_unknown_split_and_languages():
    with pytest.raises(data.DataError, match="unknown split"):
        data.load("test2019")
    with pytest.raises(data.DataError, match="'en' and 'de'"):
        data.load("val", src="fr")


def test_prime_refuses_corrupt_source(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "val.en.gz").write_bytes(b"bad")
    with pytest.raises(data.DataError, match="does not match"):
        data.prime(src, tmp_path / "cache")


def test_cache_dir_follows_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("AIAYN_DATA", str(tmp_path))
    assert data.cache_dir() == tmp_path
