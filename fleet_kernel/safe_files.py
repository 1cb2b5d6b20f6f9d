"""Host reads of folders that sandbox code may have shaped, without following anything it planted.

Every directory is opened with ``O_DIRECTORY | O_NOFOLLOW`` relative to its parent's descriptor, so no
path component is ever resolved through a link, even one swapped in between two calls. A file is
opened once with ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO cannot block the open), checked with ``fstat``
to be a regular file of an acceptable size, and hashed and read through that one descriptor. Names
are kept as the OS gives them (undecodable bytes as surrogates); ``is_text`` and ``printable`` say
whether and how to show them.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
CHUNK = 1 << 20
MAX_DEPTH = 32  # a walk goes no deeper; sandbox code can nest folders far beyond any use

StopCheck = Callable[[], bool]
_T = TypeVar("_T")


class Refused(ValueError):
    """A file that is not read: a link, not a regular file, too large, gone, or the read was stopped."""


@dataclass(frozen=True)
class Entry:
    """One name in a walked folder, as ``lstat`` saw it."""

    path: str  # relative to the folder the walk started from, ``/``-separated
    name: str
    depth: int  # 1 for the walk's own children
    st: os.stat_result

    @property
    def kind(self) -> str:
        mode = self.st.st_mode
        if stat.S_ISLNK(mode):
            return "symlink"
        if stat.S_ISDIR(mode):
            return "dir"
        return "file" if stat.S_ISREG(mode) else "other"


def is_text(name: str) -> bool:
    """True when the name is valid UTF-8 (no undecodable bytes), so it can go into JSON and the store."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def printable(name: str) -> str:
    """The name on one line: control and format characters, line breaks and undecodable bytes escaped."""
    text = os.fsencode(name).decode("utf-8", "backslashreplace")
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


