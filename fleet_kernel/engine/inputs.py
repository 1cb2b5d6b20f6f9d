"""Notebook values handed to a turn as RLM input variables (``%%fleet --in df,notes``).

Each value is encoded once on the host into text that is safe to send (the value itself for ``str``,
base64 for ``bytes``, JSON for numbers, lists and dicts, pandas' ``to_json(orient="split")`` for
DataFrames and Series) and wrapped as a dspy ``SandboxSerializable``: dspy.RLM then sends it into the
sandbox once, when the turn's interpreter starts, rebuilds it there under its own name, and shows the
model only its name, type, size and a short preview. Nothing is ever unpickled, on either side.
"""

from __future__ import annotations

import base64
import json
import keyword
import sys
from typing import Any

from dspy.primitives.sandbox_serializable import SandboxSerializable

from fleet_kernel.engine.images import Picture, from_value
from fleet_kernel.errors import ValidationError

RESERVED = frozenset(
    {"task", "history", "workspace", "answer", "SUBMIT", "llm_query", "llm_query_batched", "print", "look"}
)
PREVIEW_CHARS = 300
_PLAIN = (str, bytes, int, float, bool, type(None))


class NotebookValue(SandboxSerializable):
    """One encoded value: ``payload`` is the text sent, ``assignment`` rebuilds the value from it."""

    image: Picture | None = None  # an image value: also shown to the model (``engine.images``)

    def __init__(self, name: str, type_name: str, payload: str, assignment: str, preview: str, size: int) -> None:
        self.name = name
        self.type_name = type_name
        self.payload = payload
        self.assignment = assignment
        self.preview = preview
        self.size = size

    def sandbox_setup(self) -> str:
        return ""

    def to_sandbox(self) -> str:  # dspy sends a str as it is, without copying it
        return self.payload

    def sandbox_assignment(self, var_name: str, data_expr: str) -> str:
        return self.assignment.format(name=var_name, raw=data_expr)

    def rlm_preview(self, max_chars: int = 500) -> str:
        unit = "characters" if self.type_name == "str" else "bytes as sent"
        return f"{self.type_name}, {self.size:,} {unit}\n{self.preview}"[:max_chars]

    def __str__(self) -> str:
        return self.rlm_preview()


def check_name(name: str) -> None:
    """Raises ``ValidationError`` for a name the sandbox cannot bind or one Fleet uses."""
    if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_") or name in RESERVED:
        raise ValidationError(
            f"{name!r} cannot be an input variable: use a plain Python name not starting with _ "
            f"and not one of {', '.join(sorted(RESERVED))}"
        )


def encode(name: str, value: Any) -> NotebookValue:
    """Encode ``value`` for the sandbox. Raises ``ValidationError`` for a type that cannot travel."""
    check_name(name)
    kind = type(value).__name__
    picture = from_value(value, name)
    if picture is not None:  # bound as its PNG/JPEG bytes, and shown to the model as an image
        payload = base64.b64encode(picture.data).decode("ascii")
        preview = f"{picture.describe()}: the image is attached to your prompt; here its bytes"
        image = _wrap(name, "image", payload, "import base64 as _b64\n{name} = _b64.b64decode({raw})", preview)
        image.image = picture
        return image
    if isinstance(value, str):
        return _wrap(name, "str", value, "{name} = {raw}", value)
    if isinstance(value, (bytes, bytearray)):
        payload = base64.b64encode(bytes(value)).decode("ascii")
        return _wrap(
            name, "bytes", payload, "import base64 as _b64\n{name} = _b64.b64decode({raw})", repr(bytes(value[:200]))
        )
    frame = _as_frame(value)
    if frame is not None:
        payload = frame.to_json(orient="split", date_format="iso")
        assignment = (
            "import io as _io, json as _json\n"
            "try:\n    import pandas as _pd\n    {name} = _pd.read_json(_io.StringIO({raw}), orient='split')\n"
            "except ImportError:\n    {name} = _json.loads({raw})"
        )
        shape = f"{frame.shape[0]} rows x {frame.shape[1]} columns: {', '.join(map(str, frame.columns[:20]))}"
        return _wrap(name, "DataFrame", payload, assignment, f"{shape}\n{frame.head(5).to_string()[:PREVIEW_CHARS]}")
    if not _plain(value):
        raise ValidationError(
            f"{name} is a {kind}: an input variable must be str, bytes, a number, a list or dict of those, "
            "a pandas DataFrame or Series, or an image (PNG/JPEG bytes, a PIL image, a uint8 array HxW or HxWx3/4)"
        )
    payload = json.dumps(value)
    return _wrap(name, kind, payload, "import json as _json\n{name} = _json.loads({raw})", payload)


def _wrap(name: str, type_name: str, payload: str, assignment: str, preview: str) -> NotebookValue:
    if len(preview) > PREVIEW_CHARS:
        preview = preview[: PREVIEW_CHARS // 2] + " ... " + preview[-PREVIEW_CHARS // 2 :]
    # dspy names the variable's type after its class: show the notebook's type, not the wrapper's.
    cls = type(type_name, (NotebookValue,), {})
    value: NotebookValue = cls(name, type_name, payload, assignment, preview, len(payload))
    return value


def _as_frame(value: Any) -> Any:
    """A DataFrame for a pandas DataFrame or Series, else None (pandas is only imported if it already is)."""

    pd = sys.modules.get("pandas")
    if pd is None:
        return None
    if isinstance(value, pd.Series):
        return value.to_frame()
    return value if isinstance(value, pd.DataFrame) else None


def _plain(value: Any, depth: int = 0) -> bool:
    if depth > 20:
        return False
    if isinstance(value, _PLAIN):
        return not isinstance(value, bytes)
    if isinstance(value, (list, tuple)):
        return all(_plain(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v, depth + 1) for k, v in value.items())
    return False
