"""Pre-started ``local`` sandboxes, so a turn's first execution has no cold start; idle ones are stopped.

A pooled worker is a ``ProcessSession`` started without a workspace: ``_stage.py`` has mounted the
quota'd tmpfs and started bubblewrap and the runtime, and waits on a socket for the workspace to copy
in. ``sessions(...)`` gives the interpreter a session that, when started, takes a ready worker with the
same limits and has it adopt the turn's workspace (any session's, not only a new one's: the copy-in
happens at adoption), else starts one cold. Either way the pool refills in the background.

All workers are started by one long-lived daemon thread: a parent-death signal (``PR_SET_PDEATHSIG``,
what bubblewrap's ``--die-with-parent`` sets) fires when the forking *thread* exits, so no sandbox may
depend on a short-lived thread (a request's or an executor's) for its life.

A sandbox bound to a session that runs no code for ``[sandbox] idle_stop_s`` is stopped (its workspace
is copied back, as at the end of a turn); the next execution is told its variables are gone and the one
after it runs in a fresh sandbox, from the pool, on the same files.

Ready workers count against ``[sandbox] max_sandboxes`` (each holds a slot, ``_slots``), so the pool fills
only with free slots, never while a sandbox waits for one, and gives a ready worker up for a waiting one.
A ready worker whose sandbox died (killed, out of memory) is dropped, at the next look and at every take.
"""

from __future__ import annotations

import atexit
import collections
import enum
import logging
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from fleet_kernel.config import SandboxLimits
from fleet_kernel.sandbox import _confine, _slots
from fleet_kernel.sandbox._protocol import SessionClosed
from fleet_kernel.sandbox._support import support_dir
from fleet_kernel.sandbox.local import STOP_TIMEOUT_S, ProcessSession, SlotsFull
from fleet_kernel.sandbox.runtime import HostMessage, MessageType

logger = logging.getLogger(__name__)

CHECK_S = 1.0  # how often the pool thread looks for idle sandboxes
RETRY_S = 30.0  # after a pooled start failed, wait this long before trying again
# After a worker is taken, wait this long before booting its replacement: a boot is ~100 ms of CPU, and
# started at once it competes with the turn that took the worker for its first, latency-bound steps
# (measured on 2 cores: the first execution took 13-31 ms next to a boot, 2-6 ms without). Counted from
# the first take since the last refill: takes coming faster than this must not put the refill off.
REFILL_DELAY_S = 0.3


def _filtered() -> bool:
    """A worker is started with the seccomp filter when the host has one: a ready worker must match."""
    return _confine.seccomp_program() is not None


