"""What a kernel process holds: settings, the store, the turn runner and its current session.

Everything heavy (pydantic, SQLAlchemy, dspy) is imported on first use or by ``warm_up`` in a
background thread once the kernel has answered ``kernel_info``, so start-up stays close to a stock
ipykernel and a first cell sent right after it waits only for what is left to load.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet_kernel.lazy import import_module
from fleet_kernel.redact import LOG_FORMAT, RedactingFormatter, Redactor, env_secrets

if TYPE_CHECKING:
    from fleet_kernel.config import OutputMode, Settings
    from fleet_kernel.engine.runner import TurnHandle, TurnRunner  # the engine: the background warm-up loads it
    from fleet_kernel.engine.sessions import Sessions  # the engine and SQLAlchemy (~1 s) load in the background warm-up
    from fleet_kernel.store import Store  # SQLAlchemy (~1 s) loads in the background warm-up

log = logging.getLogger(__name__)


WARM_MODULES = (
    "fleet_kernel.config",
    "fleet_kernel.engine.runner",  # then the store opens on the loop, before the rest loads
    "fleet_kernel.transcript",
    "fleet_kernel.engine.sessions",
    "fleet_kernel.kernel.display",
    "fleet_kernel.engine.turn",  # dspy: the slow one
    "pygments.lexers.python",
    "markdown_it",
    "fleet_kernel.kernel.widgets",
    "nbformat",  # only %fleet export needs it
)
PROBE_SANDBOX_AFTER = "fleet_kernel.config"  # on its own thread, beside the engine's import
OPEN_STORE_AFTER = "fleet_kernel.engine.runner"
HOLD_BEFORE = "fleet_kernel.engine.turn"
HOLD_MAX_S = 5.0
"""dspy's import (~1 s of CPU) waits while a cell's turn is being started (``start_turn``), at most this long:
sharing the GIL with it, the turn's claim and its first event took several times as long."""
OPEN_WAIT_S = 30.0


