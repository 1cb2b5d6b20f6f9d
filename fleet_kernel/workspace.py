"""A session's workspace: ``files/`` (attachments), ``artifacts/`` (what turns produce), ``memory/MEMORIES.md``.

It lives under ``$FLEET_HOME/workspaces/<session_id>`` and is mounted at ``/workspace`` in every
sandbox, so it survives sandbox restarts and replacement.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import mimetypes
import os
import re
import stat
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fleet_kernel import safe_files
from fleet_kernel.errors import InsufficientStorageError

if TYPE_CHECKING:
    from fleet_kernel.config import SandboxLimits  # config loads pydantic: not in the kernel's cold start

logger = logging.getLogger(__name__)

FILES_DIR = "files"  # the user's attachments
ARTIFACTS_DIR = "artifacts"  # what turns produce for the user
MEMORY_DIR = "memory"
MEMORY_FILE = f"{MEMORY_DIR}/MEMORIES.md"  # the model's notes, kept across the turns of one session
MANIFEST_HEADING = "/workspace (your durable session folder; read and write it with normal Python file calls):"
"""The first line of the ``workspace`` input (``Workspace.manifest``); a model that took the listing for the
folder's path opens a file named after it."""
LAYOUT = (FILES_DIR, ARTIFACTS_DIR, MEMORY_DIR)  # the folders of every workspace, here and in each sandbox
MEMORY_HEADER = "# Memories\n\nNotes kept across turns of this session.\n"
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")
MAX_VISITED = 100_000  # entries one listing looks at, however many folders code made
LISTING_VISITS = 10_000  # entries of files/ and of artifacts/ the prompt's listing looks at, every turn
MAX_DIGESTS = 100_000  # file identities remembered with their digest, across turns of this process
_DIGESTS: dict[tuple[str, str, int, int, int, int, int], str] = {}
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


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
        with safe_files.private_dirs(workspaces_dir.parent, [workspaces_dir.name, session_id]) as fd:  # $FLEET_HOME
            _layout(fd)
        return cls(workspaces_dir / session_id)

    def ensure(self) -> Workspace:
        """Create the layout, owner-only; anything sandbox code replaced by a link is replaced back, never followed.

        Sandboxes never write here directly (they get a copy, see ``sandbox/_stage.py``), so no other user
        needs access: ``$FLEET_HOME``, ``workspaces/`` and every workspace folder are 0700, files 0600. Every
        folder is made and opened at its parent's descriptor without following a link (``safe_files.private_dirs``).
        """
        with safe_files.private_dirs(self.root) as fd:
            _layout(fd)
        return self

    def resolve(self, relative: str) -> Path:
        """A path inside the workspace; raises ``ValueError`` for anything that escapes it."""
        candidate = (self.root / relative.lstrip("/")).resolve()
        root = self.root.resolve()
        if candidate != root and root not in candidate.parents:
            raise ValueError(f"{relative!r} is outside the workspace")
        return candidate

    def add_file(self, filename: str, data: bytes) -> str:
        """``place_file`` without a quota, for the path alone."""
        return self.place_file(filename, data)[0]

    def place_file(self, filename: str, data: bytes, quota: SandboxLimits | None = None) -> tuple[str, bool]:
        """Store an attachment under ``files/`` without overwriting a different file of the same name.

        Returns the path relative to the workspace (``files/report.csv``, or ``files/report-2.csv``) and
        whether it is a new file (false: the same bytes were there under that name). The file is created
        with ``O_EXCL | O_NOFOLLOW`` in a descriptor of ``files/``, so a link or pipe that code planted
        (even a moment before) is never written through; one that cannot be written whole is removed.

        Raises:
            InsufficientStorageError: a new file would take the workspace over ``quota``, or the disk is full.
        """
        name = safe_filename(filename)
        stem, suffix = os.path.splitext(name)
        digest = hashlib.sha256(data).hexdigest()
        with safe_files.open_dir(self.root, [FILES_DIR]) as folder:
            for n in range(1, 10_000):
                candidate = f"{stem}{suffix}" if n == 1 else f"{stem}-{n}{suffix}"
                if not _exists(folder, candidate) and quota is not None:
                    self.check_room(quota, len(data), 1)
                try:
                    fd = os.open(candidate, _CREATE_FLAGS, 0o600, dir_fd=folder)
                except FileExistsError:
                    try:
                        if safe_files.hash_file(folder, candidate, max_bytes=len(data))[1] == digest:
                            return f"{FILES_DIR}/{candidate}", False
                    except safe_files.Refused:
                        pass
                    continue  # a different file, or a link or pipe planted by code: never write through it
                except OSError as exc:
                    raise_if_full(exc, self.root, f"{FILES_DIR}/{candidate} was not written")
                    raise
                try:
                    with os.fdopen(fd, "wb") as handle:
                        handle.write(data)
                except BaseException as exc:
                    with contextlib.suppress(OSError):
                        os.unlink(candidate, dir_fd=folder)
                    if isinstance(exc, OSError):
                        raise_if_full(exc, self.root, f"{FILES_DIR}/{candidate} was not written")
                    raise
                return f"{FILES_DIR}/{candidate}", True
        raise ValueError(f"too many files named like {name!r}")

    def check_room(self, quota: SandboxLimits, size: int, new_entries: int, *, replacing: int = 0) -> None:
        """Refuse a write of ``size`` bytes and ``new_entries`` names (over a file of ``replacing`` bytes)
        that would take the workspace over ``[sandbox] workspace_mb`` or ``workspace_files``: a sandbox
        could not hold it, so nothing writes it from outside either.

        Raises:
            InsufficientStorageError: with code ``workspace_quota``, naming the key.
        """
        used_bytes, used_entries = usage(self.root)
        if used_bytes - replacing + size > quota.workspace_mb * 1024 * 1024:
            key, limit = "workspace_mb", f"{quota.workspace_mb} MB"
        elif used_entries + new_entries > quota.workspace_files:
            key, limit = "workspace_files", f"{quota.workspace_files} files and folders"
        else:
            return
        raise InsufficientStorageError(
            f"the workspace would go over its quota of {limit} ([sandbox] {key}): "
            "delete files from it, or raise the quota in fleet.toml",
            code="workspace_quota",
        )

    def missing_entries(self, parts: Sequence[str]) -> int:
        """How many of ``parts`` (a path under the root, folders then the name) do not exist yet."""
        path = self.root
        for index, part in enumerate(parts):
            path = path / part
            if not os.path.lexists(path):
                return len(parts) - index
        return 0

    def scan(
        self,
        sub: str = ARTIFACTS_DIR,
        *,
        limit: int = 10_000,
        max_bytes: int | None = None,
        should_stop: safe_files.StopCheck | None = None,
    ) -> dict[str, FileInfo]:
        """Regular files under ``sub``, hashed, keyed by workspace-relative path.

        Links, pipes and other non-files are ignored, as are names that are not UTF-8 and files over
        ``max_bytes`` (logged); ``should_stop`` ends the scan early (a deadline, a cancellation).
        """
        found: dict[str, FileInfo] = {}
        for rel, st in self.files(sub, limit=limit):
            size = st.st_size
            if should_stop is not None and should_stop():
                break
            if max_bytes is not None and size > max_bytes:
                logger.warning("%s is %d bytes, over the %d-byte limit; not read", rel, size, max_bytes)
                continue
            try:
                size, digest = safe_files.hash_path(self.root, rel, max_bytes=max_bytes, should_stop=should_stop)
            except safe_files.Refused as exc:
                logger.warning("%s: %s", self.root, exc)
                continue
            found[rel] = FileInfo(rel, size, digest, guess_mime(rel))
        return found

    def read_if_changed(
        self,
        rel: str,
        st: os.stat_result,
        known: str | None,
        *,
        max_bytes: int,
        should_stop: safe_files.StopCheck | None = None,
    ) -> tuple[bytes, str] | None:
        """``(data, sha256)`` of a file ``files`` listed, or None when it still hashes to ``known``.

        A file whose identity (inode, size, mtime, ctime) is the one it had when it was last read with
        digest ``known`` is not read again, so unchanged artifacts cost no reading turn after turn.

        Raises:
            safe_files.Refused: as ``safe_files.read_path``.
        """
        key = (str(self.root), rel, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if known is not None and _DIGESTS.get(key) == known:
            return None
        data, digest = safe_files.read_path(self.root, rel, max_bytes=max_bytes, should_stop=should_stop)
        if len(_DIGESTS) >= MAX_DIGESTS:
            _DIGESTS.pop(next(iter(_DIGESTS)))
        _DIGESTS[key] = digest
        return None if digest == known else (data, digest)

    def files(self, sub: str, *, limit: int = 10_000, text_only: bool = True) -> list[tuple[str, os.stat_result]]:
        """``(path, lstat)`` of the regular files under ``sub``, nothing read or hashed.

        Never follows a link. Names that are not UTF-8 are left out (logged) unless ``text_only`` is
        false, as no store, event or request can carry them as they are.
        """
        found: list[tuple[str, os.stat_result]] = []
        try:
            for visited, entry in enumerate(safe_files.walk(self.root, [sub], max_entries=MAX_VISITED + 1)):
                if visited >= MAX_VISITED:
                    logger.warning(
                        "%s/%s holds more than %d entries; the rest is not looked at", self.root, sub, MAX_VISITED
                    )
                    break
                if entry.kind != "file":
                    continue
                rel = f"{sub}/{entry.path}"
                if text_only and not safe_files.is_text(rel):
                    logger.warning("%s/%s: the name is not UTF-8; ignored", self.root, safe_files.printable(rel))
                    continue
                found.append((rel, entry.st))
                if len(found) >= limit:
                    break
        except OSError:
            pass  # the workspace itself is gone or not a folder: nothing to list
        return found

    def _sample(self, sub: str) -> tuple[list[tuple[str, os.stat_result]], bool]:
        """The files among the first ``LISTING_VISITS`` entries under ``sub``, and whether it holds more entries."""
        walked: list[safe_files.Entry] = []
        with contextlib.suppress(OSError):  # the workspace itself is gone: nothing to list
            walked = list(safe_files.walk(self.root, [sub], max_entries=LISTING_VISITS))
        found = [(f"{sub}/{entry.path}", entry.st) for entry in walked if entry.kind == "file"]
        return found, len(walked) >= LISTING_VISITS

    def manifest(self, *, max_entries: int = 50) -> str:
        """A bounded listing for the prompt: what the model can open with plain file calls.

        Its cost is bounded too: it looks at no more than ``LISTING_VISITS`` entries of ``files/`` and of
        ``artifacts/``, whatever they hold, and says how many files it left out ("and 950 more files", or
        "more than" when it stopped looking). Sizes come from ``lstat``; nothing is read or hashed. Names are
        escaped onto one line each, so a name cannot add lines of its own to the prompt.

        Empty when there is nothing to list (no files, no artifacts, no memories yet): the turn then has no
        ``workspace`` input, only the short instruction to save outputs under artifacts/.
        """
        lines = [MANIFEST_HEADING]
        samples = [self._sample(sub) for sub in (FILES_DIR, ARTIFACTS_DIR)]
        entries = [item for found, _ in samples for item in found]
        for rel, st in entries[:max_entries]:
            lines.append(f"  {safe_files.printable(rel)}  ({st.st_size} bytes, {guess_mime(rel)})")
        rest, partial = len(entries) - max_entries, any(more for _, more in samples)
        if rest > 0 or partial:
            count = f"more than {max(rest, 0):,}" if partial else f"{rest:,}"
            lines.append(f"  ... and {count} more files, not listed; use os.walk('/workspace/{FILES_DIR}') to see them")
        try:
            size = os.stat(self.root / MEMORY_FILE, follow_symlinks=False).st_size
        except OSError:
            size = 0
        if not entries and size <= len(MEMORY_HEADER.encode("utf-8")):
            return ""
        if not entries:
            lines.append(f"  {FILES_DIR}/ and {ARTIFACTS_DIR}/ are empty")
        lines.append(
            f"  {MEMORY_FILE}  ({size} bytes): your durable memory; read it first, append what a later turn needs"
        )
        lines.append(
            f"  Save plots, tables and other outputs under /workspace/{ARTIFACTS_DIR}/ to show them to the user."
        )
        return "\n".join(lines)


def _layout(root: int) -> None:
    """``LAYOUT`` and ``MEMORY_FILE`` in the workspace open at ``root``: what is not a folder (or file) is
    replaced, nothing is followed through a link."""
    memory_dir, name = MEMORY_FILE.split("/")
    for sub in LAYOUT:
        _remove_unless(root, sub, stat.S_ISDIR)
        fd = safe_files.private_child(root, sub)
        try:
            if sub == memory_dir:
                _remove_unless(fd, name, stat.S_ISREG)
                try:
                    memory = os.open(name, _CREATE_FLAGS, 0o600, dir_fd=fd)
                    os.write(memory, MEMORY_HEADER.encode("utf-8"))
                except FileExistsError:
                    memory = os.open(name, safe_files.FILE_FLAGS, dir_fd=fd)
                try:
                    os.fchmod(memory, 0o600)
                finally:
                    os.close(memory)
        finally:
            os.close(fd)


def _remove_unless(dir_fd: int, name: str, kind: Callable[[int], bool]) -> None:
    """Unlink ``name`` in ``dir_fd`` when it is not of ``kind`` (a link code planted, a file for a folder)."""
    with contextlib.suppress(FileNotFoundError):
        if not kind(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            os.unlink(name, dir_fd=dir_fd)


def _exists(folder: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


# -- a full disk ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Unsaved:
    """Files a sandbox wrote that its copy-back could not save to the workspace (``sandbox/_stage.py``)."""

    count: int
    files: list[tuple[str, int, str]]  # the first few: (path, errno, strerror)

    @property
    def disk_full(self) -> bool:
        return any(number in FULL_ERRNOS for _, number, _ in self.files)

    def error(self, root: Path) -> dict[str, str]:
        """The turn's error: which disk is full (or why else), and which files were lost."""
        named = ", ".join(safe_files.printable(path) for path, _, _ in self.files)
        more = f" and {self.count - len(self.files)} more" if self.count > len(self.files) else ""
        lost = f"{self.count} file{'s' if self.count != 1 else ''} the sandbox wrote could not be saved ({named}{more})"
        if self.disk_full:
            return {"type": "disk_full", "message": disk_full_message(root, lost)}
        reasons = "; ".join(sorted({reason for _, _, reason in self.files}))
        return {"type": "workspace_unsaved", "message": f"{lost} to the workspace {root}: {reasons}"}


_UNSAVED: dict[Path, Unsaved] = {}
_UNSAVED_LOCK = threading.Lock()


def note_unsaved(root: Path, unsaved: Unsaved) -> None:
    """Record what a sandbox's copy-back lost, for the turn that ran there to fail with (``take_unsaved``)."""
    logger.warning("%s", unsaved.error(root)["message"])
    with _UNSAVED_LOCK:
        before = _UNSAVED.get(root.absolute())
        if before is not None:
            unsaved = Unsaved(before.count + unsaved.count, (before.files + unsaved.files)[:10])
        _UNSAVED[root.absolute()] = unsaved


def take_unsaved(root: Path) -> Unsaved | None:
    """What copy-backs into ``root`` lost since the last call, if anything."""
    with _UNSAVED_LOCK:
        return _UNSAVED.pop(root.absolute(), None)


def mount_point(path: Path) -> Path:
    """The mount point of the filesystem holding ``path`` (its nearest existing folder)."""
    path = path.absolute()
    while not path.exists() and path.parent != path:
        path = path.parent
    device = os.stat(path).st_dev
    while path.parent != path and os.stat(path.parent).st_dev == device:
        path = path.parent
    return path


def disk_full_message(path: Path, what: str) -> str:
    """``what`` happened because the disk holding ``path`` is full, naming the path and its mount point."""
    try:
        mounted = f", mounted at {mount_point(path)}"
    except OSError:
        mounted = ""
    return f"the disk holding {path}{mounted} is full: {what}; free space there, then try again"


def raise_if_full(exc: OSError, path: Path, what: str) -> None:
    """Raise ``InsufficientStorageError`` (``disk_full``) for an ``OSError`` that says the disk is full."""
    if exc.errno in FULL_ERRNOS:
        raise InsufficientStorageError(disk_full_message(path, what)) from exc


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
