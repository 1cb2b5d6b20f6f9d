"""``FleetKernel``: a Jupyter kernel whose cells are turns of a dspy.RLM session.

A cell is a task for the model (a turn run by ``TurnRunner`` on this kernel's event loop), a block of
``%fleet`` commands, or ``exit``/``quit`` in a console. Rendering lives in ``display.py``, commands in
``commands/`` (a module per group of commands), and the process's settings, store and session in
``context.py``. The fixes for ipykernel 7 that a wrapper kernel needs (interrupts, comms, advertised
features) are applied here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import comm
from ipykernel.kernelbase import Kernel

from fleet_kernel import __version__
from fleet_kernel.cancel import CancelToken
from fleet_kernel.errors import FleetError
from fleet_kernel.kernel import commands, spec
from fleet_kernel.kernel.context import KernelContext, load_off_loop, route_output_to_log
from fleet_kernel.lazy import skip_unused_imports

if TYPE_CHECKING:
    from jupyter_client.session import Session

log = logging.getLogger(__name__)

EXIT_WORDS = frozenset({"exit", "quit", "exit()", "quit()"})
WIDGET_CONTROL_TARGET = "jupyter.widget.control"
SHUTDOWN_GRACE_S = 4.0
TERMINAL_HISTORY_N = 100
HISTORY_OPEN_WAIT_S = 0.25
"""How long a ``history_request`` waits for the store to open. The shell answers one request at a time and
``jupyter console`` gives the history and then each ``is_complete_request`` 1 s: a history that waits for a
slow store makes the console warn and drop the kernel's ``is_complete`` (or read the late history reply as
the ``is_complete`` one)."""


class FleetKernel(Kernel):
    implementation = spec.NAME
    implementation_version = __version__
    banner = (
        f"{spec.DISPLAY_NAME} {__version__}: each cell is a turn; "
        "the model reasons, writes Python and runs it in a sandbox.\n"
        "Type a task, or %fleet help for commands."
    )
    language_info = spec.LANGUAGE_INFO
    help_links = [{"text": "DSPy RLM", "url": "https://dspy.ai/api/modules/RLM/"}]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        skip_unused_imports()
        self.log_path = route_output_to_log()
        self.ctx = KernelContext()
        self._cell_cancel = CancelToken()  # the running cell's: passed on to its turn once that exists
        self._executed = False
        self._warming = False
        self._widgets_registered = False
        self._wire_comms()

    # ------------------------------------------------------------------ ipykernel 7 fixes

    def _wire_comms(self) -> None:
        """Route frontend comm messages (widget state, the Stop button) to the comm manager."""
        self.comm_manager = comm.get_comm_manager()
        for msg_type in ("comm_msg", "comm_close"):
            self.shell_handlers[msg_type] = getattr(self.comm_manager, msg_type)
        self.shell_handlers["comm_open"] = self._comm_open

    def _comm_open(self, stream: Any, ident: Any, msg: dict[str, Any]) -> None:
        log.info("comm_open for %s", msg["content"].get("target_name"))
        if msg["content"].get("target_name") == WIDGET_CONTROL_TARGET:
            self.ctx.widgets_seen = True
            self._widget_target()  # a frontend quicker than the background import still finds it
        self.comm_manager.comm_open(stream, ident, msg)

    async def _register_widget_target(self) -> None:
        """Import ipywidgets (~0.3 s) off the loop once the kernel is up, then register its comm targets."""
        with contextlib.suppress(Exception):  # unavailable: _widget_target says so
            await load_off_loop("ipywidgets")
        self._widget_target()

    def _widget_target(self) -> None:
        if self._widgets_registered:
            return
        self._widgets_registered = True
        try:
            import ipywidgets

            ipywidgets.register_comm_target()
        except Exception:
            log.warning("ipywidgets is unavailable", exc_info=True)

    @property
    def jupyter_session(self) -> Session:
        """The Jupyter session (message signing) the kernel app gives the kernel before its first message."""
        if self.session is None:
            raise RuntimeError("the kernel has no Jupyter session: start it through its app (python -m fleet_kernel)")
        return self.session

    @property
    def kernel_info(self) -> dict[str, Any]:
        info = dict(super().kernel_info)
        # No debugger, and no subshells: one turn at a time, comms on the main shell.
        info["supported_features"] = []
        return info

    async def kernel_info_request(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        """Answer, then (once) start loading the engine: the ready signal never waits for dspy."""
        await super().kernel_info_request(stream, ident, parent)
        self._warm_up()

    def _warm_up(self) -> None:
        if not self._warming:
            self._warming = True
            # the widgets' comm targets wait for the warm-up: ipywidgets (~0.3 s) would compete with a first cell
            self.ctx.warm_up(self._main_loop, then=self._start_widget_target)

    def _start_widget_target(self) -> None:
        self._widgets = self._main_loop.create_task(self._register_widget_target())

    def start(self) -> None:
        super().start()
        self._main_loop = asyncio.get_event_loop()  # turns, the store and widgets live on this loop
        # Clients normally ask kernel_info first; warm up anyway if none does.
        self._main_loop.call_later(1.0, self._warm_up)

    def pre_handler_hook(self) -> None:
        """A SIGINT while a handler runs cancels the turn instead of killing the kernel."""
        self.saved_sigint_handler = signal.signal(signal.SIGINT, lambda _sig, _frame: self._cancel("interrupted"))

    def post_handler_hook(self) -> None:
        signal.signal(signal.SIGINT, self.saved_sigint_handler)

    async def interrupt_request(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        """Message-mode interrupt (control thread): cancel the turn, signal nobody."""
        self._cancel("interrupted")
        self.jupyter_session.send(stream, "interrupt_reply", {"status": "ok"}, parent, ident=ident)

    def _cancel(self, reason: str) -> None:
        """Thread-safe: cancel the running turn, or the one about to start."""
        self._cell_cancel.cancel(reason)

    # ------------------------------------------------------------------ execute

    async def do_execute(
        self,
        code: str,
        silent: bool,
        store_history: bool = True,
        user_expressions: dict[str, Any] | None = None,
        allow_stdin: bool = False,
        *,
        cell_meta: dict[str, Any] | None = None,
        cell_id: str | None = None,
    ) -> dict[str, Any]:
        self._executed = True
        code = commands.substitute(self.ctx.params, code)
        text = code.strip()
        if not text:
            return self._ok()
        if text in EXIT_WORDS:
            return self._ok([{"source": "ask_exit", "keepkernel": False}])
        parent = self.get_parent("shell")
        try:
            if commands.is_command(text):
                return await self._commands(text, parent, silent)
            if silent:
                return self._ok()  # extensions probing the kernel never start a paid turn
            return await self._turn(code, parent, cell_id)
        except Exception as exc:
            return self._fail(parent, *_describe(exc, self.log_path))

    async def _commands(self, text: str, parent: dict[str, Any], silent: bool) -> dict[str, Any]:
        # the renderers: ~0.4 s start-up skips
        from fleet_kernel.kernel.display import ProgressLine, Publisher, show_reply

        lines = [line for line in text.splitlines() if line.strip()]
        if not all(commands.is_command(line) for line in lines):
            return self._fail(parent, "UsageError", "a cell holds either %fleet commands or a task, not both")
        pub = Publisher(self, parent)
        for line in lines:
            text_mode = self.ctx.live_mode() == "text"
            self.ctx.progress = None if silent else ProgressLine(pub, text_mode=text_mode)
            try:
                reply = await commands.run_line(self.ctx, line)
            finally:
                self.ctx.progress = None
            if not silent:
                show_reply(pub, reply, text_mode=self.ctx.live_mode() == "text")
        return self._ok()

    async def _turn(self, task: str, parent: dict[str, Any], cell_id: str | None) -> dict[str, Any]:
        """Run a task as a turn; a cell run again (the frontend's ``cellId``) supersedes its earlier turn."""
        # the renderers and the view: ~0.4 s the kernel's start-up skips
        from fleet_kernel.kernel.display import Publisher, run_and_show

        self._cell_cancel = cancel = CancelToken()
        pub, count = Publisher(self, parent), self.execution_count
        _view, error = await run_and_show(self.ctx, pub, task, cancel, count, skills=self.ctx.skills, cell_id=cell_id)
        if error is None:
            return self._ok()
        return {"status": "error", "execution_count": self.execution_count, **error}

    # ------------------------------------------------------------------ replies

    def _ok(self, payload: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        return {
            "status": "ok",
            "execution_count": self.execution_count,
            "payload": payload or [],
            "user_expressions": {},
        }

    def _fail(self, parent: dict[str, Any], ename: str, evalue: str) -> dict[str, Any]:
        content = {"ename": ename, "evalue": evalue, "traceback": [f"\x1b[0;31m{ename}\x1b[0m: {evalue}"]}
        self.jupyter_session.send(self.iopub_socket, "error", content, parent=parent, ident=self._topic("error"))
        return {"status": "error", "execution_count": self.execution_count, **content}

    # ------------------------------------------------------------------ the other requests

    async def do_complete(self, code: str, cursor_pos: int) -> dict[str, Any]:
        try:
            matches, start, end = await commands.complete(self.ctx, code, cursor_pos)
        except Exception:
            log.warning("completion failed", exc_info=True)
            matches, start, end = [], cursor_pos, cursor_pos
        return {"status": "ok", "matches": matches, "cursor_start": start, "cursor_end": end, "metadata": {}}

    async def do_is_complete(self, code: str) -> dict[str, Any]:
        if code.rstrip(" ").endswith("\\") or code.count("```") % 2 == 1:
            return {"status": "incomplete", "indent": ""}
        return {"status": "complete"}

    async def do_inspect(
        self, code: str, cursor_pos: int, detail_level: int = 0, omit_sections: Any = ()
    ) -> dict[str, Any]:
        if commands.is_command(code):
            reply = await commands.cmd_help(self.ctx, [])
            return {"status": "ok", "found": True, "data": {"text/plain": reply.text}, "metadata": {}}
        return {"status": "ok", "found": False, "data": {}, "metadata": {}}

    async def do_history(
        self,
        hist_access_type: str,
        output: bool,
        raw: bool,
        session: Any = None,
        start: Any = None,
        stop: Any = None,
        n: int | None = None,
        pattern: str | None = None,
        unique: bool = False,
    ) -> dict[str, Any]:
        if not self._executed and hist_access_type == "tail" and (n or 0) >= TERMINAL_HISTORY_N:
            # jupyter console loads 1000 entries of up-arrow history at start; JupyterLab asks for 10.
            log.info("a terminal frontend asked for %s history entries: text output", n)
            self.ctx.console_seen = True
        try:
            runner = await asyncio.wait_for(asyncio.shield(self.ctx.open()), HISTORY_OPEN_WAIT_S)
            from fleet_kernel.kernel.history import history  # SQLAlchemy: loaded by the open store

            entries = await history(
                runner.store,
                self.ctx.session_id,
                hist_access_type,
                n=n,
                pattern=pattern,
                unique=unique,
                session=session,
                start=start,
                stop=stop,
                output=output,
            )
        except TimeoutError:
            log.info("the store is not open yet: a history request gets no entries")
            entries = []
        except Exception:
            log.warning("history failed", exc_info=True)
            entries = []
        return {"status": "ok", "history": entries}

    async def do_shutdown(self, restart: bool) -> dict[str, Any]:
        """On the control thread: cancel the turn and close the store on the main loop (an API sidecar lives on)."""
        log.info("shutting down (restart=%s)", restart)
        self._cancel("the kernel is shutting down")
        closing = asyncio.run_coroutine_threadsafe(self.ctx.close(), self._main_loop)
        try:
            await asyncio.wait_for(asyncio.wrap_future(closing), SHUTDOWN_GRACE_S)
        except Exception:
            log.warning("closing the store failed", exc_info=True)
        log.info("closed the store")
        return {"status": "ok", "restart": restart}


def _describe(exc: Exception, log_path: Path) -> tuple[str, str]:
    """``(ename, evalue)`` for an error raised outside the turn: Fleet errors by name, others logged."""
    if isinstance(exc, FleetError):
        return type(exc).__name__, exc.message
    log.error("unexpected kernel error", exc_info=exc)
    return "InternalError", f"{type(exc).__name__}: {exc} (details in the kernel log, {log_path})"
