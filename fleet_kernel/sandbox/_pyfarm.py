"""The host's Python install for the ``local`` sandbox, as hard links at neutral paths.

A bind mount's line in ``/proc/self/mountinfo`` names its source folder, so binding the virtual
environment and the interpreter's install would tell sandbox code where they live on the host (a home
folder, a user name). Instead each install folder is mirrored once, as hard links (no data is copied),
into ``$TMPDIR/fleet-python-<uid>/<key>/<n>`` and mounted in the sandbox at ``/run/fleet/python/<n>``;
absolute links and ``pyvenv.cfg`` are rewritten to the neutral paths. The key changes when the install
changes (a package added or removed), and a mirror is reused by every Fleet process of the user.
Where hard links cannot be made (another filesystem, files of another owner), ``None`` says "bind the
install where it is".
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

NEUTRAL_ROOT = "/run/fleet/python"
_FORMAT = 1  # bump when the layout of a mirror changes
STALE_S = 86_400.0


@dataclass(frozen=True)
class Farm:
    """Mirrors of ``prefixes`` (host folders) in ``sources``, to be mounted at ``targets`` in the sandbox."""

    prefixes: tuple[str, ...]
    sources: tuple[str, ...]
    targets: tuple[str, ...]

    def neutral(self, path: str) -> str:
        """Where a host path of the install is in the sandbox."""
        for prefix, target in zip(self.prefixes, self.targets, strict=True):
            if path == prefix or path.startswith(prefix.rstrip("/") + "/"):
                return target + path[len(prefix) :]
        return path

    def usable(self) -> bool:
        return all(os.path.isdir(source) for source in self.sources)


def _key(prefixes: list[str]) -> str:
    """Changes when a folder of the install gains or loses entries (mtime of the folders pip touches)."""
    marks: list[object] = [_FORMAT, sys.version]
    for prefix in prefixes:
        for sub in ("", "bin", "lib", f"lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages"):
            with contextlib.suppress(OSError):
                marks.append([prefix, sub, os.stat(os.path.join(prefix, sub)).st_mtime_ns])
    return hashlib.sha256(json.dumps(marks).encode()).hexdigest()[:20]


def _private_base() -> Path | None:
    """``$TMPDIR/fleet-python-<uid>``: a real folder of ours that only we can enter; or None.

    Hard links get around the modes of the folders above the originals (root's ``/root`` is 0700), so
    the mirrors must not be reachable by anyone else. The sandbox reaches them through the mounts
    ``_stage.py`` makes before it drops privileges.
    """
    base = Path(tempfile.gettempdir()) / f"fleet-python-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        base.mkdir(mode=0o700)
    st = os.lstat(base)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        logger.warning("not using %s for the sandbox's Python: not a folder of this user", base)
        return None
    if st.st_mode & 0o077:
        os.chmod(base, 0o700)
    return base


def _rewrite(mirror: Path, farm: Farm) -> None:
    """Absolute links into the install, and ``pyvenv.cfg``, point at the neutral paths."""
    if mirror.is_symlink() or not mirror.is_dir():
        raise OSError(f"{mirror} is not a folder of the mirror")  # never rewrite anything outside it
    for dirpath, dirnames, filenames in os.walk(mirror):
        for name in (*dirnames, *filenames):
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                target = os.readlink(path)
                if os.path.isabs(target) and farm.neutral(target) != target:
                    os.unlink(path)
                    os.symlink(farm.neutral(target), path)
    cfg = mirror / "pyvenv.cfg"
    if cfg.is_file():
        text = cfg.read_text(encoding="utf-8")
        for prefix in sorted(farm.prefixes, key=len, reverse=True):
            text = text.replace(prefix, farm.neutral(prefix))
        cfg.unlink()  # a hard link to the host's file: replace, never write through it
        cfg.write_text(text, encoding="utf-8")


def _build(base: Path, key: str, prefixes: list[str]) -> Path:
    final = base / key
    if final.is_dir():
        return final
    work = Path(tempfile.mkdtemp(prefix=".building-", dir=base))
    try:
        targets = tuple(f"{NEUTRAL_ROOT}/{n}" for n in range(len(prefixes)))
        farm = Farm(tuple(prefixes), (), targets)
        for n, prefix in enumerate(prefixes):
            # The real folder: `cp -a` copies a link as a link, and rewriting through it would edit the install.
            source = os.path.realpath(prefix)
            subprocess.run(["cp", "-al", source, str(work / str(n))], check=True, capture_output=True, timeout=300)  # noqa: S603, S607 - cp of paths we made
            _rewrite(work / str(n), farm)
        work.chmod(0o700)
        os.utime(work)  # its age is the age of this state of the install, for _sweep
        try:
            os.rename(work, final)
        except OSError:  # another process finished first
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


def _sweep(base: Path, keep: str) -> None:
    """Remove abandoned builds, and mirrors of earlier states of the install a day after a newer one was
    made (only sandboxes alive at that moment can still have one mounted; it would show empty folders)."""
    now = time.time()
    ages: list[tuple[float, Path]] = []
    for entry in base.iterdir():
        with contextlib.suppress(OSError):
            if entry.name.startswith(".building-"):
                if now - entry.lstat().st_mtime > 3600:
                    shutil.rmtree(entry, ignore_errors=True)
            else:
                ages.append((entry.lstat().st_mtime, entry))
    ages.sort()
    for (_, entry), (superseded, _) in itertools.pairwise(ages):
        if entry.name != keep and now - superseded > STALE_S:
            shutil.rmtree(entry, ignore_errors=True)


@functools.cache
def _farm(prefixes: tuple[str, ...], key: str) -> Farm | None:
    try:
        base = _private_base()
        if base is None:
            return None
        root = _build(base, key, list(prefixes))
        _sweep(base, keep=key)
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        logger.info(
            "the sandbox binds the Python install where it is (no hard-link mirror: %s %s)",
            exc,
            detail.decode(errors="replace").strip()[-200:],
        )
        return None
    return Farm(
        prefixes,
        tuple(str(root / str(n)) for n in range(len(prefixes))),
        tuple(f"{NEUTRAL_ROOT}/{n}" for n in range(len(prefixes))),
    )


def python_farm(prefixes: list[str]) -> Farm | None:
    """The mirror of ``prefixes`` for this state of the install (made if needed), or None."""
    farm = _farm(tuple(prefixes), _key(prefixes))
    if farm is not None and not farm.usable():  # removed by a tmp cleaner, or by a newer state's build
        _farm.cache_clear()
        farm = _farm(tuple(prefixes), _key(prefixes))
    return farm
