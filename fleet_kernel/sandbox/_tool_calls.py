"""Host tools called by sandboxed code: each call on a thread of its own, at most ``MAX_TOOL_CALLS`` at once.

A call runs in a copy of the executing thread's context (the engine's observer, its tool scope), is
reported to the observer (dspy's own bridge to the host is not: it is no tool of the user's), and its
result or error goes back to the sandbox. A call stopped by a ``BaseException`` (a cancellation) is
answered as an error, so the code unblocks, and handed to ``on_fatal`` to be raised on the caller.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import threading
from collections.abc import Callable
from typing import Any

from fleet_kernel.sandbox._protocol import SandboxSession, SessionClosed
from fleet_kernel.sandbox._values import to_json
from fleet_kernel.sandbox.base import current_observer, run_with_context
from fleet_kernel.sandbox.runtime import MessageType, ToolError, ToolResult

logger = logging.getLogger(__name__)

MAX_TOOL_CALLS = 64  # host tool calls of one execution running at once (one thread each); code can forge more


def by_name(tool: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """Positional arguments passed by name when the tool names them: dspy wraps user tools as
    ``invoke(**kwargs)`` (with the function's signature), so ``load_skill('x')`` must arrive as ``name='x'``."""
    try:
        signature = inspect.signature(tool)
    except (TypeError, ValueError):
        return args, kwargs
    if any(p.kind in (p.VAR_POSITIONAL, p.POSITIONAL_ONLY) for p in signature.parameters.values()):
        return args, kwargs
    try:
        return [], dict(signature.bind(*args, **kwargs).arguments)
    except TypeError:
        return args, kwargs  # the call reports the mismatch itself


class ToolCalls:
    """The host tool calls of one execution: started on threads, counted while they run (``running``).

    ``invoke(name, args, kwargs)`` runs one tool; ``on_fatal`` receives a call's ``BaseException``.
    """

    def __init__(
        self,
        session: SandboxSession,
        invoke: Callable[[str, list[Any], dict[str, Any]], Any],
        on_fatal: Callable[[BaseException], None],
    ) -> None:
        self._session, self._invoke, self._on_fatal = session, invoke, on_fatal
        self._lock = threading.Lock()
        self.running = 0

    def _add(self, delta: int) -> None:
        with self._lock:
            self.running += delta

    def start(self, call: dict[str, Any]) -> None:
        """Run the tool ``call`` names on a thread of its own; past ``MAX_TOOL_CALLS`` at once, refuse it."""
        if self.running >= MAX_TOOL_CALLS:
            with contextlib.suppress(SessionClosed):
                self._session.send(
                    {
                        "type": MessageType.TOOL_ERROR,
                        "id": call.get("id"),
                        "error": {
                            "type": "RuntimeError",
                            "message": f"more than {MAX_TOOL_CALLS} tool calls at once; wait for some",
                        },
                    }
                )
            return
        self._add(1)
        threading.Thread(
            target=run_with_context(self._run, call),
            daemon=True,
            name=f"fleet-tool-{call.get('name')}",
        ).start()

    def _run(self, call: dict[str, Any]) -> None:
        name, args, kwargs = str(call.get("name")), list(call.get("args") or []), dict(call.get("kwargs") or {})
        observer = current_observer()
        tool_scope = getattr(observer, "tool_scope", None)
        if name.startswith("__dspy"):  # dspy's bridge to the host (a child RLM): not a tool of the user's
            observer = None
        call_id = observer.on_tool_start(name, tuple(args), kwargs) if observer is not None else ""
        ok, outcome = True, None
        reply: ToolResult | ToolError
        try:
            with tool_scope() if tool_scope is not None else contextlib.nullcontext():
                outcome = self._invoke(name, args, kwargs)
            reply = {"type": MessageType.TOOL_RESULT, "id": call["id"], "value": to_json(outcome)}
        except Exception as exc:
            ok, outcome = False, exc
            reply = {
                "type": MessageType.TOOL_ERROR,
                "id": call["id"],
                "error": {"type": type(exc).__name__, "message": str(exc)},
            }
        except BaseException as exc:  # cancellation: unblock the code, then stop it and re-raise on the caller
            ok, outcome = False, exc
            self._on_fatal(exc)
            reply = {
                "type": MessageType.TOOL_ERROR,
                "id": call["id"],
                "error": {"type": "RuntimeError", "message": "cancelled"},
            }
        finally:
            self._add(-1)
        if observer is not None:
            try:
                observer.on_tool_end(call_id, ok, outcome)
            except Exception:
                logger.exception("sandbox observer failed in on_tool_end")
        with contextlib.suppress(SessionClosed):  # the sandbox died meanwhile; execute reports that
            self._session.send(reply)