class KernelContext:
    """Settings, store, runner and session of one kernel process; opened lazily, closed once."""

    def __init__(self) -> None:
        self._settings: Settings | None = None
        self.store: Store | None = None
        self.runner: TurnRunner | None = None
        self.session_id: str | None = None
        self.params: dict[str, str] = {}  # %fleet set: {name} in later cells is the value
        self.skills: tuple[str, ...] = ()  # %fleet skill use: cards in the prompt of the next turns
        self.explicit_output: OutputMode | None = None  # %fleet output
        self.widgets_seen = False  # a widget manager (JupyterLab) opened its control comm
        self.console_seen = False  # a terminal asked for its up-arrow history before any cell ran
        self.progress: Callable[[str], None] | None = None  # a running command's progress line (%fleet eval)
        self._open_lock = asyncio.Lock()
        self.warm = threading.Event()
        self._warm_started = False
        self._starting = 0  # turns being started (start_turn), which dspy's background import waits for
        self._turn_starting = threading.Condition()

    # ------------------------------------------------------------------ start-up

    def warm_up(self, loop: asyncio.AbstractEventLoop, then: Callable[[], object] | None = None) -> None:
        """Import the heavy modules in a thread, opening the store on ``loop`` on the way. Idempotent.

        What a turn needs before its first event (runner, store, sandbox) comes first, and the store is
        open before dspy starts loading: the two would otherwise share one core (the GIL) while a first
        cell waits for both. The sandbox probe (a bubblewrap process, waited for without the GIL) runs on
        a thread of its own from the moment the settings are read, beside the engine's import rather than
        after it. ``then`` is called on ``loop`` once everything has loaded: work that can wait for the
        first cell (the widgets' comm targets) starts there instead of competing with it for the GIL.
        """
        if self._warm_started:
            return
        self._warm_started = True

        def work() -> None:
            for name in WARM_MODULES:
                if name == HOLD_BEFORE:
                    with self._turn_starting:  # a first cell's turn is starting: it has the GIL to itself
                        self._turn_starting.wait_for(lambda: self._starting == 0, timeout=HOLD_MAX_S)
                try:
                    import_module(name)
                except Exception:
                    log.warning("warming %s failed", name, exc_info=True)
                if name == PROBE_SANDBOX_AFTER:
                    threading.Thread(target=self._probe_sandbox, name="fleet-sandbox-probe", daemon=True).start()
                elif name == OPEN_STORE_AFTER:
                    opened = asyncio.run_coroutine_threadsafe(self._open_quietly(), loop)
                    with contextlib.suppress(Exception):
                        opened.result(timeout=OPEN_WAIT_S)
            self.warm.set()
            if then is not None:
                with contextlib.suppress(RuntimeError):  # the loop closed: the kernel is shutting down
                    loop.call_soon_threadsafe(then)

        threading.Thread(target=work, name="fleet-warm-up", daemon=True).start()

    def _probe_sandbox(self) -> None:
        """Find the default backend now (it runs bubblewrap once) rather than in the first turn."""
        try:
            settings = self.settings
            from fleet_kernel.sandbox import choose  # the sandbox package loads backends on first use

            choose(settings)
        except Exception:
            log.warning("probing the sandbox failed", exc_info=True)

    async def _open_quietly(self) -> None:
        try:
            await self.open()
        except Exception:
            log.warning("opening the store in the background failed", exc_info=True)

    @property
    def settings(self) -> Settings:
        """The settings (environment and fleet.toml), loaded once. Raises ``ConfigError``."""
        if self._settings is None:
            from fleet_kernel.config import load_settings  # pydantic (~0.1 s) after the kernel has answered kernel_info

            self._settings = load_settings()
        return self._settings

    def choose_model(self, model: str) -> Settings:
        """Use ``model`` for this kernel's next turns (``%fleet model``, ``%%fleet --model``), if the engine
        allows it (``session_config.check_model``: the LM key goes only to the configured endpoints).

        A ``replay/<path>`` model is this kernel user's own choice of their own file, so it is read where it
        is (relative to the notebook), as ``FLEET_LM_MODEL`` is; over HTTP a session's cassette must be in
        ``[lm] cassettes_dir``.

        Raises:
            ValidationError: the model is not allowed.
        """
        from fleet_kernel.engine.session_config import REPLAY, check_model  # the engine loads after start

        settings = self.settings
        if model.startswith(REPLAY):
            return self.update_settings(lm_model=model, configured_models=(*settings.configured_models, model))
        check_model(model, settings)
        return self.update_settings(lm_model=model)

    def update_settings(self, **changes: object) -> Settings:
        """Change settings for this kernel's next turns (``%fleet model``, ``%fleet sandbox``)."""
        self._settings = self.settings.model_copy(update=changes)
        if self.runner is not None:
            self.runner.settings = self._settings
        return self._settings

    async def open(self) -> TurnRunner:
        """Open the store and the runner (once). Raises ``ConfigError`` or ``StoreUnavailableError``."""
        async with self._open_lock:
            if self.runner is None:
                await load_off_loop("fleet_kernel.engine.runner")
                # the engine and SQLAlchemy (~1 s) load in the background warm-up
                from fleet_kernel.engine.runner import TurnRunner
                from fleet_kernel.store import Store  # SQLAlchemy (~1 s) loads in the background warm-up

                settings = self.settings
                try:
                    self.store = await Store.open(settings.database_url)
                except OSError as exc:
                    from fleet_kernel.errors import ConfigError  # with load_settings, after kernel_info

                    raise ConfigError(
                        f"cannot keep Fleet's state in {settings.home} ({exc.strerror or exc}): "
                        "set FLEET_HOME to a folder you can write"
                    ) from exc
                self.runner = await TurnRunner(self.store, settings).open()
            return self.runner

    async def opened_store(self) -> Store:
        """The store, opened with the runner if need be (``open``'s errors)."""
        return (await self.open()).store

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.close()
        if self.store is not None:
            await self.store.close()
        self.runner = self.store = None

    # ------------------------------------------------------------------ session

    async def sessions(self) -> Sessions:
        """The sessions service over this kernel's store and its current settings (opened if need be)."""
        runner = await self.open()
        await load_off_loop("fleet_kernel.engine.sessions")
        # the engine and SQLAlchemy (~1 s) load in the background warm-up
        from fleet_kernel.engine.sessions import Sessions

        return Sessions(runner.store, self.settings)

    async def ensure_session(self) -> str:
        """The kernel's session, created on its first turn (titled from that turn's task by the store)."""
        sessions = await self.sessions()
        if self.session_id is None:
            self.session_id = (await sessions.create()).session_id
        return self.session_id

    async def start_turn(self, task: str, **start: Any) -> TurnHandle:
        """Start a turn of the kernel's session (created if need be): ``TurnRunner.start``'s handle.

        While it starts, the warm-up holds back dspy's import (see ``HOLD_BEFORE``): a first cell sent as
        the kernel comes up shows its turn's first event before dspy loads; the turn's thread, which needs
        dspy, waits for the warm-up's import as before.
        """
        with self._turn_starting:
            self._starting += 1
        try:
            session_id = await self.ensure_session()
            return await (await self.open()).start(session_id, task, **start)
        finally:
            with self._turn_starting:
                self._starting -= 1
                self._turn_starting.notify_all()

    async def use_session(self, session_id: str) -> None:
        """Continue an existing session: its history feeds the next turn. Raises ``NotFoundError``."""
        self.session_id = (await (await self.sessions()).get(session_id)).session_id

    # ------------------------------------------------------------------ output

    def chosen_output(self) -> OutputMode | None:
        """The output mode chosen for this kernel: ``%fleet output``, else ``FLEET_OUTPUT``; None if neither."""
        if self.explicit_output is not None:
            return self.explicit_output
        try:
            return self.settings.output
        except Exception:  # invalid settings: the first command or turn that needs them says so
            return None

    def output_mode(self) -> OutputMode:
        """``text`` or ``rich``: set by ``%fleet output``, ``FLEET_OUTPUT``, else ``fleet.toml``."""
        chosen = self.chosen_output()
        if chosen is not None:
            return chosen
        try:
            return self.settings.policy.kernel.output
        except Exception:
            return "rich"

    def live_mode(self) -> str:
        """How a turn is shown live: ``widgets``, ``plain`` displays, or ``text`` streams."""
        mode = self.output_mode()
        if mode == "text" or (self.chosen_output() is None and self.console_seen and not self.widgets_seen):
            return "text"
        return "widgets" if self.widgets_seen else "plain"


