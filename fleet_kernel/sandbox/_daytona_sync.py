"""Keep the session folder under FLEET_HOME and the sandbox's ``/workspace`` in step, around each turn.

The local folder is the source of truth (the engine scans it for artifacts, uploads land there), the
sandbox's copy lives on a Daytona volume so it also survives sandbox replacement. Before a turn,
``push`` uploads what changed locally; after it, ``pull`` brings back what the code wrote. Each side
is listed with sha256 digests (the sandbox's by one ``process.exec``), and ``box.baseline`` (what
both held after the last sync) tells a deletion from a file the other side has not seen yet.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import os
import stat
from pathlib import Path

from daytona import FileDownloadRequest, FileUpload

from fleet_kernel import safe_files
from fleet_kernel.errors import SandboxUnavailableError
from fleet_kernel.sandbox._daytona_box import DaytonaBox
from fleet_kernel.workspace import LAYOUT, Workspace, usage

logger = logging.getLogger(__name__)

REMOTE_ROOT = "/workspace"
SYNCED = LAYOUT
MAX_FILES = 2_000
UPLOAD_BATCH_BYTES = 32 * 1024 * 1024

_LISTING = f"""
import hashlib, json, os, sys
root, limit, found = sys.argv[1], int(sys.argv[2]), {{}}
for sub in {SYNCED!r}:
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, sub)):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            if len(found) >= limit or os.path.islink(path) or not os.path.isfile(path):
                continue
            digest = hashlib.sha256()
            with open(path, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
            found[os.path.relpath(path, root)] = [os.path.getsize(path), digest.hexdigest()]
print(json.dumps(found))
"""


def listing_command(root: str = REMOTE_ROOT) -> str:
    """A ``process.exec`` command (the daemon splits on spaces and quotes, without a shell)."""
    code = base64.b64encode(_LISTING.encode()).decode()
    return f"python3 -c \"import base64;exec(base64.b64decode('{code}'))\" {root} {MAX_FILES}"


def _valid(rel: str) -> bool:
    parts = rel.split("/")
    return (
        len(parts) > 1
        and parts[0] in SYNCED
        and not any(p in ("", ".", "..") for p in parts)
        and safe_files.is_text(rel)
    )  # a name that is not UTF-8 cannot travel over the API


def remote_files(box: DaytonaBox) -> dict[str, tuple[int, str]]:
    response = box.retry("list the sandbox workspace", lambda: box.sandbox.process.exec(listing_command(), timeout=120))
    output = (response.result or "").strip()
    if response.exit_code != 0 or not output:
        raise RuntimeError(f"listing /workspace failed (exit {response.exit_code}): {output[-500:]}")
    found = json.loads(output.splitlines()[-1])
    return {rel: (int(size), str(digest)) for rel, (size, digest) in found.items() if _valid(rel)}


def local_files(root: Path, max_bytes: int | None = None) -> dict[str, tuple[int, str]]:
    """Regular files of the local folder, hashed through descriptors that follow no link; files over
    ``max_bytes`` are left out (logged)."""
    workspace = Workspace(root)
    return {
        rel: (info.size, info.sha256)
        for sub in SYNCED
        for rel, info in workspace.scan(sub, limit=MAX_FILES, max_bytes=max_bytes).items()
    }


def ensure_remote_dirs(box: DaytonaBox) -> None:
    """Create ``/workspace/{files,artifacts,memory}`` (a fresh volume subpath starts empty)."""
    dirs = " ".join(f"{REMOTE_ROOT}/{sub}" for sub in SYNCED)
    response = box.retry("create /workspace", lambda: box.sandbox.process.exec(f"mkdir -p {dirs}", timeout=60))
    if response.exit_code != 0:  # no volume and no write access to /: try sudo, as Daytona images allow it
        response = box.retry(
            "create /workspace",
            lambda: box.sandbox.process.exec(
                f'sudo -n sh -c "mkdir -p {dirs} && chmod -R 777 {REMOTE_ROOT}"', timeout=60
            ),
        )
    if response.exit_code != 0:
        raise SandboxUnavailableError(f"cannot create {REMOTE_ROOT} in the Daytona sandbox: {response.result}")


Quota = tuple[int, int]  # [sandbox] workspace_mb in bytes, workspace_files


def push(box: DaytonaBox, root: Path, *, quota: Quota | None = None, max_file_bytes: int | None = None) -> None:
    """Before a turn: upload local changes, delete what was deleted locally, fetch what only the sandbox has.

    Local files are read through one descriptor each (never through a link another backend's code may
    have left); files over ``max_file_bytes`` stay local.
    """
    local = local_files(root, max_file_bytes)
    if box.baseline and box.baseline == {rel: digest for rel, (_, digest) in local.items()}:
        return  # nothing changed here since the last sync with this sandbox
    remote = remote_files(box)
    uploads = [rel for rel, (_, digest) in local.items() if remote.get(rel, (0, ""))[1] != digest]
    deletes = [rel for rel in remote if rel not in local and rel in box.baseline]
    fetches = [rel for rel in remote if rel not in local and rel not in box.baseline]
    batch: list[FileUpload] = []
    size = 0
    for rel in uploads:
        try:
            data, digest = safe_files.read_path(root, rel, max_bytes=max_file_bytes)
        except safe_files.Refused as exc:
            logger.warning("Daytona: %s not uploaded: %s", rel, exc)
            data = None
            local.pop(rel)
        if data is not None:
            batch.append(FileUpload(data, f"{REMOTE_ROOT}/{rel}"))
            size += len(data)
            local[rel] = (len(data), digest)
        if batch and (size >= UPLOAD_BATCH_BYTES or rel == uploads[-1]):
            box.retry("upload workspace files", functools.partial(box.sandbox.fs.upload_files, batch))
            batch, size = [], 0
    for rel in deletes:
        box.retry("delete a workspace file", functools.partial(box.sandbox.fs.delete_file, f"{REMOTE_ROOT}/{rel}"))
    _download(box, root, fetches, remote, quota)
    box.baseline = {rel: digest for rel, (_, digest) in local.items()}
    box.baseline.update({rel: remote[rel][1] for rel in fetches if _is_file(root / rel)})
    logger.debug("Daytona sync up: %d uploaded, %d deleted, %d fetched", len(uploads), len(deletes), len(fetches))


def pull(box: DaytonaBox, root: Path, *, max_file_bytes: int, quota: Quota | None = None) -> list[str]:
    """After a turn: bring back what the code wrote or deleted. Returns the paths that changed locally.

    Files that would take the local folder over ``quota`` stay in the sandbox (logged), like too big ones.
    """
    local, remote = local_files(root, max_file_bytes), remote_files(box)  # a bigger local file is not hashed
    fetches = [rel for rel, (size, digest) in remote.items() if local.get(rel, (0, ""))[1] != digest]
    too_big = [rel for rel in fetches if remote[rel][0] > max_file_bytes]
    for rel in too_big:
        logger.warning(
            "Daytona: %s is %d bytes, over the %d-byte limit; left in the sandbox", rel, remote[rel][0], max_file_bytes
        )
    fetches = [rel for rel in fetches if rel not in too_big]
    deletes = [rel for rel in local if rel not in remote and box.baseline.get(rel) == local[rel][1]]
    for rel in deletes:
        Workspace(root).resolve(rel).unlink(missing_ok=True)
    kept = _download(box, root, fetches, remote, quota)
    left = set(fetches) - set(kept)
    box.baseline = {rel: digest for rel, (_, digest) in remote.items() if rel not in too_big and rel not in left}
    return kept + deletes


def _is_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.stat(path, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _within_quota(root: Path, paths: list[str], sizes: dict[str, tuple[int, str]], quota: Quota | None) -> list[str]:
    """The leading ``paths`` whose download keeps the folder within ``quota``; the rest are logged."""
    if quota is None:
        return paths
    used_bytes, used_entries = usage(root)
    fitting: list[str] = []
    for rel in paths:
        target = root / rel
        old = target.stat().st_size if target.is_file() and not target.is_symlink() else None
        entries = sum(1 for parent in target.parents if not parent.exists()) + (old is None)
        if used_bytes + sizes[rel][0] - (old or 0) > quota[0] or used_entries + entries > quota[1]:
            logger.warning(
                "Daytona: %s left in the sandbox: the workspace would go over its quota (%d MB, %d files)",
                rel,
                quota[0] // (1024 * 1024),
                quota[1],
            )
            continue
        used_bytes, used_entries = used_bytes + sizes[rel][0] - (old or 0), used_entries + entries
        fitting.append(rel)
    return fitting


def _download(
    box: DaytonaBox, root: Path, paths: list[str], sizes: dict[str, tuple[int, str]], quota: Quota | None
) -> list[str]:
    """Fetch ``paths`` into the folder, as far as the quota allows; returns the ones written."""
    paths = _within_quota(root, paths, sizes, quota)
    if not paths:
        return []
    written: list[str] = []
    requests = [FileDownloadRequest(source=f"{REMOTE_ROOT}/{rel}") for rel in paths]
    results = box.retry("download workspace files", lambda: box.sandbox.fs.download_files(requests))
    workspace = Workspace(root)
    for rel, result in zip(paths, results, strict=False):
        if result.error or result.result is None:
            logger.warning("Daytona: could not download %s: %s", rel, result.error)
            continue
        try:
            target = workspace.resolve(rel)  # refuses anything that escapes the folder, symlinks included
        except ValueError:
            logger.warning("Daytona: refusing to write %s outside the workspace", rel)
            continue
        data = result.result if isinstance(result.result, bytes) else str(result.result).encode()
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        os.chmod(target, 0o600)
        written.append(rel)
    return written
