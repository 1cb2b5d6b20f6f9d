"""A real ``fleet-test`` kernel over ZMQ, and what one request produced as a frontend saw it."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from queue import Empty
from typing import Any

from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager, start_new_kernel

from fleet_kernel.events import Event
from fleet_kernel.store import Store

KERNEL = "fleet-test"
SHARED_KERNEL = "fleet-test-shared"
"""The same kernel with a comm target that puts back its kernel-wide state (``shared_kernel.py``)."""
CHROMIUM = "/usr/bin/chromium"  # Debian's, driven by playwright in the browser tests
RESET_TARGET = "fleet-test.reset"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


@dataclass
class Run:
    """What one execute_request produced, as a frontend saw it."""

    reply: dict[str, Any]
    messages: list[dict[str, Any]] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    states: list[tuple[str, int]] = field(default_factory=list)
    """Each status message and how many outputs had arrived before it."""

    @property
    def types(self) -> list[str]:
        return [m["msg_type"] for m in self.messages]

    def of(self, msg_type: str) -> list[dict[str, Any]]:
        return [m["content"] for m in self.messages if m["msg_type"] == msg_type]

    @property
    def result(self) -> dict[str, Any]:
        (result,) = self.of("execute_result")
        return result

    def text(self) -> str:
        """Everything a person could read in the outputs, as one string."""
        parts = [c["text"] for c in self.of("stream")]
        for kind in ("display_data", "update_display_data", "execute_result"):
            parts += [c["data"].get("text/plain", "") for c in self.of(kind)]
        parts += [" ".join(c["traceback"]) for c in self.of("error")]
        return "\n".join(parts)


class Kernel:
    """A real ``fleet-test`` kernel process and a blocking client."""

    def __init__(self, env: dict[str, str], kernel_name: str = KERNEL, **start: Any) -> None:
        """``start``: more of ``KernelManager.start_kernel``'s arguments (``cwd``)."""
        self.km: KernelManager
        self.kc: BlockingKernelClient
        self._at(env)
        self.km, self.kc = start_new_kernel(
            kernel_name=kernel_name, env={**os.environ, **env}, startup_timeout=60, **start
        )

    def _at(self, env: dict[str, str]) -> None:
        self.env = env
        """What the kernel's environment adds to this process's."""
        self.home = Path(env["FLEET_HOME"]) if env.get("FLEET_HOME") else None
        """The kernel's FLEET_HOME: where its store (``fleet.db``), workspaces and skills are."""
        self.database_url = env.get("FLEET_DATABASE_URL") or (
            f"sqlite+aiosqlite:///{self.home / 'fleet.db'}" if self.home else ""
        )
        """The kernel's store."""

    def submit(self, code: str, **kwargs: Any) -> str:
        return self.kc.execute(code, **kwargs)

    def collect(self, msg_id: str, timeout: float = 60, until_idle: bool = True) -> Run:
        """IOPub messages of one request until ``idle``, then its reply."""
        run = Run(reply={})
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=max(deadline - time.monotonic(), 0.01))
            except Empty:
                raise AssertionError(f"no idle within {timeout} s; got {run.types}") from None
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status":
                state = msg["content"]["execution_state"]
                run.states.append((state, len(run.messages)))
                if state == "idle" and until_idle:
                    break
                continue
            run.messages.append(msg)
            run.times.append(time.monotonic())
        while True:
            reply = self.kc.get_shell_msg(timeout=max(deadline - time.monotonic(), 1))
            if reply["parent_header"].get("msg_id") == msg_id:
                run.reply = reply
                return run

    def run(self, code: str, timeout: float = 60, **kwargs: Any) -> Run:
        return self.collect(self.submit(code, **kwargs), timeout)

    def session_id(self) -> str:
        """The kernel's current session (``%fleet session``), which its first turn started."""
        text = self.run("%fleet session").text()
        assert text.startswith("Session "), text
        return text.split()[1].rstrip(":")

    def stored_events(self, turn_id: str) -> list[Event]:
        """The turn's events as the kernel's store holds them."""

        async def read() -> list[Event]:
            store = await Store.open(self.database_url)
            try:
                return list(await store.events_after(turn_id, 0, limit=100_000))
            finally:
                await store.close()

        return asyncio.run(read())

    def wait_for_output(self, msg_id: str, needle: str, timeout: float = 120) -> list[dict[str, Any]]:
        """IOPub messages of ``msg_id`` up to the first stream containing ``needle`` (``timeout``: a liveness
        bound for a loaded machine, not a speed check)."""
        seen = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = self.kc.get_iopub_msg(timeout=0.5)
            except Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            seen.append(msg)
            if msg["msg_type"] == "stream" and needle in msg["content"]["text"]:
                return seen
        raise AssertionError(f"{needle!r} never appeared; got {[m['msg_type'] for m in seen]}")

    graceful = False
    """Shut down with a shutdown_request (the kernel then cancels its turn and closes its store) instead of a kill."""

    def close(self) -> None:
        self.kc.stop_channels()
        if self.km.has_kernel:
            self.km.shutdown_kernel(now=not self.graceful)


