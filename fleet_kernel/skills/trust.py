"""Which project skill folders the user trusts: ``$FLEET_HOME/trusted-skills.json``.

A project's ``./.fleet/skills`` comes with whatever repository was cloned there, and its cards go into
every turn's prompt, so Fleet uses them only for a folder the user trusted (``%fleet skill trust``) or
when ``[skills] project = true``. Trust names the folder by its absolute path and the digest of its
cards as they were when trusted: a card added, changed or removed afterwards (a ``git pull``) ends the
trust until the user reads the cards and trusts them again. The file is shared by every kernel and
server on the same ``FLEET_HOME``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from fleet_kernel import safe_files

log = logging.getLogger(__name__)

TRUST_FILE = "trusted-skills.json"
MAX_TRUSTED = 1_000  # folders kept; the oldest go first


def project_folder(cwd: Path | None = None) -> Path:
    """``./.fleet/skills`` of ``cwd`` (the process's working directory by default), absolute."""
    return (cwd or Path.cwd()).absolute() / ".fleet" / "skills"


def trusted_digest(home: Path, folder: Path) -> str | None:
    """The digest of ``folder``'s cards when the user trusted it, or None when it is not trusted."""
    return _read(home).get(str(folder))


def record(home: Path, folder: Path, digest: str) -> None:
    """Trust ``folder`` with its cards as they are (``digest``)."""
    folders = _read(home)
    folders.pop(str(folder), None)
    folders[str(folder)] = digest
    _write(home, folders)


def forget(home: Path, folder: Path) -> bool:
    """Stop trusting ``folder``; False when it was not trusted."""
    folders = _read(home)
    if folders.pop(str(folder), None) is None:
        return False
    _write(home, folders)
    return True


def _read(home: Path) -> dict[str, str]:
    """The trusted folders; an unreadable or malformed file trusts nothing (and says so in the log)."""
    try:
        data, _ = safe_files.read_path(home, TRUST_FILE, max_bytes=1 << 20)
        raw: Any = json.loads(data)
    except safe_files.Refused:
        return {}
    except ValueError as exc:
        log.warning("%s is not valid JSON (%s): no project skill folder is trusted", home / TRUST_FILE, exc)
        return {}
    folders = raw.get("folders") if isinstance(raw, dict) else None
    if not isinstance(folders, dict):
        return {}
    return {k: v for k, v in folders.items() if isinstance(k, str) and isinstance(v, str)}


def _write(home: Path, folders: dict[str, str]) -> None:
    kept = dict(list(folders.items())[-MAX_TRUSTED:])
    home.mkdir(parents=True, exist_ok=True)
    safe_files.write_path(home, TRUST_FILE, json.dumps({"folders": kept}, indent=1).encode())