@contextmanager
def open_dir(root: Path, parts: Sequence[str] = ()) -> Iterator[int]:
    """A descriptor for ``root/parts...``; ``root`` is the host's own path, each part is opened without
    following a link. Raises ``OSError`` (``ELOOP``/``ENOTDIR``) when a part is a link or not a folder."""
    fd = os.open(root, DIR_FLAGS)
    try:
        for part in parts:
            child = os.open(part, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def list_dir(fd: int, *, limit: int | None = None) -> list[tuple[str, os.stat_result]]:
    """The folder's names, sorted, each with its ``lstat`` (entries that vanish meanwhile are left out).

    With ``limit``, only the first ``limit`` names the folder gives (in its own order) are looked at, so a
    folder of 100,000 files costs a bounded listing no more than a small one.
    """
    found: list[tuple[str, os.stat_result]] = []
    with os.scandir(fd) as entries:
        for entry in entries:
            if limit is not None and len(found) >= limit:
                break
            try:
                found.append((entry.name, entry.stat(follow_symlinks=False)))
            except OSError:
                continue
    return sorted(found, key=lambda item: item[0])


def walk(
    root: Path,
    parts: Sequence[str] = (),
    *,
    max_depth: int = MAX_DEPTH,
    should_stop: StopCheck | None = None,
    max_entries: int | None = None,
) -> Iterator[Entry]:
    """Breadth-first, sorted, never through a link: every entry under ``root/parts``, links included
    (reported, not followed). Folders that cannot be opened (swapped for a link, gone) are skipped.
    ``max_entries`` bounds the entries looked at (and ``lstat``-ed) at all, however large a folder is."""
    queue: list[tuple[tuple[str, ...], int]] = [(tuple(parts), 1)]
    left = max_entries
    while queue and (left is None or left > 0):
        folder, depth = queue.pop(0)
        if should_stop is not None and should_stop():
            return
        try:
            with open_dir(root, folder) as fd:
                children = list_dir(fd, limit=left)
        except OSError:
            continue
        prefix = "/".join(folder[len(parts) :])
        if left is not None:
            left -= len(children)
        for name, st in children:
            yield Entry(f"{prefix}/{name}" if prefix else name, name, depth, st)
            if stat.S_ISDIR(st.st_mode) and depth < max_depth:
                queue.append(((*folder, name), depth + 1))


def read_file(
    dir_fd: int, name: str, *, max_bytes: int | None = None, should_stop: StopCheck | None = None
) -> tuple[bytes, str]:
    """``(data, sha256)`` of the regular file ``name`` in the folder ``dir_fd``, read through one descriptor.

    Raises:
        Refused: it is a link, not a regular file, over ``max_bytes``, gone, or ``should_stop`` said so.
    """
    data = bytearray()
    digest = hashlib.sha256()
    for chunk in _chunks(dir_fd, name, max_bytes, should_stop):
        data += chunk
        digest.update(chunk)
    return bytes(data), digest.hexdigest()


def hash_file(
    dir_fd: int, name: str, *, max_bytes: int | None = None, should_stop: StopCheck | None = None
) -> tuple[int, str]:
    """``(size, sha256)`` as ``read_file`` would see it, without holding the content."""
    return _digest(_chunks(dir_fd, name, max_bytes, should_stop))


def _digest(chunks: Iterator[bytes]) -> tuple[int, str]:
    size, digest = 0, hashlib.sha256()
    for chunk in chunks:
        size += len(chunk)
        digest.update(chunk)
    return size, digest.hexdigest()


def read_path(
    root: Path, relative: str, *, max_bytes: int | None = None, should_stop: StopCheck | None = None
) -> tuple[bytes, str]:
    """``read_file`` for a ``/``-separated path under ``root``, no component followed through a link."""
    return _at_path(read_file, root, relative, max_bytes, should_stop)


def hash_path(
    root: Path, relative: str, *, max_bytes: int | None = None, should_stop: StopCheck | None = None
) -> tuple[int, str]:
    """``hash_file`` for a ``/``-separated path under ``root``, no component followed through a link."""
    return _at_path(hash_file, root, relative, max_bytes, should_stop)


def _at_path(
    how: Callable[..., _T], root: Path, relative: str, max_bytes: int | None, should_stop: StopCheck | None
) -> _T:
    *folder, name = [p for p in relative.split("/") if p] or [""]
    if not name or any(p in (".", "..") for p in (*folder, name)):
        raise Refused(f"{relative!r} is not a file path inside the folder")
    try:
        with open_dir(root, folder) as fd:
            return how(fd, name, max_bytes=max_bytes, should_stop=should_stop)
    except OSError as exc:
        raise Refused(f"{relative!r} cannot be opened as a plain file: {exc.strerror}") from exc


def _chunks(dir_fd: int, name: str, max_bytes: int | None, should_stop: StopCheck | None) -> Iterator[bytes]:
    fd = _open_regular(dir_fd, name, max_bytes)
    try:
        yield from _read_all(fd, name, max_bytes, should_stop)
    finally:
        os.close(fd)


def _open_regular(dir_fd: int, name: str, max_bytes: int | None) -> int:
    """A blocking descriptor of the regular file ``name`` (not a link, not over ``max_bytes``)."""
    try:
        fd = os.open(name, FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise Refused(f"{name!r} cannot be opened as a plain file: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{name!r} is not a regular file")
        if max_bytes is not None and st.st_size > max_bytes:
            raise Refused(f"{name!r} is {st.st_size} bytes, over the {max_bytes}-byte limit")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_all(fd: int, name: str, max_bytes: int | None, should_stop: StopCheck | None) -> Iterator[bytes]:
    read = 0
    while chunk := os.read(fd, CHUNK):
        read += len(chunk)
        if max_bytes is not None and read > max_bytes:  # it grew while being read
            raise Refused(f"{name!r} grew past the {max_bytes}-byte limit while being read")
        if should_stop is not None and should_stop():
            raise Refused(f"reading {name!r} was stopped")
        yield chunk


@dataclass
class OpenFile:
    """A regular file opened once (no link followed), its size and sha256 as read through that descriptor.

    ``chunks`` reads it again from the start through the same descriptor, so the bytes served are those
    of the file that was checked and hashed, in ``CHUNK`` pieces; ``close`` it when done.
    """

    fd: int
    size: int
    sha256: str

    def chunk(self, offset: int) -> bytes:
        """Up to ``CHUNK`` bytes at ``offset``, never past ``size`` (empty at the end or if it shrank)."""
        return os.pread(self.fd, min(CHUNK, self.size - offset), offset) if offset < self.size else b""

    def close(self) -> None:
        os.close(self.fd)


def open_path(root: Path, relative: str) -> OpenFile:
    """Open the regular file at ``root/relative`` (no component followed through a link) and hash it.

    Raises:
        Refused: as ``read_path``.
    """
    folder, name = _folder_and_name(relative)
    try:
        with open_dir(root, folder) as dir_fd:
            fd = _open_regular(dir_fd, name, None)
    except OSError as exc:
        raise Refused(f"{relative!r} cannot be opened as a plain file: {exc.strerror}") from exc
    try:
        size, digest = _digest(_read_all(fd, name, None, None))
    except BaseException as exc:
        os.close(fd)
        if isinstance(exc, OSError):
            raise Refused(f"{relative!r} cannot be read: {exc.strerror}") from exc
        raise
    return OpenFile(fd, size, digest)


def _folder_and_name(relative: str) -> tuple[list[str], str]:
    *folder, name = [p for p in relative.split("/") if p] or [""]
    if not name or any(p in (".", "..") for p in (*folder, name)):
        raise Refused(f"{relative!r} is not a file path inside the folder")
    return folder, name


def write_path(root: Path, relative: str, data: bytes, *, make_dirs: bool = True) -> None:
    """Write ``data`` to ``root/relative`` whole: a private temporary file in the target's folder, renamed
    over the name. No component is followed through a link (folders are made with ``mkdir`` at a
    descriptor), and a link at the name itself is replaced, never written through.

    Raises:
        Refused: a component is a link or not a folder, or the name is a folder.
    """
    folder, name = _folder_and_name(relative)
    try:
        fd = os.open(root, DIR_FLAGS)
        try:
            for part in folder:
                if make_dirs:
                    try:
                        os.mkdir(part, 0o700, dir_fd=fd)
                    except FileExistsError:
                        pass
                child = os.open(part, DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = child
            try:
                if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                    raise Refused(f"{relative!r} is a folder")
            except FileNotFoundError:
                pass
            temp = f".{name[:200]}.{os.urandom(6).hex()}.tmp"
            out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd)
            try:
                with os.fdopen(out, "wb") as handle:
                    handle.write(data)
                os.replace(temp, name, src_dir_fd=fd, dst_dir_fd=fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temp, dir_fd=fd)
                raise
        finally:
            os.close(fd)
    except Refused:
        raise
    except OSError as exc:
        raise Refused(f"{relative!r} cannot be written: {exc.strerror}") from exc


def remove_path(root: Path, relative: str) -> bool:
    """Delete the file (or link, itself) at ``root/relative``; false when there is none. Folders are refused.

    Raises:
        Refused: a component is a link or not a folder, or the name is a folder.
    """
    folder, name = _folder_and_name(relative)
    try:
        with open_dir(root, folder) as fd:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                raise Refused(f"{relative!r} is a folder; only files are deleted")
            os.unlink(name, dir_fd=fd)
            return True
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise Refused(f"{relative!r} cannot be deleted: {exc.strerror}") from exc


def stat_path(root: Path, relative: str, *, max_bytes: int | None = None) -> tuple[int, str, float]:
    """``(size, sha256, mtime)`` of the regular file at ``root/relative``, read through one descriptor."""
    folder, name = _folder_and_name(relative)
    try:
        with open_dir(root, folder) as fd:
            mtime = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mtime
            size, digest = hash_file(fd, name, max_bytes=max_bytes)
            return size, digest, mtime
    except OSError as exc:
        raise Refused(f"{relative!r} cannot be opened as a plain file: {exc.strerror}") from exc


APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@contextmanager
def private_dirs(root: Path, parts: Sequence[str] = ()) -> Iterator[int]:
    """A descriptor for ``root/parts...``, each folder made owner-only where missing, for writes below FLEET_HOME.

    ``root`` (FLEET_HOME, checked by ``ownership``) is made if missing and may be the user's own link; every
    part is made with ``mkdir`` at its parent's descriptor and opened without following a link, and each
    folder must be this user's (one another user made first, in a race, is refused), then tightened to 0700.

    Raises:
        OSError: a part is a link or not a folder (``ELOOP``/``ENOTDIR``), or a folder is another user's (``EPERM``).
    """
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(root, DIR_FLAGS & ~os.O_NOFOLLOW)
    try:
        _own_private(fd, root)
        for n, part in enumerate(parts):
            child = private_child(fd, part, root.joinpath(*parts[: n + 1]))
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def private_child(dir_fd: int, name: str, where: Path | str = "") -> int:
    """A descriptor for the folder ``name`` in ``dir_fd``: made 0700 if missing, opened without following a
    link, this user's, tightened to 0700. Raises ``OSError`` as ``private_dirs``."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o700, dir_fd=dir_fd)
    fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    try:
        _own_private(fd, where or name)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _own_private(fd: int, where: Path | str) -> None:
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        raise PermissionError(errno.EPERM, f"{where} belongs to another user (uid {st.st_uid})")
    if st.st_mode & 0o077:
        os.fchmod(fd, 0o700)


def open_append(dir_fd: int, name: str) -> int:
    """A descriptor appending to the regular file ``name`` in ``dir_fd`` (made 0600), never through a link.

    Raises:
        OSError: ``name`` is a link (``ELOOP``) or not a regular file.
    """
    fd = os.open(name, APPEND_FLAGS, 0o600, dir_fd=dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, f"{name} is not a regular file")
    os.set_blocking(fd, True)
    return fd
