"""Fleet's in-sandbox runtime: the one module that runs model-written Python in every backend.

Stdlib only, and it must not assume it runs as ``__main__``: the ``local`` backend runs it as a
script under bubblewrap (``main_stdio``), other backends host ``serve(send, receive)`` over their
own channel. The host speaks JSON-able dicts; see ``serve`` for the messages.

Semantics: one persistent namespace; host tools are global stubs that block for the host's reply;
``SUBMIT`` raises a ``BaseException`` so ``except Exception`` in model code cannot swallow it; the
value of a trailing expression is shown after the printed output; printed output (Python level and,
with ``capture_fds``, file-descriptor level) is coalesced into ``out`` messages at most ~20/s and
capped per execution; an ``interrupt`` becomes ``KeyboardInterrupt`` on the thread running the code.
"""

from __future__ import annotations

import ast
import binascii
import builtins
import codecs
import enum
import io
import itertools
import json
import linecache
import os
import queue
import select
import selectors
import signal
import sys
import threading
import time
import traceback
import types
from collections.abc import Callable
from typing import Any, Literal, TypedDict

Message = dict[str, Any]
FLUSH_INTERVAL_S = 0.05  # at most ~20 out messages per second while output trickles
BUFFER_CAP = 8 * 1024  # flush early when this much is pending
MAX_CHUNK = 256 * 1024  # no single out message carries more text than this
FLUSH_GAP_S = 0.005  # explicit flushes closer than this are coalesced (logging flushes every record)
CATCH_UP_GAP_S = 50e-6  # prints check the fd pipes at most this often (a child process takes longer to start)


class MessageType(str, enum.Enum):  # noqa: UP042 - not StrEnum: a Daytona image's Python may predate 3.11
    """The ``type`` of every message between the host and the runtime, defined once for both sides.

    ``serve`` says what each carries. A member is its string: it compares equal to it and is written
    as it in JSON (the Pyodide runner's JavaScript spells the same strings).
    """

    # host to sandbox
    EXECUTE = "execute"
    TOOL_RESULT = "tool_result"
    TOOL_ERROR = "tool_error"
    INTERRUPT = "interrupt"
    SHUTDOWN = "shutdown"
    # sandbox to host
    READY = "ready"
    OUT = "out"
    TOOL_CALL = "tool_call"
    DONE = "done"
    # sandbox to host, from the Pyodide runner (its workspace lives in the runner's memory)
    WORKSPACE_FILE = "workspace_file"
    WORKSPACE_DELETE = "workspace_delete"

    def __str__(self) -> str:
        return self.value


class DoneKind(str, enum.Enum):  # noqa: UP042 - as MessageType
    """How an execution ended: the ``kind`` of its ``done`` message."""

    RESULT = "result"  # ran to the end; ``value`` is the repr of a trailing expression, if any
    FINAL = "final"  # the code called SUBMIT; ``value`` is what it submitted
    SYNTAX = "syntax"  # the code did not parse
    ERROR = "error"  # the code raised
    INTERRUPTED = "interrupted"  # an interrupt (a Stop, a timeout) ended it

    def __str__(self) -> str:
        return self.value


TOOL_REPLIES = (MessageType.TOOL_RESULT, MessageType.TOOL_ERROR)


class ErrorInfo(TypedDict):
    """An exception as the protocol carries it: its class name and message."""

    type: str
    message: str


class Execute(TypedDict):
    """Host to sandbox: bind ``variables`` (the changed ones), then run ``code`` with ``tools`` as host tools."""

    type: Literal[MessageType.EXECUTE]
    id: int
    code: str
    tools: list[str]
    output_fields: list[dict[str, Any]] | None
    variables: dict[str, Any]


class ToolResult(TypedDict):
    """Host to sandbox: the value of the tool call ``id``."""

    type: Literal[MessageType.TOOL_RESULT]
    id: Any
    value: Any


