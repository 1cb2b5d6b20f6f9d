"""Filling a disk for the full-disk tests (the disk is the ``small_tmpfs`` fixture's)."""

from __future__ import annotations

import errno
from pathlib import Path


def fill_disk(path: Path) -> None:
    """Write ``path`` until the disk holding it has no byte left."""
    with open(path, "wb", buffering=0) as f:
        for chunk in (1 << 20, 1 << 12, 1):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc  # noqa: PT017 - a helper that fills a disk, not a test
