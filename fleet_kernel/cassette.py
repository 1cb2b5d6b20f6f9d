"""The cassette file a replayed or recorded model keeps its exchanges in: its shape, its keys and its reading
and writing. No dspy here, so ``fleet doctor lm`` checks a replay model's cassette without loading it."""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fleet_kernel.errors import LMError

CASSETTE_VERSION = 1
_DIGITS = re.compile(r"\d+")


def exact_key(messages: list[dict[str, str]]) -> str:
    return hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()


def loose_key(messages: list[dict[str, str]]) -> str:
    """The key without the system prompt and with digit runs masked.

    It survives what drifts between machines without changing what was asked: the sandbox's description
    (Python version, installed packages) in the system prompt, file sizes and durations in the inputs.
    """
    masked = [{"role": m["role"], "content": _DIGITS.sub("#", m["content"])} for m in messages if m["role"] != "system"]
    return exact_key(masked)


FINISH_REASONS = ("stop", "length", "tool_call", "content_filter", "error")


def _shape_problem(data: Any) -> str | None:
    """What keeps ``data`` from being a cassette this version replays, or None."""
    if not isinstance(data, dict) or data.get("version") != CASSETTE_VERSION:
        return f"a cassette is a JSON object with version {CASSETTE_VERSION}"
    if not isinstance(data.get("exchanges"), list):
        return "it has no list of exchanges"
    for number, entry in enumerate(data["exchanges"], 1):
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("key"), str)
            and isinstance(entry.get("loose"), str)
            and isinstance(entry.get("messages"), list)
            and isinstance(entry.get("response"), dict)
            and isinstance(entry["response"].get("text"), str)
        ):
            return f"exchange {number} lacks key, loose, messages or response.text"
    return None


class Cassette:
    """A cassette file: a header and a list of exchanges, rewritten atomically on every append."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self.data = data
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path: str | Path, *, trusted: bool = True) -> Cassette:
        """Raises ``LMError`` when the file is missing or not a cassette; only a ``trusted`` one (the
        operator's) has the reader's error (bytes, offsets) in the message."""
        path = Path(path).expanduser()
        record = f"record one with FLEET_LM_RECORD={path} and a real FLEET_LM_MODEL"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise LMError(
                f"the replay cassette {path} does not exist: {record}, or fix the path in FLEET_LM_MODEL=replay/<file>",
                code="lm_replay_missing",
            ) from exc
        except (OSError, ValueError) as exc:
            reason = f" ({exc})" if trusted else ""
            message = f"cannot read the replay cassette {path}{reason}: {record}"
            raise LMError(message, code="lm_replay_invalid") from exc
        problem = _shape_problem(data)
        if problem:
            raise LMError(f"{path} is not a Fleet cassette ({problem}): {record}", code="lm_replay_invalid")
        return cls(path, data)

    @classmethod
    def open_for_recording(cls, path: str | Path, model: str) -> Cassette:
        path = Path(path).expanduser()
        if path.exists():
            cassette = cls.load(path)
        else:
            header = {"version": CASSETTE_VERSION, "label": f"recorded from {model}", "exchanges": []}
            cassette = cls(path, header)
        cassette.data.setdefault("model", model)
        cassette.data["recorded_at"] = datetime.now(UTC).isoformat(timespec="seconds")
        return cassette

    @property
    def exchanges(self) -> list[dict[str, Any]]:
        exchanges: list[dict[str, Any]] = self.data["exchanges"]
        return exchanges

    def append(
        self,
        messages: list[dict[str, str]],
        text: str,
        usage: dict[str, int],
        cost: float | None,
        stream: list[list[float]] | None = None,
        *,
        params: dict[str, Any] | None = None,
        finish_reason: str | None = None,
    ) -> None:
        response: dict[str, Any] = {"text": text, "usage": usage, "cost_usd": cost, "finish_reason": finish_reason}
        if stream:
            response["stream"] = stream
        entry: dict[str, Any] = {
            "key": exact_key(messages),
            "loose": loose_key(messages),
            "messages": messages,
        }
        if params is not None:
            entry["request"] = params
        entry["response"] = response
        with self._lock:
            self.exchanges.append(entry)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".cassette-")
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(self.data, handle, indent=1, ensure_ascii=False)
                handle.write("\n")
            os.replace(tmp, self.path)
