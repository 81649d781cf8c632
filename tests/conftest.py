"""Shared fixtures: a verified Multi30k cache (primed from ../shared when present)."""

from pathlib import Path

import pytest

from aiayn import data

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "multi30k"


@pytest.fixture(scope="session")
def multi30k_cache() -> Path:
    """The loader's cache folder with every file verified; skips only if the data cannot be had at all."""
    cache = data.cache_dir()
    if SHARED.is_dir():
        data.prime(SHARED, cache)
    try:
        for name in data.SHA256:
            data.fetch(name, cache)
    except data.DataError as err:
        pytest.skip(f"Multi30k is not available offline: {err}")
    return cache
