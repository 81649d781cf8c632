"""Headless Chromium with no network at all, for the site tests: a page that fetched from a CDN would fail here."""

import shutil
import subprocess
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def dom_offline(
    page: Path, profile: Path, *options: str, budget_ms: int = 10000, timeout: float = 120, check: bool = True
) -> str:
    """The DOM of `page` after headless Chromium ran it for `budget_ms` of virtual time."""
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-quic",
            "--no-first-run",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            f"--user-data-dir={profile}",
            *options,
            f"--virtual-time-budget={budget_ms}",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
    ).stdout
