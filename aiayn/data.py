"""Multi30k task 1, English-German (Elliott et al., 2016): download, verify, cache and read (§5.1).

Files are fetched once from the ``multi30k/dataset`` repository (pinned commit), checked against
SHA256 sums, and kept in a cache folder: ``$AIAYN_DATA`` if set, else ``~/.cache/aiayn/multi30k``.

    python -m aiayn.data prime DIR   # fill the cache from a folder holding the .gz files (offline)
    python -m aiayn.data fetch       # download every file into the cache and verify it

Not about §5.1 itself: the tokenizer and the batches are chapter 9's (aiayn.tokenization, aiayn.batching). This module
only fetches, checks and reads the files.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import os
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

COMMIT = "a3d2e0d26b56f3846f66a952536ffed4e401d05a"
URLS = (  # canonical source first, then a mirror of the same commit
    f"https://raw.githubusercontent.com/multi30k/dataset/{COMMIT}/data/task1/raw/{{name}}",
    f"https://cdn.jsdelivr.net/gh/multi30k/dataset@{COMMIT}/data/task1/raw/{{name}}",
)
SPLITS = {  # our name -> file stem, with the number of sentence pairs
    "train": ("train", 29000),
    "val": ("val", 1014),
    "test2016": ("test_2016_flickr", 1000),
    "test2017": ("test_2017_flickr", 1000),
    "mscoco2017": ("test_2017_mscoco", 461),
    "test2018": ("test_2018_flickr", 1071),
}
LANGS = ("en", "de")
SHA256 = {
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2017_flickr.de.gz": "a2c89666db00c495cd8513b9d708d5a3acc205d7de312ef2bf5fb7ebc1540aee",
    "test_2017_flickr.en.gz": "76a444ee25172e72695cddb13ae4a3bda59430617be88e0bb46b60504f054074",
    "test_2017_mscoco.de.gz": "799e4854c25d601cb6cb6be29eabe5667734c61ace2f495e03e429031a0bc338",
    "test_2017_mscoco.en.gz": "aab300bfb4427697987e02cd0aacd44bfe8aa50456231b6474c08038bbed2b58",
    "test_2018_flickr.de.gz": "ddd0130c7d97482dc5197a02141dae8dd79f20f03586c480d675c09a32daf608",
    "test_2018_flickr.en.gz": "ef4f4844037d4c5dea75c9a8ed5fd78905967a26f67c255e230cc9780032654d",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
}


class DataError(RuntimeError):
    """A Multi30k file is missing, corrupt, or could not be downloaded; the message says what to do."""


def cache_dir() -> Path:
    """The cache folder: ``$AIAYN_DATA`` if set, else ``~/.cache/aiayn/multi30k``."""
    return Path(os.environ.get("AIAYN_DATA") or Path.home() / ".cache" / "aiayn" / "multi30k")


def pretrained_dir() -> Path:
    """Where downloaded models are kept (aiayn.pretrained): ``$AIAYN_PRETRAINED`` if set, else
    ``~/.cache/aiayn/pretrained``."""
    return Path(os.environ.get("AIAYN_PRETRAINED") or Path.home() / ".cache" / "aiayn" / "pretrained")


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def download(urls, sha256_hex: str, dest: Path, retries: int = 3, timeout: float = 30.0) -> list[str]:
    """Write to `dest` (atomically) the bytes of the first address in `urls` whose SHA256 is `sha256_hex`, trying
    each address up to `retries` times with a growing pause. Returns [] on success, else why each address failed."""
    errors = []
    for url in urls:
        for attempt in range(1, retries + 1):
            try:
                with urllib.request.urlopen(url, timeout=timeout) as response:
                    payload = response.read()
                if hashlib.sha256(payload).hexdigest() == sha256_hex:
                    write_atomic(dest, payload)
                    return []
                errors.append(f"{url}: checksum mismatch (the SHA256 is not the expected {sha256_hex[:12]}…)")
                break  # the same URL would return the same wrong bytes
            except OSError as err:
                if attempt == retries:
                    errors.append(f"{url}: {err} ({retries} attempts)")
                else:
                    time.sleep(min(2**attempt, 8))
    return errors


def _download(name: str, dest: Path, urls, retries: int, timeout: float) -> None:
    errors = download([template.format(name=name) for template in urls], SHA256[name], dest, retries, timeout)
    if errors:
        raise DataError(
            f"could not download Multi30k file {name!r}:\n  " + "\n  ".join(errors) + "\n"
            f"If this machine is offline, copy the Multi30k task-1 .gz files into {dest.parent} "
            f"(or run `python -m aiayn.data prime DIR` with a folder that holds them), "
            f"or set AIAYN_DATA to such a folder."
        )


def write_atomic(dest: Path, payload: bytes) -> None:
    """Write through a temporary file in the same folder, renamed over `dest`: never half written."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=dest.parent, delete=False, suffix=".part") as tmp:
        tmp.write(payload)
    os.replace(tmp.name, dest)


