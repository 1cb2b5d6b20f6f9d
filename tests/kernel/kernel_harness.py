"""A real ``fleet-test`` kernel over ZMQ, and what one request produced as a frontend saw it."""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field
from queue import Empty
from typing import Any

from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager, start_new_kernel

KERNEL = "fleet-test"
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

    def __init__(self, env: dict[str, str], **start: Any) -> None:
        """``start``: more of ``KernelManager.start_kernel``'s arguments (``cwd``)."""
        self.km: KernelManager
        self.kc: BlockingKernelClient
        self.km, self.kc = start_new_kernel(kernel_name=KERNEL, env={**os.environ, **env}, startup_timeout=60, **start)

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
