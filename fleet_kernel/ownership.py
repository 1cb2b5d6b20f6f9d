"""FLEET_HOME belongs to the user who runs Fleet: the ownership check every front door makes first.

Fleet loads skills, workspaces and the store from ``FLEET_HOME`` and writes below it, so a folder another
user owns or may write (the folder itself or any folder above it) would hand that user Fleet's prompts
and let them redirect its writes with links. The rule is ssh's for its own files: the folder is ours, every
folder above it is ours or root's, and none is writable by another user; a sticky folder (``/tmp``) may be
world-writable, as nobody can rename or replace an entry in it that is not theirs.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from pathlib import Path

from fleet_kernel.errors import ConfigError


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _private_group(gid: int, uid: int) -> bool:
    """A group with no member but the user (a user private group), so its write bit lets no one else in."""
    try:
        group, user = grp.getgrgid(gid), pwd.getpwuid(uid)
    except KeyError:
        return False
    return user.pw_gid == gid and set(group.gr_mem) <= {user.pw_name}


def _folder_problem(folder: Path, st: os.stat_result, *, own: bool) -> str | None:
    """Why another user could change ``folder`` (``own``: it must be this user's, not just root's); or None."""
    uid = os.geteuid()
    if stat.S_ISLNK(st.st_mode):
        return None if st.st_uid in (uid, 0) else f"{folder} is a link owned by {_user(st.st_uid)}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{folder} is not a folder"
    if st.st_uid != uid and (own or st.st_uid != 0):
        return f"{folder} is owned by {_user(st.st_uid)}, not by {_user(uid)}"
    sticky = not own and st.st_mode & stat.S_ISVTX
    if st.st_mode & stat.S_IWOTH and not sticky:
        return f"{folder} is writable by every user (mode {stat.filemode(st.st_mode)})"
    if st.st_mode & stat.S_IWGRP and not sticky and not _private_group(st.st_gid, st.st_uid):
        return f"{folder} is writable by the group {_group(st.st_gid)} (mode {stat.filemode(st.st_mode)})"
    return None


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return f"gid {gid}"


def problem(path: Path) -> str | None:
    """Why ``path`` (a folder Fleet keeps state in, made later if missing) is not safely this user's; or None.

    Every folder on the way is looked at with ``lstat``, as written and once links are resolved, so a link
    another user owns anywhere on the path is refused too.
    """
    path = Path(os.path.abspath(path))
    existing = path
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    real = Path(os.path.realpath(existing))
    seen: set[Path] = set()
    for leaf in (existing, real):
        for folder in (leaf, *leaf.parents):
            if folder in seen:
                continue
            seen.add(folder)
            try:
                st = os.lstat(folder)
            except OSError as exc:
                return f"{folder} cannot be looked at: {exc.strerror}"
            found = _folder_problem(folder, st, own=folder == path or (folder == real and existing == path))
            if found is not None:
                return found
    return None


def check_home(path: Path, what: str = "FLEET_HOME") -> None:
    """Refuse a ``path`` another user owns or may write, saying which folder and what to do.

    Raises:
        ConfigError: ``path``, or a folder above it, is not safely this user's.
    """
    found = problem(path)
    if found is None:
        return
    user = _user(os.geteuid())
    raise ConfigError(
        f"Fleet will not use {what} {path}: {found}. Fleet loads skills and sessions from there and writes "
        f"below it, so it must belong to the user who runs Fleet ({user}) and no one else may write it or a "
        f"folder above it: `chown {user} <folder>` and `chmod go-w <folder>` for that folder, or set {what} "
        "to a folder of your own."
    )