class Pool:
    """Up to ``size`` ready workers for the limits last asked for, kept full by one thread."""

    def __init__(self) -> None:
        self.size = 0
        self.idle_stop_s = 0.0
        self._limits: SandboxLimits | None = None
        self._filtered = False  # whether the ready workers run under the seccomp filter
        self._ready: collections.deque[ProcessSession] = collections.deque()
        self._bound: weakref.WeakSet[PooledSession] = weakref.WeakSet()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._failed_at = float("-inf")
        self._full_at = float("-inf")  # when the pool last found no free slot (or gave one up)
        self._refill_at: float | None = None  # when the workers taken since the last refill are replaced
        self.handed_out = 0  # workers taken ready from the pool (pre-started), for tests and the bench
        self.started = 0  # workers the pool thread started

    # -- configuration -------------------------------------------------------------------------

    def configure(self, limits: SandboxLimits, size: int, idle_stop_s: float) -> None:
        """Keep ``size`` workers with ``limits`` ready (0: none); start the pool thread on first use."""
        with self._wake:
            if self._closed:
                return
            if limits != self._limits or _filtered() != self._filtered:
                self._discard_ready()
            self._limits, self.size, self.idle_stop_s = limits, size, idle_stop_s
            self._filtered = _filtered()
            if self._thread is None:
                support_dir()  # made (and its removal at exit registered) first, so the pool is closed before
                atexit.register(self.close)
                self._thread = threading.Thread(target=self._run, name="fleet-sandbox-pool", daemon=True)
                self._thread.start()
            self._wake.notify_all()

    def ready(self) -> int:
        with self._wake:
            return len(self._ready)

    # -- handing out ---------------------------------------------------------------------------

    def take(self, limits: SandboxLimits) -> ProcessSession | None:
        """A ready worker with ``limits``, or None (the caller starts one cold); the pool then refills."""
        with self._wake:
            worker = None
            while self._ready and limits == self._limits and _filtered() == self._filtered:
                candidate = self._ready.popleft()
                if candidate.healthy():
                    worker = candidate
                    break
                candidate.kill()
            if self._refill_at is None:
                self._refill_at = time.monotonic() + REFILL_DELAY_S
            self._wake.notify_all()
        if worker is not None:
            self.handed_out += 1
        return worker

    def bind(self, session: PooledSession) -> None:
        with self._wake:
            self._bound.add(session)

    # -- the pool thread -----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._wake:
                if self._closed:
                    return
                missing, wait = self._missing(), self._refill_wait()
                if missing <= 0 or wait > 0:
                    self._wake.wait(min(CHECK_S, wait) if missing > 0 else CHECK_S)
                limits, missing, wait = self._limits, self._missing(), self._refill_wait()
                if missing > 0 and limits is not None and wait <= 0:
                    self._refill_at = None  # what is taken from now on waits for a refill of its own
            self._stop_idle()
            self._drop_dead()
            self._yield_slot()
            if missing > 0 and limits is not None and wait <= 0:
                self._start(limits, missing)

    def _drop_dead(self) -> None:
        """Ready workers whose sandbox died (killed, out of memory) leave the pool, which then refills."""
        with self._wake:
            dead = [worker for worker in self._ready if not worker.healthy()]
            for worker in dead:
                self._ready.remove(worker)
        for worker in dead:
            logger.warning("a pre-started sandbox died while it waited; replacing it")
            worker.kill()

    def _yield_slot(self) -> None:
        """Give a ready worker's slot to a sandbox that waits for one (in this process or another)."""
        with self._wake:
            if not self._ready or not _slots.someone_waits():
                return
            worker = self._ready.pop()
            self._full_at = time.monotonic()
        logger.info("giving a pre-started sandbox up: another sandbox waits for a slot ([sandbox] max_sandboxes)")
        worker.kill()

    def _missing(self) -> int:
        return self.size - len(self._ready) if self._limits is not None else 0

    def _refill_wait(self) -> float:
        """Seconds until the pool may boot workers: after a failed start, and a moment after the first take
        since the last refill."""
        now = time.monotonic()
        return max(0.0, self._failed_at + RETRY_S - now, self._full_at + CHECK_S - now, (self._refill_at or now) - now)

    def _start(self, limits: SandboxLimits, count: int) -> None:
        """Start ``count`` workers together (they boot in parallel, on every core), then keep the ready ones."""
        booting: list[ProcessSession] = []
        filtered = _filtered()  # what these workers start under: kept only while the pool still asks for it
        for _ in range(count):
            if _slots.someone_waits():  # a free slot is for the sandbox waiting for it
                self._full_at = time.monotonic()
                break
            worker = ProcessSession(None, limits, isolated=True)
            worker.slot_wait_s = 0  # the pool never waits for a slot: it fills what is free
            try:
                worker.start(wait=False)  # forked by this thread, which outlives them (see above)
            except SlotsFull:
                self._full_at = time.monotonic()
                break
            except SessionClosed as exc:
                self._failed(exc)
                break
            booting.append(worker)
        for worker in booting:
            try:
                worker.wait_ready()
            except SessionClosed as exc:
                worker.kill()
                self._failed(exc)
                continue
            with self._wake:
                keep = (
                    not self._closed
                    and limits == self._limits
                    and filtered == self._filtered
                    and len(self._ready) < self.size
                )
                if keep:
                    self._ready.append(worker)
                    self.started += 1
            if not keep:
                worker.kill()

    def _failed(self, exc: SessionClosed) -> None:
        if not self._closed:
            self._failed_at = time.monotonic()
            logger.warning("could not pre-start a sandbox (retrying in %g s): %s", RETRY_S, exc)

    def wait_saved(self, workspace: Path) -> None:
        """Wait while an idle stop of ``workspace``'s sandbox is copying it back: a session starting on
        it then sees the files the stopped one wrote (the stop runs on the pool thread)."""
        with self._wake:
            stopping = [s for s in self._bound if s.phase is Phase.IDLE_STOPPED and s.workspace == workspace]
        for session in stopping:
            session.saved.wait(STOP_TIMEOUT_S)

    def _stop_idle(self) -> None:
        if self.idle_stop_s <= 0:
            return
        now = time.monotonic()
        with self._wake:
            bound = list(self._bound)
        for session in bound:
            session.stop_if_idle(now, self.idle_stop_s)

    # -- shutdown ------------------------------------------------------------------------------

    def _discard_ready(self) -> None:
        while self._ready:
            self._ready.popleft().kill()

    def close(self) -> None:
        """Stop the pool thread and every ready worker (bound ones belong to their turns)."""
        with self._wake:
            self._closed = True
            ready, self._ready = list(self._ready), collections.deque()
            self._wake.notify_all()
        for worker in ready:
            worker.kill()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)


POOL = Pool()