class PythonKernel(Kernel):
    """A real ``python3`` ipykernel (this venv's) with ``%load_ext fleet_kernel``, on a store and scripted LM."""

    def __init__(self, env: dict[str, str], load: bool = True) -> None:
        """``load``: run ``%load_ext fleet_kernel`` as the first cell."""
        self._at(env)
        self.km, self.kc = start_new_kernel(kernel_name="python3", env={**os.environ, **env}, startup_timeout=60)
        if load:
            self.ok("%load_ext fleet_kernel")

    def ok(self, code: str, timeout: float = 90) -> Any:
        run = self.run(code, timeout=timeout)
        assert run.reply["content"]["status"] == "ok", run.text()
        return run

    def value(self, expression: str) -> str:
        reply = self.kc.execute_interactive(
            "", user_expressions={"v": expression}, timeout=30, output_hook=lambda _msg: None
        )
        found = reply["content"]["user_expressions"]["v"]
        assert found["status"] == "ok", found
        return found["data"]["text/plain"]


PYTHON_RESET = """\
_fleet = get_ipython().magics_manager.registry["FleetMagics"]
_fleet.context_mode, _fleet.tool_names = "names", []
_ctx = _fleet.engine.ctx
_ctx.params, _ctx.skills, _ctx.explicit_output, _ctx.widgets_seen, _ctx.console_seen = {}, (), None, False, False
_ctx.progress = _ctx.session_id = None
if _ctx._settings is not None:
    _ctx._settings = None
    if _ctx.runner is not None:
        _ctx.runner.settings = _ctx.settings
get_ipython().reset(new_session=True)
"""
"""Put a python3 kernel's Fleet state back as ``%load_ext fleet_kernel`` left it: no variables, cells or Out
(the notebook a turn sees), the magic's context mode and tools, and the engine's kernel-wide state (no session:
the next turn starts one)."""


class SharedPython:
    """One python3 kernel with the magic that many tests use in turn (the ``py`` fixture), reset between them."""

    def __init__(self, env: dict[str, str], lm: Any) -> None:
        self.env, self.lm = env, lm
        self.kernel: PythonKernel | None = None

    def hand_over(self) -> PythonKernel:
        if self.kernel is not None:
            try:
                self._reset(self.kernel)
            except (AssertionError, Empty, RuntimeError, TimeoutError) as exc:
                print(f"the shared python3 kernel did not come back ({exc}): starting a new one")
                self.close()
        if self.kernel is None:
            self.kernel = PythonKernel(self.env)
            self._reset(self.kernel)
        self.lm.reset()
        return self.kernel

    @staticmethod
    def _reset(kernel: PythonKernel) -> None:
        if not kernel.km.is_alive():
            raise RuntimeError("the kernel process has exited")
        msg_id = kernel.submit(PYTHON_RESET, store_history=False)
        try:
            run = kernel.collect(msg_id, timeout=10)
        except AssertionError:  # a turn or a cell still runs: interrupt it, once
            kernel.km.interrupt_kernel()
            kernel.collect(msg_id, timeout=30)
            run = kernel.collect(kernel.submit(PYTHON_RESET, store_history=False), timeout=30)
        assert run.reply["content"]["status"] == "ok", run.text()
        while True:
            try:
                kernel.kc.get_iopub_msg(timeout=0.05)
            except Empty:
                break

    def close(self) -> None:
        if self.kernel is not None:
            self.kernel.close()
            self.kernel = None


