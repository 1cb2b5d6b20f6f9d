"""``%%fleet`` and ``%fleet`` in any IPython: turns of a Fleet session next to ordinary Python.

``%load_ext fleet_kernel`` registers both. A ``%%fleet`` cell is a turn (its body the task) run by the
same engine, store and rendering as the ``fleet`` kernel (``kernel.display.run_and_show``), with
notebook variables in (``--in``) and the answer out (``--out``, validated by ``--schema``); ``%fleet``
runs the kernel's commands (``kernel.commands``).

IPython runs a magic on its main thread and blocks its event loop meanwhile, so Fleet keeps its own
loop on a thread of its own (store, runner, live view), and the main thread only waits. The kernel's
interrupt (SIGINT on the main thread) cancels the turn through its ``CancelToken``; the wait goes on
until the turn has ended, so the Python kernel stays as it was. Sandbox processes run in their own
session, so the interrupt the python3 kernel sends to its whole process group never reaches them.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import importlib.util
import shlex
import sys
import threading
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

from fleet_kernel import rich_out
from fleet_kernel.cancel import CancelToken
from fleet_kernel.errors import FleetError
from fleet_kernel.kernel import commands
from fleet_kernel.kernel.context import KernelContext

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

SIGNAL_POLL_S = 0.1  # how soon an interrupt taken by another thread reaches the waiting main thread
USAGE = (
    "%%fleet [--in a,b] [--out NAME] [--schema NAME] [--skills a,b] [--tools f,g] [--model NAME] [--max-iters N] "
    "[--timeout S]"
)
NOTEBOOK_USAGE = "%fleet context off|names|previews, %fleet tools [add f,g | remove f,g]"


class FleetMagicError(Exception):
    """An error shown as one red line (IPython calls ``_render_traceback_``), never as a traceback."""

    def __init__(self, ename: str, evalue: str) -> None:
        super().__init__(evalue)
        self.ename, self.evalue = ename, evalue

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[0;31m{self.ename}\x1b[0m: {self.evalue}"]


def _fail(ename: str, evalue: str) -> FleetMagicError:
    """A ``FleetMagicError`` whose class is named ``ename``: a frontend shows that name (``TurnCancelled``)."""
    error: FleetMagicError = type(ename, (FleetMagicError,), {"__module__": __name__})(ename, evalue)
    return error


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # never exit the kernel
        raise _fail("UsageError", f"{message}\nusage: {USAGE}")


def _parser() -> _Parser:
    p = _Parser(prog="%%fleet", add_help=False)
    p.add_argument("--in", dest="inputs", default="")
    p.add_argument("--out", default=None)
    p.add_argument("--schema", default=None)
    p.add_argument("--skills", default="")
    p.add_argument("--tools", default="")
    p.add_argument("--model", default=None)
    p.add_argument("--max-iters", type=int, default=None)
    p.add_argument("--timeout", type=float, default=None)
    return p


class Engine:
    """Fleet's side of an IPython process: a ``KernelContext`` on an event loop of its own thread."""

    def __init__(self) -> None:
        self.ctx = KernelContext()
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="fleet-engine", daemon=True).start()

    def submit(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def wait(self, future: concurrent.futures.Future[Any], cancel: CancelToken | None = None, calls: Any = None) -> Any:
        """The coroutine's result; an interrupt (Ctrl-C, the kernel's) cancels the turn and waits for its end.

        The wait wakes every ``SIGNAL_POLL_S``: the kernel's SIGINT is sent to the process, the OS may hand
        it to any thread, and Python runs the handler only when the main thread next runs Python code. A
        wait that never woke would see that interrupt only once the turn had ended on its own.
        ``calls`` (``MainThreadCalls``) are run here as they come: the turn's calls into the notebook.
        """
        if calls is not None:
            future.add_done_callback(lambda _: calls.wake())
        while True:
            try:
                while not future.done():
                    if calls is None:
                        concurrent.futures.wait((future,), timeout=SIGNAL_POLL_S)
                    else:
                        calls.wait(SIGNAL_POLL_S)
                        calls.run_pending()
                return future.result()
            except KeyboardInterrupt:
                if cancel is None:
                    future.cancel()
                    raise
                cancel.cancel("interrupted")


@magics_class
class FleetMagics(Magics):
    """``%%fleet`` (a turn) and ``%fleet`` (a command), on one ``Engine`` per IPython process."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.engine = Engine()
        self.engine.ctx.warm_up(self.engine.loop)  # dspy loads in the background while Python cells run
        self.context_mode = "names"  # %fleet context: what a turn is told of the notebook's variables
        self.tool_names: list[str] = []  # %fleet tools add: the user's functions every turn may call

    @line_magic("fleet")  # type: ignore[arg-type]  # IPython types the decorator for its own classes
    def fleet_line(self, line: str) -> None:
        """Run a Fleet command, as in the fleet kernel: ``%fleet help``."""
        # the renderers (~0.4 s) load with the first cell
        from fleet_kernel.kernel.display import ProgressLine, show_reply

        ctx = self.engine.ctx
        pub = _publisher(ctx)
        words = line.split()
        if words and words[0] in ("context", "tools"):  # the notebook's own commands: this magic holds them
            text = self._context(words[1:]) if words[0] == "context" else self._tools(words[1:])
            if words == ["tools"]:  # then the host tools of fleet.toml, as the fleet kernel lists them
                try:
                    host = self.engine.wait(self.engine.submit(commands.run_line(ctx, f"{commands.PREFIX} tools")))
                except Exception as exc:
                    raise _as_error(exc) from None
                text += "\n" + host.text
            show_reply(pub, commands.Reply(text), text_mode=ctx.live_mode() == "text")
            return
        ctx.progress = ProgressLine(pub, text_mode=ctx.live_mode() == "text")
        try:
            reply = self.engine.wait(self.engine.submit(commands.run_line(ctx, f"{commands.PREFIX} {line}")))
        except Exception as exc:
            raise _as_error(exc) from None
        finally:
            ctx.progress = None
        show_reply(pub, reply, text_mode=ctx.live_mode() == "text")
        if words[:1] == ["help"]:
            show_reply(pub, commands.Reply(f"In a Python notebook also: {NOTEBOOK_USAGE}"), text_mode=True)

    @property
    def ipython(self) -> InteractiveShell:
        """The shell the magic was registered in (by ``%load_ext fleet_kernel``)."""
        if self.shell is None:
            raise RuntimeError("%%fleet runs in an IPython shell: load it there with %load_ext fleet_kernel")
        return self.shell

    @cell_magic("fleet")  # type: ignore[arg-type]
    def fleet_cell(self, line: str, cell: str) -> None:
        """Run the cell as a turn of this notebook's Fleet session: ``%%fleet --in df --out result``."""
        try:
            opts = _parser().parse_args(shlex.split(line))
        except ValueError as exc:
            raise _fail("UsageError", f"{exc}\nusage: {USAGE}") from None
        ns = self.ipython.user_ns
        names = [n.strip() for n in opts.inputs.split(",") if n.strip()]
        missing = [n for n in names if n not in ns]
        if missing:
            raise _fail("NameError", f"--in names {', '.join(missing)}, not defined in the notebook")
        model_class, schema = _schema(ns, opts.schema)
        try:
            out_name, rich = rich_out.parse(opts.out)  # --out NAME, or NAME:df|arr|fig|path (rich_out.py)
        except ValueError as exc:
            raise _fail("UsageError", str(exc)) from None
        if rich is not None and schema is not None:
            raise _fail("UsageError", f"--out {opts.out} and --schema cannot go together: {rich_out.WHAT_COMES_BACK}")
        cancel = CancelToken()
        ctx = self.engine.ctx
        pub = _publisher(ctx)
        count = self.ipython.displayhook.prompt_count  # this cell's number (IPython counts on before it runs)
        task = commands.substitute(ctx.params, cell).strip()  # {name} of %fleet set, as in the kernel
        if rich is not None:
            task += rich.ask()
            rich.note_before(_workspace(ctx))
        cell_id = _cell_id()  # a cell run again supersedes its earlier turn, as in the kernel
        bridge = self._bridge(ns, opts.tools, cancel, count, names)
        both = sorted(set(names) & set(bridge.functions))
        if both:
            raise _fail("UsageError", f"{', '.join(both)} cannot be both an --in value and a tool")
        job = _turn(ctx, pub, task, cancel, count, {n: ns[n] for n in names}, opts, schema, cell_id, bridge)
        try:
            view, error, result = self.engine.wait(self.engine.submit(job), cancel, bridge.calls)
        except FleetMagicError:
            raise
        except Exception as exc:
            raise _as_error(exc) from None
        if error is not None:
            raise _fail(error["ename"], error["evalue"])
        if rich is not None:
            ns[rich.name] = self._take(rich, view.answer)
        elif out_name is not None:
            value = view.answer if schema is None else result
            if model_class is not None:
                try:
                    value = model_class.model_validate(result)
                except Exception as exc:  # the JSON Schema held, a validator of the class did not
                    raise _fail(
                        "ValidationError", f"the turn's result is not a valid {model_class.__name__}: {exc}"
                    ) from None
            ns[out_name] = value

    def _take(self, rich: rich_out.RichOut, answer: str) -> Any:
        """The value of ``--out NAME:KIND`` the turn saved, checked (an image is also shown in the cell)."""
        ctx = self.engine.ctx
        workspace = _workspace(ctx)
        if workspace is None:
            raise _fail("RefusedValue", f"no session workspace to take --out {rich.name} from")
        try:
            value = rich.take(workspace, answer, int(ctx.settings.policy.kernel.max_input_mb * 1024 * 1024))
        except rich_out.Refused as exc:
            raise _fail("RefusedValue", str(exc)) from None
        if rich.kind == "fig":
            from IPython.display import Image, display  # only inside a running shell

            display(Image(data=value.info["png_bytes"], format="png"))
        return value

    # ------------------------------------------------------------------ the notebook in a turn

    def _context(self, args: list[str]) -> str:
        from fleet_kernel.kernel.namespace import MODES

        if not args:
            return f"context {self.context_mode}: turns see {_CONTEXT_SAYS[self.context_mode]}"
        if len(args) != 1 or args[0] not in MODES:
            raise _fail("UsageError", f"%fleet context takes one of {', '.join(MODES)}\nusage: {NOTEBOOK_USAGE}")
        self.context_mode = args[0]
        return f"context {self.context_mode}: turns see {_CONTEXT_SAYS[self.context_mode]}"

    def _tools(self, args: list[str]) -> str:
        from fleet_kernel.kernel.notebook_bridge import check_tool

        if args and args[0] in ("add", "remove") and len(args) >= 2:
            names = [n.strip() for a in args[1:] for n in a.split(",") if n.strip()]
            if args[0] == "add":
                ns = self.ipython.user_ns
                for name in names:
                    why = check_tool(name, ns[name]) if name in ns else f"{name} is not defined in the notebook"
                    if why:
                        raise _fail("UsageError", why)
                self.tool_names += [n for n in names if n not in self.tool_names]
            else:
                self.tool_names = [n for n in self.tool_names if n not in names]
        elif args:
            raise _fail("UsageError", f"unknown %fleet tools {' '.join(args)}\nusage: {NOTEBOOK_USAGE}")
        if not self.tool_names:
            return "No notebook functions are tools: %fleet tools add f (or %%fleet --tools f for one turn)."
        return "Notebook functions turns may call: " + ", ".join(self.tool_names)

    def _bridge(self, ns: dict[str, Any], tools: str, cancel: CancelToken, count: int, given: list[str]) -> Any:
        """This turn's ``NotebookBridge``: the catalogue for the prompt (less the ``given`` inputs),
        ``notebook()`` and the user's tools."""
        from fleet_kernel.kernel import namespace
        from fleet_kernel.kernel.notebook_bridge import MainThreadCalls, NotebookBridge, check_tool

        names = [n.strip() for n in tools.split(",") if n.strip()]
        functions: dict[str, Any] = {}
        for name in [*self.tool_names, *names]:
            if name not in ns:
                how = "--tools" if name in names else "%fleet tools add (%fleet tools remove drops it)"
                raise _fail("NameError", f"{how} names {name}, not defined in the notebook")
            why = check_tool(name, ns[name])
            if why:
                raise _fail("UsageError", why)
            functions[name] = ns[name]
        mode = self.context_mode
        variables = namespace.variables(ns, mode, given)
        cells = ""
        if mode != "off":
            last = getattr(self.ipython, "last_execution_result", None)
            error = getattr(last, "error_in_exec", None) or getattr(last, "error_before_exec", None)
            inputs, outputs = ns.get("In"), ns.get("Out")
            if isinstance(inputs, list) and isinstance(outputs, dict):
                cells = namespace.recent_cells(inputs, outputs, error, count)
        settings = self.engine.ctx.settings
        return NotebookBridge(
            ns=ns,
            names=frozenset(namespace.allowed_names(ns)) if mode != "off" else frozenset(),
            functions=functions,
            calls=MainThreadCalls(),
            cancel=cancel,
            timeout_s=settings.limits.exec_timeout_s,
            cap_bytes=settings.policy.kernel.max_input_mb * 1024 * 1024,
            prompt=settings.redactor.text(namespace.prompt(variables, cells, list(functions))),  # configured keys
            fetch=mode != "off",
        )


def _workspace(ctx: KernelContext) -> Any:
    """The host folder of the notebook's session (``/workspace``), or None before its first turn."""
    return ctx.settings.workspaces_dir / ctx.session_id if ctx.session_id else None


_CONTEXT_SAYS = {
    "off": "nothing of the notebook (notebook() fetches nothing; --in still binds values)",
    "names": "the notebook's variables by name, type and size, and its recent cells",
    "previews": "the notebook's variables by name, type, size and a short repr, and its recent cells",
}


async def _turn(
    ctx: KernelContext,
    pub: Any,
    task: str,
    cancel: CancelToken,
    count: int,
    values: dict[str, Any],
    opts: argparse.Namespace,
    schema: dict[str, Any] | None,
    cell_id: str | None,
    bridge: Any = None,
) -> tuple[Any, dict[str, Any] | None, Any]:
    """Encode the inputs, run the turn with the options, return ``(view, error, result)``."""
    from fleet_kernel.kernel.context import load_off_loop  # the renderers (~0.4 s) load with the first cell
    from fleet_kernel.kernel.display import run_and_show  # the renderers (~0.4 s) load with the first cell

    await ctx.open()
    start: dict[str, Any] = {"cell_id": cell_id} if cell_id else {}
    if bridge is not None and (bridge.prompt or bridge.fetch or bridge.functions):
        start["notebook"] = bridge
    if values:
        await load_off_loop("fleet_kernel.engine.inputs")
        start["inputs"] = await asyncio.to_thread(_encode_all, values, ctx.settings.policy.kernel.max_input_mb)
    limits = {k: v for k, v in (("max_iters", opts.max_iters), ("turn_timeout_s", opts.timeout)) if v is not None}
    if limits:
        start["limits"] = limits
    skills = [s.strip() for s in opts.skills.split(",") if s.strip()] or list(ctx.skills)  # else %fleet skill use
    if skills:
        start["skills"] = skills
    if schema is not None:
        start["output_schema"] = schema
    previous = ctx.settings
    if opts.model:
        ctx.choose_model(opts.model)
    try:
        view, error = await run_and_show(ctx, pub, task, cancel, count, report_error=False, stop_button=False, **start)
    finally:
        if opts.model:
            ctx.update_settings(lm_model=previous.lm_model, configured_models=previous.configured_models)
    result = None
    if error is None and schema is not None:
        result = getattr(await (await ctx.sessions()).turn(view.session_id or None, view.turn_id), "result", None)
    return view, error, result


def _encode_all(values: dict[str, Any], cap_mb: float) -> list[Any]:
    from fleet_kernel.lazy import import_module

    import_module("fleet_kernel.engine.inputs")  # dspy: taking turns with the background warm-up
    from fleet_kernel.engine.inputs import encode  # the engine loads with the first cell that passes values

    encoded = [encode(name, value) for name, value in values.items()]
    total = sum(v.size for v in encoded)
    if total > cap_mb * 1024 * 1024:
        raise _fail(
            "InputTooLarge",
            f"the --in values come to {total / 1048576:,.1f} MB as sent; the limit is {cap_mb:g} MB "
            "([kernel] max_input_mb in fleet.toml): pass a smaller value, or write it to a file and %fleet attach it",
        )
    return encoded


def _schema(ns: dict[str, Any], name: str | None) -> tuple[Any, dict[str, Any] | None]:
    """``(model class or None, JSON Schema)`` for ``--schema NAME``: a dict or a pydantic model class."""
    if name is None:
        return None, None
    if name not in ns:
        raise _fail("NameError", f"--schema names {name}, not defined in the notebook")
    value = ns[name]
    if isinstance(value, dict):
        return None, value
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and isinstance(value, type) and issubclass(value, pydantic.BaseModel):
        schema: dict[str, Any] = value.model_json_schema()  # type: ignore[attr-defined]
        return value, schema
    raise _fail("UsageError", f"--schema {name} must be a JSON Schema dict or a pydantic model class")


def _publisher(ctx: KernelContext) -> Any:
    """The kernel's IOPub (live displays, with this cell as parent), or text on stdout without a kernel."""
    from IPython import get_ipython  # only inside a running shell

    kernel = getattr(get_ipython(), "kernel", None)
    if kernel is None:
        ctx.explicit_output = ctx.explicit_output or "text"
        return PrintPublisher()
    from fleet_kernel.kernel.display import Publisher  # the renderers (~0.4 s) load with the first cell

    parent = kernel.get_parent("shell")
    if _widget_frontend(parent):
        ctx.widgets_seen = True
    return Publisher(kernel, parent)


def _cell_id() -> str | None:
    """The running cell's id (``metadata.cellId`` of its ``execute_request``), if a kernel and its frontend give one."""
    from IPython import get_ipython  # only inside a running shell

    kernel = getattr(get_ipython(), "kernel", None)
    if kernel is None:
        return None
    cell_id = (kernel.get_parent("shell").get("metadata") or {}).get("cellId")
    return cell_id if isinstance(cell_id, str) and cell_id else None


def _widget_frontend(parent: dict[str, Any]) -> bool:
    """The cell came from a frontend that renders widgets: a widget manager holds its control comm open,
    or JupyterLab's notebook sent it (its execute requests carry ``deletedCells``; nbclient's do not)."""
    if "deletedCells" in (parent.get("metadata") or {}):
        return importlib.util.find_spec("ipywidgets") is not None
    try:
        import comm  # only in a kernel with a frontend

        manager = comm.get_comm_manager()
        return any(getattr(c, "target_name", "") == "jupyter.widget.control" for c in manager.comms.values())
    except Exception:
        return False


class PrintPublisher:
    """``Publisher``'s interface for a terminal IPython: streams and text parts printed as they come."""

    def send(self, msg_type: str, content: dict[str, Any]) -> None:
        if msg_type == "stream":
            print(content["text"], end="", file=sys.stderr if content["name"] == "stderr" else sys.stdout, flush=True)
        elif msg_type in ("display_data", "execute_result"):
            print(content["data"].get("text/plain", ""), flush=True)

    def stream(self, name: str, text: str) -> None:
        self.send("stream", {"name": name, "text": text})

    def display(self, data: dict[str, Any], metadata: dict[str, Any] | None = None, **_: Any) -> None:  # noqa: ARG002 - IPython's display signature
        self.send("display_data", {"data": data})

    def clear(self) -> None:
        pass


def _as_error(exc: BaseException) -> FleetMagicError:

    if isinstance(exc, FleetError):
        return _fail(type(exc).__name__, exc.message)
    return _fail(type(exc).__name__, str(exc))


def load(ipython: Any) -> None:
    ipython.register_magics(FleetMagics)
