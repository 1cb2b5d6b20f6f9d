"""A bounded, read-only listing of a session's workspace that never leaves it.

Paths are relative to the workspace root. Absolute paths and ``..`` are refused outright, a path
that goes through a symlink is refused too, and symlinks found while walking are reported as such and
never followed. Names that are not UTF-8 are shown with ``\\xNN`` escapes.
"""

from __future__ import annotations

import errno
import os
import stat
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

from fleet_kernel import safe_files
from fleet_kernel.errors import NotFoundError, ValidationError
from fleet_kernel.workspace import guess_mime

MAX_DEPTH = 8
MAX_ENTRIES = 5000


def _clean(relative: str) -> str:
    """Validate a client path: relative, no ``..``, no NUL; returns it normalised (``""`` is the root)."""
    text = relative.replace("\\", "/").strip()
    if "\x00" in text:
        raise ValidationError("the path contains a NUL byte", code="invalid_path")
    if text.startswith("/") or PurePosixPath(text).is_absolute() or (len(text) > 1 and text[1] == ":"):
        raise ValidationError(
            "paths are relative to the workspace root; absolute paths are refused", code="invalid_path"
        )
    parts = [p for p in text.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValidationError("'..' is not allowed in workspace paths", code="invalid_path")
    return "/".join(parts)


def _entry(rel: str, depth: int, st: os.stat_result) -> dict[str, object]:
    kind = safe_files.Entry(rel, rel.rsplit("/", 1)[-1], depth, st).kind
    shown = _shown(rel)
    return {
        "path": shown,
        "name": shown.rsplit("/", 1)[-1],
        "type": kind,
        "depth": depth,
        "size": st.st_size if kind == "file" else None,
        "mime": guess_mime(shown) if kind == "file" else None,
        "modified_at": datetime.fromtimestamp(st.st_mtime, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def _shown(rel: str) -> str:
    """The path as JSON can carry it: bytes that are not UTF-8 become ``\\xff`` escapes."""
    return rel if safe_files.is_text(rel) else os.fsencode(rel).decode("utf-8", "backslashreplace")


def _through_link(root: Path, parts: list[str]) -> bool:
    """Whether a component of the path is a symlink (only to word the error; nothing is followed)."""
    for n in range(1, len(parts) + 1):
        try:
            if stat.S_ISLNK(os.lstat(root.joinpath(*parts[:n])).st_mode):
                return True
        except OSError:
            return False
    return False


def list_tree(
    root: Path, relative: str = "", *, max_depth: int = 3, limit: int = 500
) -> tuple[str, list[dict[str, object]], bool]:
    """Breadth-first listing under ``relative``: ``(path, entries, truncated)``.

    Every folder is opened without following a link (``fleet_kernel.safe_files``), so a folder that
    code swaps for a link while it is listed is skipped, never listed through.

    Raises:
        ValidationError: the path is absolute, uses ``..`` or goes through a link.
        NotFoundError: nothing exists at the path.
    """
    relative = _clean(relative)
    max_depth = max(1, min(max_depth, MAX_DEPTH))
    limit = max(1, min(limit, MAX_ENTRIES))
    parts = relative.split("/") if relative else []
    try:
        with safe_files.open_dir(root, parts[:-1]) as parent:
            st = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False) if parts else os.fstat(parent)
    except OSError as exc:
        if not relative:
            return relative, [], False  # a session that has not run a turn yet has an empty workspace
        if exc.errno in (errno.ENOENT, errno.ENOTDIR) and not _through_link(root, parts):
            raise NotFoundError(f"nothing at {relative!r} in this workspace") from None
        raise ValidationError(f"{relative!r} leads outside the workspace", code="invalid_path") from None
    if stat.S_ISLNK(st.st_mode):
        raise ValidationError(f"{relative!r} leads outside the workspace", code="invalid_path")
    if not stat.S_ISDIR(st.st_mode):
        return relative, [_entry(relative, 0, st)], False
    entries: list[dict[str, object]] = []
    for entry in safe_files.walk(root, parts, max_depth=max_depth):
        if len(entries) >= limit:
            return relative, entries, True
        rel = f"{relative}/{entry.path}" if relative else entry.path
        entries.append(_entry(rel, entry.depth, entry.st))
    return relative, entries, False
