"""A bounded, read-only listing of a session's workspace that never leaves it.

Paths are relative to the workspace root. Absolute paths and ``..`` are refused outright, a path
that resolves outside (through a symlink) is refused too, and symlinks found while walking are
reported as such and never followed.
"""

from __future__ import annotations

import os
import stat
from collections import deque
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

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


def _resolve(root: Path, relative: str) -> Path:
    real_root = root.resolve()
    target = (real_root / relative).resolve() if relative else real_root
    if target != real_root and real_root not in target.parents:
        raise ValidationError(f"{relative!r} leads outside the workspace", code="invalid_path")
    return target


def _entry(path: Path, rel: str, depth: int, st: os.stat_result) -> dict[str, object]:
    if stat.S_ISLNK(st.st_mode):
        kind = "symlink"
    elif stat.S_ISDIR(st.st_mode):
        kind = "dir"
    elif stat.S_ISREG(st.st_mode):
        kind = "file"
    else:
        kind = "other"
    return {
        "path": rel,
        "name": path.name,
        "type": kind,
        "depth": depth,
        "size": st.st_size if kind == "file" else None,
        "mime": guess_mime(rel) if kind == "file" else None,
        "modified_at": datetime.fromtimestamp(st.st_mtime, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def list_tree(
    root: Path, relative: str = "", *, max_depth: int = 3, limit: int = 500
) -> tuple[str, list[dict[str, object]], bool]:
    """Breadth-first listing under ``relative``: ``(path, entries, truncated)``.

    Raises:
        ValidationError: the path is absolute, uses ``..`` or resolves outside the workspace.
        NotFoundError: nothing exists at the path.
    """
    relative = _clean(relative)
    max_depth = max(1, min(max_depth, MAX_DEPTH))
    limit = max(1, min(limit, MAX_ENTRIES))
    if not root.is_dir():
        if relative:
            raise NotFoundError(f"nothing at {relative!r} in this workspace")
        return relative, [], False  # a session that has not run a turn yet has an empty workspace
    target = _resolve(root, relative)
    if not target.exists():
        raise NotFoundError(f"nothing at {relative!r} in this workspace")
    if not target.is_dir():
        return relative, [_entry(target, relative, 0, target.lstat())], False
    entries: list[dict[str, object]] = []
    queue: deque[tuple[Path, str, int]] = deque([(target, relative, 1)])
    while queue:
        folder, folder_rel, depth = queue.popleft()
        try:
            children = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue  # unreadable or vanished: list what can be listed
        for child in children:
            if len(entries) >= limit:
                return relative, entries, True
            rel = f"{folder_rel}/{child.name}" if folder_rel else child.name
            st = child.stat(follow_symlinks=False)
            entries.append(_entry(Path(child.path), rel, depth, st))
            if stat.S_ISDIR(st.st_mode) and depth < max_depth:
                queue.append((Path(child.path), rel, depth + 1))
    return relative, entries, False
