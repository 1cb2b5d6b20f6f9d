"""What a ``%%fleet`` turn is told about the notebook: its variables (never their values) and recent cells.

The catalogue is text for the model's prompt, bounded however big the namespace: one line per variable
with its type and size (shape, length, a DataFrame's columns and dtypes), and with ``previews`` a short
repr. Modules, callables, private names, IPython's own (``In``, ``Out``, ``exit``, ...) and names that look
like secrets are left out; only what the catalogue lists may be fetched with ``notebook("name")``.
"""

from __future__ import annotations

import re
import reprlib
import traceback
import types
from collections.abc import Collection
from typing import Any

MODES = ("off", "names", "previews")
MAX_CATALOGUE_CHARS = 4000  # the variables' part of the prompt
MAX_CELLS_CHARS = 3000  # the recent cells' part
RECENT_CELLS = 3
CELL_SOURCE_CHARS = 600
CELL_OUTPUT_CHARS = 400
TRACEBACK_CHARS = 1500
PREVIEW_CHARS = 120
MAX_LINE_CHARS = 400  # one variable's description
MAX_COLUMNS = 12
IPYTHON_NAMES = frozenset({"In", "Out", "exit", "quit", "get_ipython"})
SECRET = re.compile(r"key|token|secret|passw|credential", re.IGNORECASE)


def allowed(name: str, value: Any) -> bool:
    """Whether the model may see ``name`` in the catalogue and fetch its value."""
    if not name.isidentifier() or name.startswith("_") or name in IPYTHON_NAMES or SECRET.search(name):
        return False
    return not (isinstance(value, types.ModuleType | type) or callable(value))


def allowed_names(ns: dict[str, Any]) -> list[str]:
    """The names of ``ns`` the catalogue lists, in the order they were defined."""
    return [name for name, value in list(ns.items()) if allowed(name, value)]


def describe(value: Any) -> str:
    """``type`` and size, never the value: ``DataFrame 3x2 [city: object, n: int64]``, ``list len 40``."""
    kind = type(value).__name__
    columns, dtypes = getattr(value, "columns", None), getattr(value, "dtypes", None)
    shape = getattr(value, "shape", None)
    if isinstance(shape, tuple) and all(isinstance(n, int) for n in shape):
        text = f"{kind} {'x'.join(map(str, shape)) or 'scalar'}"
        if columns is not None and dtypes is not None:
            pairs = [f"{c}: {t}" for c, t in list(zip(columns, dtypes, strict=False))[:MAX_COLUMNS]]
            more = f", ... {len(columns) - MAX_COLUMNS} more" if len(columns) > MAX_COLUMNS else ""
            text += f" [{', '.join(pairs)}{more}]"
        elif dtypes is None and getattr(value, "dtype", None) is not None:
            text += f" dtype {value.dtype}"
        return text
    if isinstance(value, str | bytes | bytearray | list | tuple | dict | set | frozenset):
        return f"{kind} len {len(value)}"
    return kind


def preview(value: Any) -> str:
    """A bounded repr (``reprlib``: long containers and strings are cut)."""
    short = reprlib.Repr()
    short.maxstring = short.maxother = PREVIEW_CHARS
    try:
        text = short.repr(value)
    except Exception as exc:  # noqa: BLE001 - a repr of the user's is the user's code
        text = f"<repr failed: {type(exc).__name__}>"
    text = " ".join(text.split())
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 3] + "..."


def variables(ns: dict[str, Any], mode: str = "names", given: Collection[str] = ()) -> str:
    """The variables' lines, at most ``MAX_CATALOGUE_CHARS`` (the newest names kept when cut). Names in
    ``given`` (the cell's ``--in`` values) are left out: the turn has them as inputs, listed with those."""
    if mode == "off":
        return ""
    lines: list[str] = []
    for name in reversed(allowed_names(ns)):  # the newest first: they are what the user just made
        if name in given:
            continue
        try:
            line = f"- {name}: {describe(ns[name])}"
        except Exception:  # noqa: BLE001 - an object of the user's whose attributes raise: its type will do
            line = f"- {name}: {type(ns[name]).__name__}"
        if len(line) > MAX_LINE_CHARS:  # columns with very long names
            line = line[: MAX_LINE_CHARS - 4] + " ..."
        if mode == "previews":
            line += f" = {preview(ns[name])}"
        lines.append(line)
    kept: list[str] = []
    size = 0
    for line in lines:
        if size + len(line) + 1 > MAX_CATALOGUE_CHARS:
            kept.append(f"- ... {len(lines) - len(kept)} more names not listed")
            break
        kept.append(line)
        size += len(line) + 1
    return "\n".join(kept)


SECRET_ASSIGNMENT = re.compile(
    r"^(\s*[\w.\[\]'\"]*(?:key|token|secret|passw|credential)\w*['\"\]]*\s*[:=]).*$", re.I | re.M
)


def masked(source: str) -> str:
    """A cell's source with what is assigned to secret-looking names replaced (``api_key = <hidden>``)."""
    return SECRET_ASSIGNMENT.sub(r"\1 <hidden>", source)


def _cut(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else f"{text[: limit // 2]}\n...\n{text[-limit // 2 :]}"


def recent_cells(
    inputs: list[str], outputs: dict[int, Any], error: BaseException | None, current: int, count: int = RECENT_CELLS
) -> str:
    """The last ``count`` cells before cell ``current``: source, a bounded repr of ``Out``, and the last
    cell's traceback when it failed (``error``). ``inputs`` is IPython's ``In`` (index = cell number)."""
    parts: list[str] = []
    numbers = [n for n in range(current - 1, 0, -1) if n < len(inputs) and inputs[n].strip()][:count]
    for n in reversed(numbers):
        part = f"In [{n}]:\n{_cut(masked(inputs[n]), CELL_SOURCE_CHARS)}"
        if n in outputs:
            part += f"\nOut[{n}]: {_cut(preview(outputs[n]), CELL_OUTPUT_CHARS)}"
        parts.append(part)
    if error is not None:
        trace = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        parts.append(f"The last cell failed:\n{_cut(trace, TRACEBACK_CHARS)}")
    return _cut("\n\n".join(parts), MAX_CELLS_CHARS)


def prompt(variables_text: str, cells_text: str, tool_names: list[str]) -> str:
    """The notebook's part of a turn's instructions."""
    parts = []
    if variables_text:
        parts.append(
            "The user's notebook holds these variables (names, types and sizes only). To use one, fetch its "
            f'value in code: `value = notebook("name")`; only these names can be fetched.\n{variables_text}'
        )
    if cells_text:
        parts.append(f"The notebook's most recent cells, oldest first:\n{cells_text}")
    if tool_names:
        parts.append(
            f"The user's own functions are tools you can call from code: {', '.join(tool_names)}. "
            "They run in the user's notebook; arguments and results are plain data."
        )
    return "\n\n".join(parts)
