"""The notebook's side of a ``%%fleet`` turn: ``notebook("name")`` and the user's own functions as host tools.

Host tools run on the turn's tool threads, but the user's namespace and functions belong to the kernel's
main thread, which sits in ``Engine.wait`` while a turn runs. So each call is handed to that thread
(``MainThreadCalls``) and runs there between its polls, as a cell would: reading a value, encoding it and
calling a user's function never race the notebook. A call waits at most ``timeout_s``; an interrupt stops
the function (a ``KeyboardInterrupt`` on the main thread) and the turn.

Values cross as ``--in`` values do (``engine.inputs.encode``: text, base64 or JSON, a DataFrame as pandas'
split JSON), tagged so the sandbox rebuilds them (``sandbox/runtime.py`` ``_tool_value``); nothing is pickled.
"""

from __future__ import annotations

import concurrent.futures
import functools
import inspect
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleet_kernel.cancel import CancelToken

VALUE_TAG = "__fleet_value__"  # as sandbox/runtime.py reads it
WAIT_SLICE_S = 0.1
TAKEN = frozenset(
    {"notebook", "remember", "search_memories", "forget", "load_skill", "read_skill_resource", "llm_query"}
    | {"llm_query_batched", "SUBMIT", "print", "task", "history", "workspace", "answer"}
)


class MainThreadCalls:
    """Calls from tool threads, run on the thread that calls ``run_pending`` (the magic's main thread)."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = queue.SimpleQueue()
        self._wake = threading.Event()

    def call(self, what: str, fn: Callable[[], Any], timeout_s: float, cancel: CancelToken) -> Any:
        """``fn()`` on the main thread; raises what it raised, ``TimeoutError`` past ``timeout_s``, or
        ``RuntimeError`` once the turn is interrupted (the turn then stops waiting for it)."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._calls.put((fn, future))
        self._wake.set()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return future.result(timeout=WAIT_SLICE_S)
            except concurrent.futures.TimeoutError:
                if cancel.cancelled:
                    future.cancel()
                    raise RuntimeError(f"{what} was interrupted") from None
                if time.monotonic() > deadline:
                    future.cancel()
                    raise TimeoutError(f"{what} took longer than {timeout_s:g} s and was given up") from None

    def wait(self, timeout: float) -> None:
        """Sleep until a call comes or ``timeout`` passes (``wake`` ends it early)."""
        self._wake.wait(timeout)
        self._wake.clear()

    def wake(self) -> None:
        self._wake.set()

    def run_pending(self) -> None:
        """Run the calls waiting now. A ``KeyboardInterrupt`` in one fails that call and is raised again."""
        while True:
            try:
                fn, future = self._calls.get_nowait()
            except queue.Empty:
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except Exception as exc:  # noqa: BLE001 - the user's error goes back to the model
                future.set_exception(exc)
            except BaseException:
                future.set_exception(RuntimeError("interrupted in the notebook"))
                raise


def to_wire(value: Any, cap_bytes: float) -> Any:
    """``value`` as a tool result: plain JSON as it is, else tagged as ``--in`` encodes it (raises
    ``ValueError`` for a type that cannot travel, or one larger than ``cap_bytes`` as sent)."""
    from fleet_kernel.engine.inputs import encode  # dspy is loaded: the turn runs
    from fleet_kernel.errors import ValidationError

    if callable(getattr(value, "tolist", None)) and hasattr(value, "shape") and not hasattr(value, "index"):
        value = value.tolist()  # a NumPy array (a DataFrame or Series is encoded as a table)
    if value is None or isinstance(value, bool | int | float):
        return value
    try:
        encoded = encode("value", value)
    except ValidationError as exc:
        raise ValueError(exc.message.replace("value is a", "the value is a", 1)) from None
    if encoded.size > cap_bytes:
        raise ValueError(
            f"the value is {encoded.size / 1048576:,.1f} MB as sent; the limit is {cap_bytes / 1048576:g} MB "
            "([kernel] max_input_mb)"
        )
    return {VALUE_TAG: encoded.type_name, "payload": encoded.payload}


def from_wire(value: Any) -> Any:
    """An argument from sandbox code: a tagged DataFrame rebuilt, lists and dicts looked into."""
    if isinstance(value, dict):
        if value.get(VALUE_TAG) == "DataFrame" and isinstance(value.get("payload"), str):
            import io

            import pandas as pd  # type: ignore[import-untyped]  # the sandbox sent a DataFrame: pandas is there on both sides

            return pd.read_json(io.StringIO(value["payload"]), orient="split")
        return {k: from_wire(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_wire(v) for v in value]
    return value


@dataclass
class NotebookBridge:
    """One turn's view of the notebook: what the prompt says, and the host tools that reach into it."""

    ns: dict[str, Any]
    names: frozenset[str]  # what ``notebook()`` may fetch: the catalogue's names (none with context off)
    functions: dict[str, Callable[..., Any]]  # the user's tools, by name
    calls: MainThreadCalls
    cancel: CancelToken
    timeout_s: float
    cap_bytes: float
    prompt: str = ""
    fetch: bool = True  # context is not off: ``notebook()`` is a tool
    _made: list[Callable[..., Any]] = field(default_factory=list)

    def host_tools(self) -> list[Callable[..., Any]]:
        if not self._made:
            self._made = ([self._notebook_tool()] if self.fetch else []) + [
                self._user_tool(name, fn) for name, fn in self.functions.items()
            ]
        return self._made

    def _notebook_tool(self) -> Callable[..., Any]:
        bridge = self

        def notebook(name: str) -> Any:
            """The value of the variable `name` of the user's notebook (one the prompt lists), as a copy:
            a DataFrame, str, bytes, number, list or dict."""
            if name not in bridge.names:
                raise NameError(
                    f"{name!r} is not a notebook variable you may fetch; the ones you may are listed in your "
                    "instructions (private, secret-looking names, modules and functions are never shared)"
                )
            return bridge.calls.call(
                f"notebook({name!r})",
                lambda: to_wire(bridge.ns[name], bridge.cap_bytes) if name in bridge.ns else _gone(name),
                bridge.timeout_s,
                bridge.cancel,
            )

        return notebook

    def _user_tool(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        bridge = self

        @functools.wraps(fn)
        def tool(*args: Any, **kwargs: Any) -> Any:
            args, kwargs = tuple(from_wire(a) for a in args), {k: from_wire(v) for k, v in kwargs.items()}
            return bridge.calls.call(
                f"{name}()", lambda: to_wire(fn(*args, **kwargs), bridge.cap_bytes), bridge.timeout_s, bridge.cancel
            )

        tool.__name__ = tool.__qualname__ = name
        if not _described(tool):  # annotations pydantic cannot describe (a DataFrame): the names stay
            tool.__annotations__ = {}
        return tool


def _gone(name: str) -> Any:
    raise NameError(f"{name!r} is no longer defined in the notebook")


def _described(tool: Callable[..., Any]) -> bool:
    """Whether dspy can build the tool's argument schema from its annotations."""
    import dspy  # the turn is starting: dspy is loaded

    try:
        dspy.Tool(tool)
        return True
    except Exception:  # noqa: BLE001 - any annotation it cannot use
        return False


def check_tool(name: str, value: Any) -> str | None:
    """Why ``name`` cannot be a user tool, or None."""
    if not name.isidentifier() or name.startswith("_") or name in TAKEN:
        return f"{name!r} cannot be a tool name (a plain Python name not starting with _, not one of Fleet's own)"
    if not callable(value) or inspect.isclass(value):
        return f"{name} is a {type(value).__name__}, not a function"
    return None
