"""Hints added to a step's error where small models were seen to repeat the same mistake: the error
alone did not tell them what to write instead (Qwen2.5-Coder-1.5B, docs/real-models.md)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from fleet_kernel.workspace import MANIFEST_HEADING

_WORKSPACE_RELATIVE = re.compile(r"No such file or directory: '(workspace/[^']*)'")
_LISTING_AS_PATH = re.compile(r"No such file or directory: '" + re.escape(MANIFEST_HEADING) + r"[^']*?([\w./-]*)'")
_FROM_IMPORT = re.compile(r"^\s*from\s+[\w.]+\s+import\s+(?:\(([^)]*)\)|([^\n#;]+))", re.MULTILINE)


def hint(error: str, code: str, provided: Iterable[str]) -> str:
    """What to add to ``error``, the failed step's text, so that the next step can recover ('' if nothing)."""
    return _path_hint(error) or _import_hint(error, code, provided)


def _path_hint(error: str) -> str:
    """A file not found under ``workspace/...``: the model dropped the leading slash of
    ``/workspace/files/x``, and the working directory is /workspace itself; or a path built on the
    ``workspace`` input, a listing the model took for the folder's path (``open(workspace + '/files/app.log')``)."""
    listing = _LISTING_AS_PATH.search(error)
    if listing is not None:
        tail = listing.group(1)
        tail = tail[tail.index("/") :] if "/" in tail else "/files/NAME"
        return f"\n(`workspace` is a listing of the folder, not its path: write '/workspace{tail}'.)"
    found = _WORKSPACE_RELATIVE.search(error)
    if found is None:
        return ""
    path = found.group(1)
    return f"\n(The working directory is /workspace: write '/{path}' or '{path.removeprefix('workspace/')}'.)"


def _import_hint(error: str, code: str, provided: Iterable[str]) -> str:
    """An import of a name the sandbox already binds (``from dspy import llm_query``), which fails: the
    module is not there, or does not have it."""
    if "ImportError" not in error and "ModuleNotFoundError" not in error:
        return ""
    listed = ",".join(found[1] or found[2] for found in _FROM_IMPORT.finditer(code))
    imported = {name.split(" as ")[0].strip() for name in listed.split(",")}
    names = sorted(imported & set(provided))
    if not names:
        return ""
    if len(names) == 1:
        return f"\n({names[0]} is already defined in the sandbox: call it as it is, with no import.)"
    return f"\n({', '.join(names)} are already defined in the sandbox: call them as they are, with no import.)"