class Phase(enum.Enum):
    """Where a ``PooledSession`` is in its life."""

    NEW = "new"  # made, or starting: ``start`` takes a ready worker or starts one cold
    IDLE = "idle"  # started, running no code: ``stop_if_idle`` stops it after ``idle_stop_s``
    RUNNING = "running"  # an execution was sent and its ``done`` not yet received
    IDLE_STOPPED = "idle stopped"  # stopped for idling: ``saved`` is set once its workspace is copied back
    KILLED = "killed"  # ``kill`` was called (a start in progress gives up); from any phase but IDLE_STOPPED


class PooledSession:
    """The ``SandboxSession`` an interpreter gets: a pooled worker adopting ``workspace``, or a cold one.

    Stopped when idle (``stop_if_idle``); the next ``send`` then raises ``SessionClosed`` saying so,
    and the interpreter starts a new session, which adopts the files the stopped one copied back.
    Its ``phase`` changes under ``_lock``: NEW -> IDLE <-> RUNNING, then IDLE_STOPPED or KILLED.
    """

    def __init__(self, pool: Pool, workspace: Path, limits: SandboxLimits) -> None:
        self._pool, self.workspace, self._limits = pool, workspace, limits
        self._worker: ProcessSession | None = None
        self._lock = threading.RLock()  # reentrant: a SIGINT handler's cancel may kill it on a thread inside send
        self.phase = Phase.NEW
        self._last_use = time.monotonic()
        self.saved = threading.Event()  # an idle stop has copied the workspace back
        self.pooled = False  # the worker came ready from the pool

    def start(self) -> None:
        self._pool.wait_saved(self.workspace)  # files an idle stop is still copying back come in too
        worker = self._worker = self._pool.take(self._limits)  # set at once, so ``kill`` reaches it
        if worker is not None:
            try:
                self._check_killed()
                worker.adopt(self.workspace)
                self.pooled = True
            except SessionClosed as exc:
                if self.phase is Phase.KILLED:
                    raise
                logger.warning("a pooled sandbox could not take the workspace; starting one: %s", exc)
                worker = None
        if worker is None:
            self._check_killed()
            worker = self._worker = ProcessSession(self.workspace, self._limits, isolated=True)
            worker.start()
        with self._lock:
            self._check_killed()
            self.phase, self._last_use = Phase.IDLE, time.monotonic()
        self._pool.bind(self)

    def _check_killed(self) -> None:
        if self.phase is Phase.KILLED:  # the caller kills the worker it finds on this session
            raise SessionClosed("was stopped while it started")

    def _started(self) -> ProcessSession:
        """The worker ``start`` bound; raises ``SessionClosed`` before that (the interpreter then starts anew)."""
        worker = self._worker
        if worker is None:
            raise SessionClosed("was not started")
        return worker

    def send(self, message: HostMessage) -> None:
        with self._lock:
            if self.phase is Phase.IDLE_STOPPED:
                raise SessionClosed(f"was stopped after {self._pool.idle_stop_s:g} s without running code")
            if message.get("type") == MessageType.EXECUTE and self.phase is Phase.IDLE:
                self.phase = Phase.RUNNING
            self._last_use = time.monotonic()
        self._started().send(message)

    def receive(self, timeout: float) -> dict[str, Any] | None:
        message = self._started().receive(timeout)
        if message is not None and message.get("type") == MessageType.DONE:
            with self._lock:
                if self.phase is Phase.RUNNING:
                    self.phase = Phase.IDLE
                self._last_use = time.monotonic()
        return message

    def interrupt(self) -> None:
        if self._worker is not None:
            self._worker.interrupt()

    def kill(self) -> None:
        with self._lock:
            if self.phase is not Phase.IDLE_STOPPED:  # stopped already; ``wait_saved`` still waits for its copy-back
                self.phase = Phase.KILLED
        if self._worker is not None:
            self._worker.kill()

    def alive(self) -> bool:
        return self._worker is not None and self._worker.alive()

    def __getattr__(self, name: str) -> Any:
        """Anything else (the process, its cgroup) is the worker's."""
        worker = self.__dict__.get("_worker")
        if worker is None:
            raise AttributeError(name)
        return getattr(worker, name)

    def stop_if_idle(self, now: float, idle_s: float) -> None:
        """Stop the sandbox (copying its workspace back) when it has run no code for ``idle_s``."""
        with self._lock:
            worker = self._worker
            if self.phase is not Phase.IDLE or worker is None or now - self._last_use < idle_s:
                return
            self.phase = Phase.IDLE_STOPPED
        logger.info("stopping a sandbox idle for %g s (%s)", idle_s, self.workspace)
        try:
            worker.kill()
        finally:
            self.saved.set()


def sessions(workspace: Path, limits: SandboxLimits) -> PooledSession:
    """A new session for ``workspace`` on the process-wide pool (the interpreters' ``new_session``)."""
    return PooledSession(POOL, workspace, limits)