def fetch(
    name: str, cache: Path | None = None, download: bool = True, urls=URLS, retries: int = 3, timeout: float = 30.0
) -> Path:
    """Return the path of a verified cached file, downloading it (again) when missing or corrupt."""
    if name not in SHA256:
        raise DataError(f"unknown Multi30k file {name!r}; expected one of {sorted(SHA256)}")
    path = Path(cache or cache_dir()) / name
    if path.exists():
        if sha256(path) == SHA256[name]:
            return path
        if not download:
            raise DataError(
                f"{path} is corrupt (SHA256 mismatch). Delete it and run again with network "
                f"access, or copy a good copy there (`python -m aiayn.data prime DIR`)."
            )
        path.unlink()
    elif not download:
        raise DataError(
            f"{path} is missing. Run `python -m aiayn.data fetch` with network access, "
            f"or `python -m aiayn.data prime DIR` with a folder that holds the .gz files."
        )
    _download(name, path, urls, retries, timeout)
    return path


def read_lines(path: Path) -> list[str]:
    """One sentence per line; U+00A0 becomes a space, and leading/trailing whitespace is stripped."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.replace("\u00a0", " ").strip() for line in f]


def load(
    split: str, src: str = "en", tgt: str = "de", cache: Path | None = None, download: bool = True
) -> list[tuple[str, str]]:
    """The aligned (source, target) sentence pairs of one split, e.g. ``load("test2016")``."""
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    if {src, tgt} != set(LANGS):
        raise DataError(f"src and tgt must be 'en' and 'de' in some order, got {src!r}, {tgt!r}")
    stem, size = SPLITS[split]
    sides = [read_lines(fetch(f"{stem}.{lang}.gz", cache, download)) for lang in (src, tgt)]
    if not len(sides[0]) == len(sides[1]) == size:
        raise DataError(f"{split}: expected {size} aligned lines, found {len(sides[0])} and {len(sides[1])}")
    return list(zip(*sides))


def prime(source: Path, cache: Path | None = None) -> list[str]:
    """Copy every Multi30k file found in ``source`` into the cache after verifying its checksum."""
    cache = Path(cache or cache_dir())
    cache.mkdir(parents=True, exist_ok=True)
    copied = []
    for name, digest in SHA256.items():
        src_file = Path(source) / name
        if not src_file.exists():
            continue
        if sha256(src_file) != digest:
            raise DataError(f"{src_file} does not match its SHA256 sum; it will not be copied")
        if not (cache / name).exists() or sha256(cache / name) != digest:
            shutil.copyfile(src_file, cache / name)
        copied.append(name)
    return copied


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fetch or prime the Multi30k cache.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch", help="download and verify every file")
    p = sub.add_parser("prime", help="copy verified files from a local folder into the cache")
    p.add_argument("source", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "prime":
            names = prime(args.source)
            print(f"{len(names)} of {len(SHA256)} files verified in {cache_dir()}")
            return 0 if len(names) == len(SHA256) else 1
        for name in SHA256:
            fetch(name)
        print(f"all {len(SHA256)} files verified in {cache_dir()}")
        return 0
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