class ToolError(TypedDict):
    """Host to sandbox: the tool call ``id`` raised ``error`` (raised again in the sandbox as that type)."""

    type: Literal[MessageType.TOOL_ERROR]
    id: Any
    error: ErrorInfo


class Interrupt(TypedDict):
    """Host to sandbox: stop the execution ``id`` (``None``: whatever runs) with a ``KeyboardInterrupt``."""

    type: Literal[MessageType.INTERRUPT]
    id: Any


HostMessage = Execute | ToolResult | ToolError | Interrupt
"""What the host sends; the sandbox answers with ``ready``, ``out``, ``tool_call`` and ``done`` (see ``serve``)."""


def _spawn(target: Callable[[], None], name: str) -> None:
    """Start a runtime thread with a small stack: reserved address space counts against RLIMIT_AS."""
    previous = threading.stack_size(512 * 1024)
    try:
        threading.Thread(target=target, name=name, daemon=True).start()
    finally:
        threading.stack_size(previous)


class Submission(BaseException):
    """Raised by ``SUBMIT``; a ``BaseException`` so model code's ``except Exception`` lets it through."""

    def __init__(self, value: dict[str, Any]) -> None:
        super().__init__("SUBMIT")
        self.value = value


def _json_default(obj: Any) -> Any:
    """Best effort for values that are not JSON: numpy scalars/arrays, sets, bytes, else repr."""
    for attr in ("tolist", "item"):
        if callable(getattr(obj, attr, None)):
            return getattr(obj, attr)()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if isinstance(obj, (bytes, bytearray)):
        try:
            return obj.decode("utf-8")
        except UnicodeDecodeError:  # binary (an image for llm_query): a data: URL, not mangled text
            return "data:application/octet-stream;base64," + binascii.b2a_base64(obj, newline=False).decode("ascii")
    return repr(obj)


IMAGE_ARGS = {"look": "path", "llm_query": "images"}
"""Tool arguments naming image files: read here, since the host sees /workspace only after the turn."""
MAX_IMAGE_READ = 5 * 1024 * 1024 + 1  # the host refuses an image larger than 5 MB (``engine.images``)


def _images_read_here(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """``look(path)`` and ``llm_query(images=[...])`` with each path of a file that exists replaced by its bytes."""

    def read(item: Any) -> Any:
        if isinstance(item, (str, os.PathLike)) and not str(item).startswith("data:") and os.path.isfile(item):
            with open(item, "rb") as handle:
                data = binascii.b2a_base64(handle.read(MAX_IMAGE_READ), newline=False).decode("ascii")
            named = "" if any(c in str(item) for c in ";,") else f";name={item}"  # the tool event shows the path
            return f"data:application/octet-stream{named};base64,{data}"
        return item

    key = IMAGE_ARGS[name]
    if key == "path":
        if args:
            return (read(args[0]), *args[1:]), kwargs
        return args, {**kwargs, key: read(kwargs[key])} if key in kwargs else kwargs
    if isinstance(kwargs.get(key), (list, tuple)):
        return args, {**kwargs, key: [read(item) for item in kwargs[key]]}
    return args, kwargs


def jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=_json_default))


VALUE_TAG = "__fleet_value__"  # a tool argument or result that is a value by type: {VALUE_TAG: type, "payload": text}


def _tool_default(obj: Any) -> Any:
    """A DataFrame or Series argument of a host tool travels as a table (pandas' split JSON), not its repr."""
    if callable(getattr(obj, "to_json", None)) and hasattr(obj, "index"):
        frame = obj.to_frame() if not hasattr(obj, "columns") else obj
        return {VALUE_TAG: "DataFrame", "payload": frame.to_json(orient="split", date_format="iso")}
    return _json_default(obj)