class SharedKernel:
    """One kernel that many tests use in turn, each in a session of its own (the ``kernel`` fixture).

    Starting a kernel and its first turn (which loads dspy and LiteLLM) costs seconds of CPU; a test of what
    a turn or a command does needs neither. A kernel that died is replaced by a new one.
    """

    def __init__(self, env: dict[str, str], lm: Any, **start: Any) -> None:
        self.env, self.lm, self.start = env, lm, start
        self.kernel: Kernel | None = None

    def hand_over(self) -> Kernel:
        """The kernel, idle (a running turn interrupted), reset to a new kernel's state (its next turn starts a
        new session), with the LM reset and nothing left to read on IOPub."""
        if self.kernel is not None:
            try:
                self._reset(self.kernel)
            except (AssertionError, Empty, RuntimeError) as exc:  # dead or stuck: a new kernel serves the test
                print(f"the shared kernel did not come back ({exc}): starting a new one")
                self.close()
        if self.kernel is None:
            self.kernel = Kernel(self.env, kernel_name=SHARED_KERNEL, **self.start)
            self._reset(self.kernel)
        self.lm.reset()
        return self.kernel

    def _reset(self, kernel: Kernel) -> None:
        if not kernel.km.is_alive():
            raise RuntimeError("the kernel process has exited")
        interrupt = kernel.kc.session.msg("interrupt_request", {})
        kernel.kc.control_channel.send(interrupt)
        deadline = time.monotonic() + 30
        while (
            kernel.kc.control_channel.get_msg(timeout=max(deadline - time.monotonic(), 0.01))["parent_header"].get(
                "msg_id"
            )
            != interrupt["header"]["msg_id"]
        ):
            pass
        self._put_back(kernel)
        run = kernel.run("%fleet session", timeout=60)  # after the comm_open: shell requests are handled in order
        assert run.reply["content"]["status"] == "ok" and "No session yet" in run.text(), run.text()
        self._put_back(kernel)  # again: that command was the kernel's first cell run, to a new kernel
        while True:
            try:
                kernel.kc.get_iopub_msg(timeout=0.05)
            except Empty:
                break

    @staticmethod
    def _put_back(kernel: Kernel) -> None:
        content = {"comm_id": uuid.uuid4().hex, "target_name": RESET_TARGET, "data": {}}
        kernel.kc.shell_channel.send(kernel.kc.session.msg("comm_open", content))

    def close(self) -> None:
        if self.kernel is not None:
            self.kernel.close()
            self.kernel = None


# ---------------------------------------------------------------- widgets, as JupyterLab drives them


def attach_widget_manager(kernel: Kernel) -> None:
    """Do what JupyterLab's widget manager does on connect: open the widget control comm."""
    content = {"comm_id": uuid.uuid4().hex, "target_name": "jupyter.widget.control", "data": {}}
    msg = kernel.kc.session.msg("comm_open", content, metadata={"version": "1.0.0"})
    kernel.kc.shell_channel.send(msg)
    kernel.run("%fleet output")  # a round trip: the comm_open has been handled


def widget_models(messages: list[dict[str, Any]]) -> dict[str, str]:
    """``{comm_id: model name}`` of the widgets the kernel opened."""
    return {
        m["content"]["comm_id"]: m["content"]["data"]["state"]["_model_name"]
        for m in messages
        if m["msg_type"] == "comm_open"
    }


def send_comm(kernel: Kernel, comm_id: str, data: dict[str, Any]) -> None:
    """A comm message from the frontend, as JupyterLab sends one when a widget is used."""
    kernel.kc.shell_channel.send(kernel.kc.session.msg("comm_msg", {"comm_id": comm_id, "data": data}))


def wait_for_state(kernel: Kernel, text: str, timeout: float = 30) -> None:
    """Read IOPub until a widget's state update carries ``text``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = kernel.kc.get_iopub_msg(timeout=max(deadline - time.monotonic(), 0.01))
        if msg["msg_type"] == "comm_msg" and text in str(msg["content"]["data"].get("state", {})):
            return
    raise AssertionError(f"no widget state with {text!r} within {timeout} s")


def click(kernel: Kernel, button: str) -> None:
    """A click on the button widget whose comm is ``button``."""
    send_comm(kernel, button, {"method": "custom", "content": {"event": "click"}})
