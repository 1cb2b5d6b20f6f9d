"""Values that cross into the sandbox: made JSON, and sent only when the sandbox does not hold them already."""

from __future__ import annotations

import hashlib
import json
import keyword
from collections.abc import Container
from typing import Any

from dspy.primitives.code_interpreter import CodeInterpreterError
from pydantic_core import to_jsonable_python


def to_json(value: Any) -> Any:
    """Values that cross the boundary must be JSON; convert pydantic models and the like, else repr."""
    if isinstance(value, str):
        return value  # a large input is not serialised just to learn that it can be
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return to_jsonable_python(value, fallback=repr)


def _digest(value: Any) -> bytes:
    return hashlib.blake2b(json.dumps(value).encode(), digest_size=16).digest()


class HeldVariables:
    """The variables one running sandbox holds: ``(value, digest)`` by name, forgotten when the sandbox goes."""

    def __init__(self) -> None:
        self._sent: dict[str, tuple[Any, bytes | None]] = {}

    def clear(self) -> None:
        """A new sandbox (or none): it holds nothing yet."""
        self._sent = {}

    def changed(self, variables: dict[str, Any], tools: Container[str]) -> dict[str, Any]:
        """Only what the sandbox does not already hold; RLM re-sends every input on every step.

        A ``str`` or ``bytes`` is hashed only when another value comes under its name (a large input
        is sent without being hashed); a mutable value is hashed when sent, so a change in place shows.

        Raises:
            CodeInterpreterError: a name that is not an identifier, or is ``SUBMIT`` or one of ``tools``.
        """
        changed: dict[str, Any] = {}
        for name, value in variables.items():
            if not name.isidentifier() or keyword.iskeyword(name) or name == "SUBMIT" or name in tools:
                raise CodeInterpreterError(f"Cannot inject a variable named {name!r}.")
            held = self._sent.get(name)
            immutable = isinstance(value, (str, bytes, int, float, bool))
            if held is not None and held[0] is value and immutable:
                continue
            value = to_json(value)
            if held is None and immutable:
                changed[name] = value
                self._sent[name] = (variables[name], None)
                continue
            digest = _digest(value)
            before = None if held is None else held[1] if held[1] is not None else _digest(to_json(held[0]))
            if before != digest:
                changed[name] = value
            self._sent[name] = (variables[name], digest)
        return changed