async def load_off_loop(module: str) -> None:
    """Import ``module`` on a worker thread, so a cold import never freezes the kernel's loop.

    A module the warm-up thread is still importing is already in ``sys.modules``: importing it on the loop
    would wait there, holding up every request (``is_complete`` too), until the warm-up is done with it.
    """
    loaded = sys.modules.get(module)
    if loaded is None or getattr(getattr(loaded, "__spec__", None), "_initializing", False):
        await asyncio.to_thread(import_module, module)


def route_output_to_log(home: Path | None = None) -> Path:
    """Send this process's logging, prints and fd 1/2 to ``$FLEET_HOME/logs/kernel.log``, never to a cell.

    Library warnings (LiteLLM, dspy) and stray prints would otherwise reach the frontend with an empty
    parent header (dropped by JupyterLab, shown in a console) or land in the next cell.
    """
    if home is None:
        from fleet_kernel.config import home_dir  # pydantic (~0.1 s) after the kernel has answered kernel_info

        home = home_dir()
    from fleet_kernel import ownership, safe_files

    try:
        if ownership.problem(home) is not None:  # another user's FLEET_HOME: the first cell says so
            raise PermissionError(f"{home} is not this user's")
        with safe_files.private_dirs(home, ["logs"]) as logs:
            path = home / "logs" / "kernel.log"
            fd = safe_files.open_append(logs, "kernel.log")
        stream = open(fd, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - lives as long as the process
    except OSError:  # an unwritable FLEET_HOME is reported by the first cell; the kernel must still start
        # A new file of a random name (O_EXCL, 0600): another local user could plant a link at a name they can
        # predict, such as one made of the PID, and have the log appended wherever it points.
        fd, name = tempfile.mkstemp(prefix=f"fleet-kernel-{os.getpid()}-", suffix=".log")
        path = Path(name)
        stream = open(fd, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
    for fd in (1, 2):
        os.dup2(stream.fileno(), fd)
    sys.stdout = sys.stderr = stream
    handler = logging.StreamHandler(stream)
    handler.setFormatter(RedactingFormatter(LOG_FORMAT, Redactor(env_secrets(os.environ))))  # no key in the log
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    for noisy in ("LiteLLM", "litellm", "httpx", "dspy"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.captureWarnings(True)
    return path
