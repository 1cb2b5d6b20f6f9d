"""Imports of heavy modules (dspy and what loads it) from several threads, one at a time.

Two threads importing different parts of dspy at once can each meet the other's half-initialised module
("module 'dspy' has no attribute 'Signature'", or an ImportError "most likely due to a circular import").
The kernel's background warm-up, the runner's import of the dspy side and on-demand imports therefore
take turns through ``import_module``.
"""

from __future__ import annotations

import importlib
import sys
import threading
import time
from types import ModuleType

_IMPORTS = threading.RLock()
UNUSED_MODULES = ("rfc3987_syntax",)
"""Never imported by Fleet's own processes (the kernel, ``fleet serve`` and the other ``fleet`` commands).
jsonschema (which dspy and nbformat import) checks the ``iri`` format with rfc3987_syntax when it is installed
(jupyter_server's extras install it), and importing it compiles a Lark grammar: the engine's import (dspy
included) took 1.95 s of CPU with it and 0.84 s without. Nothing in Fleet validates ``iri`` formats: dspy and
nbformat validate without a ``FormatChecker``. Not applied where Fleet is a guest (the ``%%fleet`` magic in a
user's python3 kernel)."""
RETRIES = 10  # a module another thread is still importing: wait for it and import again
RETRY_S = 0.2


def import_module(name: str) -> ModuleType:
    """``importlib.import_module``, serialised with every other call of this function."""
    module = sys.modules.get(name)
    if module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False) is False:
        return module
    with _IMPORTS:
        for attempt in range(RETRIES):
            try:
                return importlib.import_module(name)
            except (ImportError, AttributeError) as exc:  # met a thread that imports outside this lock
                if attempt == RETRIES - 1 or not _half_imported(exc):
                    raise
                time.sleep(RETRY_S)
        raise AssertionError("unreachable")


def _half_imported(exc: BaseException) -> bool:
    text = str(exc)
    return "partially initialized" in text or "circular import" in text or "has no attribute" in text


def skip_unused_imports() -> None:
    """Make ``UNUSED_MODULES`` unimportable in this process (libraries that try them carry on without)."""
    for name in UNUSED_MODULES:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]
