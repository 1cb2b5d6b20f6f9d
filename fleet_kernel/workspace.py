"""A session's workspace: ``files/`` (attachments), ``artifacts/`` (what turns produce), ``memory/MEMORIES.md``.

It lives under ``$FLEET_HOME/workspaces/<session_id>`` and is mounted at ``/workspace`` in every
sandbox, so it survives sandbox restarts and replacement.
"""

from __future__ import annotations

import contextlib
import hashlib
import mimetypes
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

MEMORY_FILE = "memory/MEMORIES.md"
MEMORY_HEADER = "# Memories\n\nNotes kept across turns of this session.\n"
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class FileInfo:
    path: str  # relative to the workspace root
    size: int
    sha256: str
    mime: str


class Workspace:
    """The folder behind ``/workspace`` for one session."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def for_session(cls, workspaces_dir: Path, session_id: str) -> Workspace:
        private_dir(workspaces_dir.parent)  # $FLEET_HOME
        private_dir(workspaces_dir)
        return cls(workspaces_dir / session_id).ensure()

    def ensure(self) -> Workspace:
        """Create the layout, owner-only; anything sandbox code replaced by a link is replaced back, never followed.

        Sandboxes never write here directly (they get a copy, see ``sandbox/_stage.py``), so no other user
        needs access: ``$FLEET_HOME``, ``workspaces/`` and every workspace folder are 0700, files 0600.
        """
        private_dir(self.root)
        for sub in ("files", "artifacts", "memory"):
            path = self.root / sub
            if path.is_symlink() or (path.exists() and not path.is_dir()):
                path.unlink()
            private_dir(path)
        memory = self.root / MEMORY_FILE
        if memory.is_symlink() or (memory.exists() and not memory.is_file()):
            memory.unlink()
        if not memory.exists():
            memory.write_text(MEMORY_HEADER, encoding="utf-8")
        os.chmod(memory, 0o600)
        return self

    def resolve(self, relative: str) -> Path:
        """A path inside the workspace; raises ``ValueError`` for anything that escapes it."""
        candidate = (self.root / relative.lstrip("/")).resolve()
        root = self.root.resolve()
        if candidate != root and root not in candidate.parents:
            raise ValueError(f"{relative!r} is outside the workspace")
        return candidate

    def add_file(self, filename: str, data: bytes) -> str:
        """Store an attachment under ``files/`` without overwriting a different file of the same name.

        Returns the path relative to the workspace (``files/report.csv``, or ``files/report-2.csv``).
        """
        name = safe_filename(filename)
        stem, suffix = os.path.splitext(name)
        digest = hashlib.sha256(data).hexdigest()
        for n in range(1, 10_000):
            candidate = f"{stem}{suffix}" if n == 1 else f"{stem}-{n}{suffix}"
            target = self.root / "files" / candidate
            if os.path.lexists(target):
                if not target.is_symlink() and target.is_file() and _sha256(target) == digest:
                    return f"files/{candidate}"
                continue  # a different file, or a link or pipe planted by code: never write through it
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            return f"files/{candidate}"
        raise ValueError(f"too many files named like {name!r}")

    def scan(self, sub: str = "artifacts", *, limit: int = 10_000) -> dict[str, FileInfo]:
        """Regular files under ``sub`` (symlinks ignored), keyed by workspace-relative path."""
        found: dict[str, FileInfo] = {}
        base = self.root / sub
        if base.is_symlink() or not base.is_dir():
            return found
        for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
            dirnames.sort()
            for name in sorted(filenames):
                path = Path(dirpath) / name
                if path.is_symlink() or not path.is_file():
                    continue
                rel = path.relative_to(self.root).as_posix()
                found[rel] = FileInfo(rel, path.stat().st_size, _sha256(path), guess_mime(rel))
                if len(found) >= limit:
                    return found
        return found

    def manifest(self, *, max_entries: int = 50) -> str:
        """A bounded listing for the prompt: what the model can open with plain file calls."""
        lines = ["/workspace (your durable session folder; read and write it with normal Python file calls):"]
        entries = [info for sub in ("files", "artifacts") for info in self.scan(sub, limit=max_entries + 1).values()]
        for info in entries[:max_entries]:
            lines.append(f"  {info.path}  ({info.size} bytes, {info.mime})")
        if len(entries) > max_entries:
            lines.append(f"  ... more files not listed; use os.listdir('/workspace/files') to see all")
        if not entries:
            lines.append("  files/ and artifacts/ are empty")
        memory = self.root / MEMORY_FILE
        size = memory.stat().st_size if memory.exists() else 0
        lines.append(
            f"  {MEMORY_FILE}  ({size} bytes): your durable memory; read it first, append what a later turn needs"
        )
        lines.append("  Save plots, tables and other outputs under /workspace/artifacts/ to show them to the user.")
        return "\n".join(lines)


def private_dir(path: Path) -> None:
    """Make ``path`` (and missing parents) a folder only its owner can enter; an existing one is tightened."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not path.is_symlink() and path.stat().st_mode & 0o077:
        os.chmod(path, 0o700)


def usage(root: Path) -> tuple[int, int]:
    """Bytes in regular files and entries (files, folders, links) under ``root``, never following links."""
    size = entries = 0
    for dirpath, dirnames, filenames in os.walk(root):
        entries += len(dirnames) + len(filenames)
        for name in filenames:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(dirpath, name))
                size += st.st_size if stat.S_ISREG(st.st_mode) else 0
    return size, entries


def safe_filename(filename: str) -> str:
    """The name an attachment is stored under: its last part, letters, digits and ``._-`` only."""
    return _SAFE_NAME.sub("_", Path(filename).name).strip("._") or "attachment"


def guess_mime(path: str) -> str:
    return mimetypes.guess_type(path)[0] or "application/octet-stream"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
