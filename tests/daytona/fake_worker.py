"""Stand-in for the Daytona daemon's Python REPL worker, run by the loopback fake (tests only).

Reads one JSON command per stdin line (``{"code", "envs"}``), runs it in one persistent namespace
and answers with JSON chunks on stdout, as the daemon's worker does: ``stdout``/``stderr`` text
flushed at each newline or 1 KiB (so each ``print`` is one frame), an ``error`` chunk when the
code raises, then a ``control`` chunk (``completed`` or ``interrupted``) that ends the execution.
SIGINT interrupts the running code, as the daemon does on a timeout; SIGTERM ends the worker.
Stdlib only: it runs under the sandbox's Python, not the test venv's packages.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sys
import threading
import traceback
from typing import Any

_channel = sys.__stdout__
_channel_lock = threading.Lock()


def emit(chunk: dict[str, Any]) -> None:
    line = json.dumps(chunk) + "\n"
    with _channel_lock:
        _channel.write(line)
        _channel.flush()


class Emitter(io.TextIOBase):
    """``sys.stdout``/``sys.stderr`` during an execution: one chunk per line or per KiB."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._parts: list[str] = []
        self._size = 0
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def write(self, data: Any) -> int:
        text = data if isinstance(data, str) else str(data)
        if not text:
            return 0
        with self._lock:
            self._parts.append(text)
            self._size += len(text)
            if "\n" in text or self._size >= 1024:
                self._flush_locked()
        return len(text)

    def flush(self) -> None:
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        if self._parts:
            text, self._parts, self._size = "".join(self._parts), [], 0
            emit({"type": self.kind, "text": text})


class Worker:
    def __init__(self) -> None:
        self.namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
        self.stopping = False
        signal.signal(signal.SIGINT, self._on_sigint)
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        raise KeyboardInterrupt("Execution interrupted")

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.stopping = True
        raise KeyboardInterrupt("Shutting down")

    def run_one(self, code: str, envs: dict[str, Any] | None) -> None:
        out, err = Emitter("stdout"), Emitter("stderr")
        saved = {key: os.environ.get(key) for key in envs or {}}
        for key, value in (envs or {}).items():
            os.environ[key] = str(value)
        control, error = "completed", None
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                exec(compile(code, "<string>", "exec"), self.namespace)
        except KeyboardInterrupt:
            control = "interrupted"
        except SystemExit:
            pass
        except BaseException as exc:
            frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == "<string>"]
            lines = ["Traceback (most recent call last):\n"] if frames else []
            lines += [f'  File "<stdin>", line {f.lineno}\n' + (f"    {f.line}\n" if f.line else "") for f in frames]
            lines.append(f"{type(exc).__name__}: {exc}\n")
            error = {"type": "error", "name": type(exc).__name__, "value": str(exc), "traceback": "".join(lines)}
        finally:
            out.flush()
            err.flush()
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            if error is not None:
                emit(error)
            emit({"type": "control", "text": control})

    def serve(self) -> None:
        while not self.stopping:
            try:
                line = sys.stdin.readline()
                if not line:
                    return
                if not line.strip():
                    continue
                command = json.loads(line)
                self.run_one(str(command.get("code", "")), command.get("envs"))
            except KeyboardInterrupt:
                continue
            except ValueError as exc:
                emit({"type": "error", "name": type(exc).__name__, "value": str(exc), "traceback": ""})
                emit({"type": "control", "text": "completed"})


if __name__ == "__main__":
    worker = Worker()
    emit({"type": "hello", "pid": os.getpid()})  # for the fake only: which process to signal
    worker.serve()