def _tool_value(value: Any) -> Any:
    """A host tool's result as the code should see it: a tagged value (a notebook's DataFrame or bytes,
    encoded as ``--in`` values are) rebuilt, anything else as it came. Never unpickled."""
    if not (
        isinstance(value, dict) and isinstance(value.get(VALUE_TAG), str) and isinstance(value.get("payload"), str)
    ):
        return value
    kind, payload = value[VALUE_TAG], value["payload"]
    if kind == "str":
        return payload
    if kind == "bytes":
        import base64

        return base64.b64decode(payload)
    if kind == "DataFrame":
        try:
            import pandas as pd  # type: ignore[import-untyped]

            return pd.read_json(io.StringIO(payload), orient="split")
        except ImportError:
            return json.loads(payload)
    return json.loads(payload)


class Output:
    """Coalesces stdout/stderr text into ``out`` messages and keeps this execution's capped copy."""

    def __init__(
        self, send: Callable[[Message], None], limit: int, flusher: bool, sent: Callable[[], None] | None = None
    ) -> None:
        self._send, self._limit = send, limit
        self._sent = sent  # waits until what was sent is written (the sender is a thread)
        self._lock = threading.Lock()
        self._pending: list[tuple[str, str]] = []
        self._pending_size = 0
        self._captured: list[str] = []
        self._total = 0
        self._truncated = False
        self._last_flush = time.monotonic()
        self._last_explicit = 0.0
        self._soon = False  # an explicit flush is waiting for the flusher
        self._wake = threading.Event()
        self._flush_on_write = not flusher  # without a flusher thread, writes flush when it is time
        if flusher:
            _spawn(self._flush_loop, "fleet-output")

    def begin(self) -> None:
        with self._lock:
            self._captured, self._total, self._truncated = [], 0, False

    def write(self, stream: str, text: str) -> None:
        if not text:
            return
        with self._lock:
            if self._total >= self._limit:
                if self._truncated:
                    return
                self._truncated = True
                text = f"\n[output truncated: more than {self._limit} characters]\n"
            elif self._total + len(text) > self._limit:
                text = text[: self._limit - self._total]
            self._total += len(text)
            self._captured.append(text)
            if self._pending and self._pending[-1][0] == stream:
                self._pending[-1] = (stream, self._pending[-1][1] + text)
            else:
                self._pending.append((stream, text))
            self._pending_size += len(text)
            due = self._flush_on_write and time.monotonic() - self._last_flush >= FLUSH_INTERVAL_S
            if self._pending_size >= BUFFER_CAP or due:
                self._flush_locked()
            else:
                self._wake.set()

    def flush(self, *, blocking: bool = True) -> None:
        """Send what is pending; ``blocking=False`` (a signal handler) skips it while a write holds the lock."""
        if not self._lock.acquire(blocking=blocking):
            return
        try:
            self._flush_locked()
        finally:
            self._lock.release()

    def flush_now(self) -> None:
        """An explicit flush: what is pending is written to the host before this returns.

        So ``print(..., flush=True)`` right before the process dies (a segfault, ``os._exit``) is not lost.
        Flushes less than ``FLUSH_GAP_S`` after the last one are left to the flusher (which sends them within
        that gap), so code that flushes every line still makes a few hundred messages a second, not one a line.
        """
        now = time.monotonic()
        if now - self._last_explicit < FLUSH_GAP_S:
            self._soon = True
            self._wake.set()
            return
        self._last_explicit = now
        self.flush()
        if self._sent is not None:
            self._sent()

    def end(self) -> tuple[str, list[tuple[str, str]]]:
        """Everything this execution printed (capped), and what is not sent yet: it goes with ``done``,
        which saves the host a message (most steps print once and end)."""
        with self._lock:
            pending, self._pending, self._pending_size = self._pending, [], 0
            self._last_flush = time.monotonic()
            return "".join(self._captured), pending

    def _flush_locked(self) -> None:
        if not self._pending:  # an idle tick must not delay the next write's immediate flush
            return
        pending, self._pending, self._pending_size = self._pending, [], 0
        self._last_flush = time.monotonic()
        for stream, text in pending:
            for start in range(0, len(text), MAX_CHUNK):
                self._send({"type": MessageType.OUT, "stream": stream, "text": text[start : start + MAX_CHUNK]})

    def _flush_loop(self) -> None:
        while True:
            self._wake.wait()
            time.sleep(FLUSH_GAP_S if self._soon else FLUSH_INTERVAL_S)
            self._wake.clear()
            self._soon = False
            self.flush()


class Stream(io.TextIOBase):
    """``sys.stdout``/``sys.stderr`` replacement feeding ``Output``; ``fileno`` is the captured fd.

    ``catch_up`` reads what is already in the fd pipes first, so text a child process wrote before this
    ``print`` (``os.system('echo a'); print('b')``) comes out before it, as it would on a terminal.
    """

    def __init__(self, output: Output, name: str, fd: int | None, catch_up: Callable[[], None] | None = None) -> None:
        self._output, self._name, self._fd, self._catch_up = output, name, fd, catch_up

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    @property
    def buffer(self) -> io.BufferedIOBase:
        return _BinaryStream(self)

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        if self._fd is None:
            raise io.UnsupportedOperation("fileno")
        return self._fd

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if self._catch_up is not None:
            self._catch_up()
        self._output.write(self._name, text)
        return len(text)

    def flush(self) -> None:
        self._output.flush_now()


class _BinaryStream(io.BufferedIOBase):
    def __init__(self, text: Stream) -> None:
        self._text = text

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._text.write(bytes(data).decode("utf-8", "replace"))
        return len(data)


class FdCapture:
    """Points fds 1 and 2 at pipes so ``os.system``, subprocesses and C code are captured too."""

    def __init__(self, output: Output) -> None:
        self._output = output
        self._lock = threading.Lock()
        self._selector = selectors.DefaultSelector()
        self._ready = select.poll()  # a cheaper check than the selector's, for ``catch_up``
        self._checked = 0.0
        for fd, stream in ((1, "stdout"), (2, "stderr")):
            read_end, write_end = os.pipe()
            os.dup2(write_end, fd)
            os.close(write_end)
            os.set_blocking(read_end, False)
            decoder = codecs.getincrementaldecoder("utf-8")("replace")
            self._selector.register(read_end, selectors.EVENT_READ, (stream, decoder))
            self._ready.register(read_end, select.POLLIN)
        _spawn(self._read_loop, "fleet-fd-capture")

    def _read_loop(self) -> None:
        while True:
            for key, _ in self._selector.select():
                self._read(key)

    def _read(self, key: selectors.SelectorKey) -> bool:
        with self._lock:
            try:
                data = os.read(key.fd, 65536)
            except BlockingIOError:
                return False
            stream, decoder = key.data
            self._output.write(stream, decoder.decode(data))
            return bool(data)

    def drain(self) -> None:
        """Read what is already in the pipes, so output precedes the ``done`` message."""
        for key in self._selector.get_map().values():
            while self._read(key):
                pass

    def catch_up(self) -> None:
        """``drain`` if a pipe holds data, checked at most every ``CATCH_UP_GAP_S``.

        A child process takes far longer than the gap to start, write and exit, so the ``print`` after
        ``os.system`` always checks; a loop of prints checks once per gap instead of twice per line.
        The reader thread may have taken the child's text from the pipe and not written it yet: taking
        the lock first waits for that write, so the pipe looks empty only when its text is out.
        """
        now = time.monotonic()
        if now - self._checked < CATCH_UP_GAP_S:
            return
        self._checked = now
        with self._lock:
            pass
        if self._ready.poll(0):
            self.drain()


class _QueuedSender:
    """Sends from one thread, so a ``KeyboardInterrupt`` in the code's thread never cuts a message."""

    def __init__(self, send: Callable[[Message], None]) -> None:
        self._queue: queue.SimpleQueue[Message | threading.Event] = queue.SimpleQueue()
        self._send = send
        _spawn(self._loop, "fleet-send")

    def __call__(self, message: Message) -> None:
        self._queue.put(message)

    def wait(self) -> None:
        """Return once everything queued before this call is written."""
        written = threading.Event()
        self._queue.put(written)
        written.wait()

    def _loop(self) -> None:
        while True:
            message = self._queue.get()
            if isinstance(message, threading.Event):
                message.set()
            else:
                self._send(message)


class Runtime:
    """The persistent namespace and one execution at a time; driven by ``serve``."""

    def __init__(
        self,
        send: Callable[[Message], None],
        receive: Callable[[], Message] | None,
        *,
        max_output_bytes: int,
        threaded: bool,
        capture_fds: bool,
        reap: bool,
    ) -> None:
        sender = _QueuedSender(send) if threaded else None
        self._send = sender or send
        self._receive = receive  # only for waiting on tool replies when there are no threads
        self.output = Output(self._send, max_output_bytes, flusher=threaded, sent=sender.wait if sender else None)
        self._capture = FdCapture(self.output) if capture_fds else None
        out_fd, err_fd = (1, 2) if capture_fds else (None, None)
        catch_up = self._capture.catch_up if self._capture is not None else None
        self.streams = (
            Stream(self.output, "stdout", out_fd, catch_up),
            Stream(self.output, "stderr", err_fd, catch_up),
        )
        sys.stdout, sys.stderr = self.streams
        self.module = types.ModuleType("__main__")
        self.module.__dict__["__builtins__"] = builtins
        sys.modules["__main__"] = self.module
        self._tools: set[str] = set()
        self._provided: dict[str, Any] = {}  # name -> what the sandbox bound to it (tools, SUBMIT)
        self._output_fields: list[dict[str, Any]] | None = None
        self._injected: dict[str, Any] = {}
        self._pending: dict[int, queue.SimpleQueue[Message | None]] = {}
        self._ids = itertools.count(1)
        self._cells = itertools.count(1)
        self._pid = os.getpid()
        self._reap = reap
        self.running: Any = None  # id of the execution in progress
        self.interruptible = False  # read by the SIGINT handler, on the code's thread
        if capture_fds:
            os.register_at_fork(after_in_child=_print_to_fds)

    # -- tools and SUBMIT -------------------------------------------------------------------------

    def configure(self, tools: list[str], output_fields: list[dict[str, Any]] | None) -> None:
        namespace = self.module.__dict__
        for name in self._tools - set(tools):
            if getattr(namespace.get(name), "_fleet_tool", False):
                del namespace[name]
        for name in tools:
            namespace[name] = self._stub(name)
        self._tools = set(tools)
        self._output_fields = output_fields
        namespace["SUBMIT"] = self.submit
        self._provided = {name: namespace[name] for name in [*sorted(self._tools), "SUBMIT"]}

    def restore_provided(self) -> list[str]:
        """Put back every name the sandbox gives the model (``llm_query``, ``SUBMIT``, the tools) that code
        rebound or deleted, and say so on stderr: a model that defines its own ``llm_query`` would otherwise
        go on calling its stub, and no sub-model call would ever be made. Returns the names restored."""
        namespace = self.module.__dict__
        restored = [name for name, value in self._provided.items() if namespace.get(name) is not value]
        for name in restored:
            namespace[name] = self._provided[name]
        if restored:
            one = len(restored) == 1
            subject = f"{restored[0]} is" if one else f"{', '.join(restored)} are"
            advice = (
                f"Call {restored[0]}(...) as given; never define or assign it"
                if one
                else ("Call them as given; never define or assign them")
            )
            self.output.write(
                "stderr",
                f"\n[fleet] {subject} provided by the sandbox; this code redefined "
                f"{'it' if one else 'them'}, so the original{'' if one else 's'} {'was' if one else 'were'} "
                f"restored. {advice}.\n",
            )
        return restored

    def _stub(self, name: str) -> Callable[..., Any]:
        def tool(*args: Any, **kwargs: Any) -> Any:
            if name in IMAGE_ARGS:
                args, kwargs = _images_read_here(name, args, kwargs)
            return self.call_tool(name, args, kwargs)

        tool.__name__ = tool.__qualname__ = name
        tool._fleet_tool = True  # type: ignore[attr-defined]
        return tool

    def call_tool(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        call_id = next(self._ids)
        request = {
            "type": MessageType.TOOL_CALL,
            "id": call_id,
            "name": name,
            "args": json.loads(json.dumps(list(args), default=_tool_default)),
            "kwargs": json.loads(json.dumps(kwargs, default=_tool_default)),
        }
        if self._receive is not None:
            reply: Message | None = self._wait_inline(self._receive, request)
        else:
            waiter: queue.SimpleQueue[Message | None] = queue.SimpleQueue()
            self._pending[call_id] = waiter
            try:
                self._send(request)
                reply = waiter.get()
            finally:
                self._pending.pop(call_id, None)
        if reply is None:
            raise EOFError("the host went away during a tool call")
        if reply["type"] == MessageType.TOOL_ERROR:
            raise _tool_exception(reply.get("error") or {})
        return _tool_value(reply.get("value"))

    def _wait_inline(self, receive: Callable[[], Message], request: Message) -> Message:
        self._send(request)
        while True:
            message = receive()
            if message.get("type") == MessageType.INTERRUPT:
                raise KeyboardInterrupt
            if message.get("type") in TOOL_REPLIES and message.get("id") == request["id"]:
                return message

    def deliver(self, message: Message | None) -> None:
        """Route a tool reply from the reader thread to the call waiting for it (stale ones are dropped)."""
        if message is None:
            for waiter in list(self._pending.values()):
                waiter.put(None)
            return
        pending = self._pending.get(message.get("id"))  # type: ignore[arg-type]
        if pending is not None:
            pending.put(message)

    def submit(self, *args: Any, **kwargs: Any) -> None:
        fields = [f["name"] for f in self._output_fields or []]
        if args and kwargs:
            raise TypeError("SUBMIT takes either positional or keyword values, not both")
        if not fields:
            if len(args) == 1:
                raise Submission({"output": jsonable(args[0])})
            if not kwargs:
                raise TypeError("SUBMIT takes exactly one value")
            raise Submission(jsonable(kwargs))
        if len(args) > len(fields):
            raise TypeError(f"SUBMIT takes {len(fields)} value(s): SUBMIT({', '.join(fields)})")
        values = dict(zip(fields, args, strict=False)) if args else dict(kwargs)
        missing, unknown = [f for f in fields if f not in values], [k for k in values if k not in fields]
        if missing or unknown:
            detail = f"missing {missing}" if missing else f"unknown {unknown}"
            raise TypeError(f"SUBMIT fields do not match ({detail}); expected SUBMIT({', '.join(fields)})")
        raise Submission(jsonable(values))

    # -- execution --------------------------------------------------------------------------------

    def execute(self, request: Message) -> Message:
        """Run one cell and return its ``done`` message (also sent to the host)."""
        if "tools" in request or "output_fields" in request:
            self.configure(request.get("tools", sorted(self._tools)), request.get("output_fields"))
        sys.stdout, sys.stderr = self.streams  # in case earlier code replaced them and never put them back
        namespace = self.module.__dict__
        for name, value in self._injected.items():
            if namespace.get(name) is not value:  # model code rebound an input: restore it, as dspy does
                namespace[name] = value
        variables = request.get("variables") or {}
        namespace.update(variables)
        self._injected.update(variables)
        self.output.begin()
        try:
            done = self._run(str(request.get("code", "")))
        finally:
            if os.getpid() != self._pid:  # a fork of this process finished the cell: never reply twice
                os._exit(0)
        self.restore_provided()
        if done["kind"] in (DoneKind.ERROR, DoneKind.INTERRUPTED) and self._reap:
            _reap_strays()
        if self._capture is not None:
            self._capture.drain()
        output, tail = self.output.end()
        done.update(type=MessageType.DONE, id=request.get("id"), output=output)
        if tail:
            done["tail"] = [[stream, text] for stream, text in tail]
        self._send(done)
        return done

    def _run(self, code: str) -> Message:
        filename = f"<cell {next(self._cells)}>"
        try:
            tree = ast.parse(code, filename, "exec")
        except SyntaxError as exc:
            text = "".join(traceback.format_exception_only(type(exc), exc))
            return {"kind": DoneKind.SYNTAX, "value": None, "error": _error(exc, text)}
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        if last is not None:
            tree.body.pop()
        namespace = self.module.__dict__
        try:
            self.interruptible = True
            try:
                exec(compile(tree, filename, "exec"), namespace)
                value = eval(compile(ast.Expression(last.value), filename, "eval"), namespace) if last else None
            finally:
                self.interruptible = False
        except Submission as submission:
            return {"kind": DoneKind.FINAL, "value": submission.value, "error": None}
        except KeyboardInterrupt as exc:
            return {"kind": DoneKind.INTERRUPTED, "value": None, "error": _error(exc, _format(exc))}
        except BaseException as exc:  # SystemExit too: exit() must not end the REPL
            return {"kind": DoneKind.ERROR, "value": None, "error": _error(exc, _format(exc))}
        return {"kind": DoneKind.RESULT, "value": None if value is None else _repr(value), "error": None}


def _repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception as exc:  # a broken __repr__ is the model's bug, not ours
        return f"<unprintable {type(value).__name__}: {exc!r}>"


def _print_to_fds() -> None:
    """In a forked child (no runtime threads there): print straight to the captured fds."""
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115


def _tool_exception(error: dict[str, Any]) -> Exception:
    """Rebuild a host tool's exception: the builtin type when there is one, else RuntimeError."""
    name, message = str(error.get("type") or "Error"), str(error.get("message") or "")
    cls = getattr(builtins, name, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(message)
        except Exception:  # noqa: S110 - a type that takes other arguments: the RuntimeError below
            pass
    return RuntimeError(f"{name}: {message}")


def _error(exc: BaseException, text: str) -> dict[str, str]:
    return {"type": type(exc).__name__, "message": str(exc), "traceback": text}


_THIS_FILE = _repr.__code__.co_filename


def _format(exc: BaseException) -> str:
    """The traceback without this module's frames, so the model sees only its own code."""
    te = traceback.TracebackException.from_exception(exc)
    seen: set[int] = set()
    stack: list[traceback.TracebackException | None] = [te]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        node.stack = traceback.StackSummary.from_list([f for f in node.stack if f.filename != _THIS_FILE])
        stack += [node.__cause__, node.__context__]
    return "".join(te.format())


def _reap_strays() -> None:
    """Kill every other process in this pid namespace (stray children, fork bombs) and reap our zombies."""
    if os.getppid() != 1:  # only as the direct child of the namespace's init, never on a shared host
        return
    for _ in range(100):
        try:
            os.kill(-1, signal.SIGKILL)  # everyone but init and ourselves
        except OSError:
            return  # nobody left
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        time.sleep(0.005)


def serve(
    send: Callable[[Message], None],
    receive: Callable[[], Message],
    *,
    max_output_bytes: int = 1_000_000,
    threaded: bool = True,
    capture_fds: bool = False,
    reap: bool = False,
    flush_signal: int | None = None,
) -> None:
    """Answer the host until it sends ``shutdown`` or ``receive`` raises ``EOFError``.

    Host to sandbox: ``execute{id, code, variables, tools?, output_fields?}``, ``tool_result{id, value}``,
    ``tool_error{id, error: {type, message}}``, ``interrupt``, ``shutdown``. Sandbox to host: ``ready``,
    ``out{stream, text}``, ``tool_call{id, name, args, kwargs}``, ``done{id, kind, value, output, error, tail?}``
    with ``kind`` one of result, final, syntax, error, interrupted; ``tail`` is output not yet sent as
    ``out`` (``[[stream, text], ...]``), for the host to show as it shows ``out``.

    ``threaded`` needs the main thread (SIGINT lands there); without threads (Pyodide) tool replies are
    read inline and the host interrupts by its own means. ``reap`` is only safe in a private pid namespace.
    ``flush_signal`` (no threads, so no flusher): the host raises this signal while code runs, and each
    one sends the output buffered so far (Pyodide raises it through its interrupt buffer).
    """
    runtime = Runtime(
        send,
        None if threaded else receive,
        max_output_bytes=max_output_bytes,
        threaded=threaded,
        capture_fds=capture_fds,
        reap=reap,
    )
    requests: queue.SimpleQueue[Message | None] = queue.SimpleQueue()

    def on_sigint(_signum: int, _frame: Any) -> None:
        if runtime.interruptible:  # a late interrupt must never break the runtime's own code
            raise KeyboardInterrupt

    if threaded or flush_signal is not None:
        signal.signal(signal.SIGINT, on_sigint)
    if flush_signal is not None:
        signal.signal(flush_signal, lambda _signum, _frame: runtime.output.flush(blocking=False))
    if threaded:
        _spawn(lambda: _read_loop(receive, runtime, requests), "fleet-receive")
    runtime._send({"type": MessageType.READY, "pid": os.getpid(), "python": sys.version.split()[0]})
    while True:
        try:
            message = requests.get() if threaded else receive()
        except EOFError:
            return
        if message is None or message.get("type") == MessageType.SHUTDOWN:
            return
        if message.get("type") == MessageType.EXECUTE:
            runtime.running = message.get("id")
            try:
                runtime.execute(message)
            finally:
                runtime.running = None


def _read_loop(receive: Callable[[], Message], runtime: Runtime, requests: queue.SimpleQueue[Message | None]) -> None:
    """The reader thread of a threaded ``serve``: tool replies to the calls waiting for them, interrupts to the
    main thread (where the code runs), anything else to the main loop; ``None`` to both when the channel ends."""
    main = threading.main_thread()
    try:
        while True:
            message = receive()
            kind = message.get("type")
            if kind in TOOL_REPLIES:
                runtime.deliver(message)
            elif kind == MessageType.INTERRUPT:
                if runtime.running is not None and message.get("id") in (None, runtime.running):
                    signal.pthread_kill(main.ident or 0, signal.SIGINT)
            else:
                requests.put(message)
    except (EOFError, OSError, ValueError):
        pass
    runtime.deliver(None)
    requests.put(None)


def main_stdio(argv: list[str] | None = None) -> None:
    """Entry point for process backends: protocol on private copies of stdin/stdout, JSON lines."""
    import faulthandler
    import resource

    args = iter(argv if argv is not None else sys.argv[1:])
    options = dict(zip(args, args, strict=False))
    protocol_in = os.fdopen(os.dup(0), "rb", buffering=1 << 20)  # big variables arrive as one line
    protocol_out = os.fdopen(os.dup(1), "wb", buffering=1 << 16)
    crash_log = os.fdopen(os.dup(2), "w")  # the host reads fatal errors (segfaults) here
    faulthandler.enable(crash_log)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # input() sees EOF instead of eating protocol bytes
    os.close(null)
    if "--nproc" in options:
        limit = int(options["--nproc"])
        resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit))

    def send(message: Message) -> None:
        protocol_out.write(json.dumps(message, default=_json_default).encode() + b"\n")
        protocol_out.flush()

    def receive() -> Message:
        line = protocol_in.readline()
        if not line:  # the host closed the channel or died: nobody is left to answer, even mid-execution
            os._exit(0)
        message: Message = json.loads(line)
        return message

    serve(
        send,
        receive,
        max_output_bytes=int(options.get("--max-output-bytes", 1_000_000)),
        capture_fds=True,
        reap=options.get("--reap") == "1",
    )
    os._exit(0)  # do not wait for threads the model's code left running


if __name__ == "__main__":
    main_stdio()
