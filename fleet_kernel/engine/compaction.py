"""Long sessions: a turn's history is a rolling summary of its older turns, then its latest turns whole.

A turn sees its session's earlier turns in the order of ``Store.history`` (each notebook cell's latest
completed turn, see ``store/cells.py``). The newest of them, as many as ``[history] window_turns`` and the
history's character budget hold, are given whole. The older ones are not cut off: the sub-model folds them
into one rolling summary, kept in the store (``history_summaries``) with the ids of the turns it covers.

- The summary grows incrementally: at the start of a turn whose window has left behind turns it does not
  cover, one sub-model call writes the new summary from the old one and those turns (a bounded prompt). That
  call is one of the turn's LM calls (``lm.finished`` with role ``sub``), in its usage and budget.
- It stands only while the turns it covers are still the first turns the history sees, in order: when one of
  them is replaced (its cell re-run) or forgotten, it is dropped, and the next turn rebuilds it.
- The budget is sized from the root model's context length where LiteLLM knows it or the model server
  reports it (or ``[lm] context_tokens``): the history gets an eighth of the context (~4 characters a
  token), never more than ``[history] max_chars``, and the summary a quarter of that.
- When the summary call fails the turn goes on with what stands (the old summary, if any) and a note of the
  turns left out; the next turn tries again.

No dspy here: the runner plans a turn's history on the event loop; the turn's thread calls ``fold``.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet_kernel.config import Settings
from fleet_kernel.engine.session_config import REPLAY
from fleet_kernel.store import HistoryRead, HistorySummaryRow, Store, TurnRow

log = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4
HISTORY_SHARE = 8
"""The history gets 1/8 of the root model's context: the instructions, the REPL steps and the reply need the rest."""
SUMMARY_SHARE = 4
"""The summary gets 1/4 of the history's characters once there is one; the latest turns the rest."""
FOLD_FACTOR = 2
"""One summarising call reads at most twice the history's characters of new turns (and the old summary)."""
MIN_TURN_CHARS = 200
"""Each turn folded keeps at least this much of its text; more turns than that fits wait for the next call."""

SUMMARY_INSTRUCTIONS = (
    "You keep the running summary of a long working session between a user and an assistant that writes and "
    "runs Python. Write the new summary in at most {words} words, as plain notes, oldest first: the facts, "
    "numbers, names, file names, decisions and results that later turns may need. Keep what the summary so far "
    "says unless a later turn changed it. No preamble."
)


@dataclass(frozen=True)
class Window:
    """How much of the past a turn's history holds."""

    turns: int  # at most this many latest turns whole
    chars: int  # the whole history input, summary included
    summary_chars: int  # the summary's part, once there is one
    fold_chars: int  # the new turns one summarising call reads
    context_tokens: int | None  # the root model's context length, when known

    @property
    def off(self) -> bool:
        """``window_turns = 0`` or ``max_chars = 0``: turns see no history at all."""
        return self.turns <= 0 or self.chars <= 0


MODEL_MAP = "model_prices_and_context_window_backup.json"
"""LiteLLM's model map, in its package."""


@functools.cache
def known_context(model: str) -> int | None:
    """The model's context length in tokens as LiteLLM's model map has it, or None (unknown, a replay)."""
    if not model or model.startswith(REPLAY):
        return None
    models = _model_map()
    for name in (model, model.split("/", 1)[-1]):
        info = models.get(name) or {}
        value = info.get("max_input_tokens") or info.get("max_tokens")
        if isinstance(value, int) and value > 0:
            return value
    return None


@functools.cache
def _model_map() -> dict[str, dict[str, Any]]:
    """LiteLLM's static model map, each name (aliases too) to its row: the JSON it ships and loads in local mode
    (``LITELLM_LOCAL_MODEL_COST_MAP``, set by fleet_kernel), read without importing LiteLLM. That import costs
    ~2.5 s of CPU on a process's first turn, and a turn needs nothing else of it: dspy calls the model itself.
    (Not ``litellm.get_model_info`` either: it asks an ollama server itself, an endpoint the operator never
    configured.)"""
    spec = importlib.util.find_spec("litellm")
    if spec is None or spec.origin is None:
        return {}
    try:
        models = json.loads((Path(spec.origin).parent / MODEL_MAP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(models, dict):
        return {}
    rows = {name: info for name, info in models.items() if isinstance(info, dict)}
    for info in list(rows.values()):  # a row may list other names it is known by
        aliases = info.get("aliases")
        for alias in aliases if isinstance(aliases, list) else ():
            if isinstance(alias, str):
                rows.setdefault(alias, info)
    for name, info in list(rows.items()):  # an alias row stands for the row it names
        for _ in range(3):
            target = info.get("alias_of")
            if not isinstance(target, str):
                break
            info = rows.get(target, {})
        rows[name] = info
    return rows


SERVER_TIMEOUT_S = 2.0
_served: dict[tuple[str, str], int | None] = {}


def served_context(settings: Settings) -> int | None:
    """The context length the OpenAI-compatible server at ``FLEET_LM_BASE_URL`` reports for the root model:
    llama.cpp's ``/props`` (``n_ctx``, what it serves with) or ``/v1/models`` (vLLM's ``max_model_len``,
    OpenRouter's ``context_length``, llama.cpp's ``meta.n_ctx_train``); None when it says nothing. Asked once
    per process, with the LM key."""
    base = (settings.lm_base_url or "").rstrip("/")
    model = (settings.lm_model or "").split("/", 1)[-1]
    if not base or not model or (settings.lm_model or "").startswith(REPLAY):
        return None
    if (base, model) not in _served:
        _served[(base, model)] = _ask_server(base, model, settings)
    return _served[(base, model)]


def _ask_server(base: str, model: str, settings: Settings) -> int | None:
    import httpx  # noqa: PLC0415 - only when a model server is asked

    key = settings.lm_api_key.get_secret_value() if settings.lm_api_key else None
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    root = base.removesuffix("/v1")
    try:
        with httpx.Client(timeout=SERVER_TIMEOUT_S, headers=headers) as client:
            props = client.get(f"{root}/props")
            if props.status_code == 200:
                n_ctx = (props.json().get("default_generation_settings") or {}).get("n_ctx")
                if isinstance(n_ctx, int) and n_ctx > 0:
                    return n_ctx
            listed = client.get(f"{base}/models")
            if listed.status_code != 200:
                return None
            entries = [e for e in listed.json().get("data") or [] if isinstance(e, dict)]
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    chosen = [e for e in entries if e.get("id") == model] or (entries if len(entries) == 1 else [])
    for entry in chosen:
        meta = entry.get("meta") or {}
        value = entry.get("max_model_len") or entry.get("context_length") or meta.get("n_ctx_train")
        if isinstance(value, int) and value > 0:
            return value
    return None


def window_for(settings: Settings) -> Window:
    """The history budget of a turn under ``settings`` (its session's models). May import LiteLLM and ask
    the model server (once a process): call it off the event loop."""
    policy = settings.policy
    context = policy.lm.context_tokens or known_context(settings.lm_model or "") or served_context(settings)
    chars = policy.history.max_chars
    if context is not None:
        chars = min(chars, context * CHARS_PER_TOKEN // HISTORY_SHARE)
    fold = FOLD_FACTOR * chars
    sub_context = known_context(settings.sub_lm_model) if settings.sub_lm_model else context
    if sub_context is not None:
        fold = min(fold, sub_context * CHARS_PER_TOKEN // 2)
    return Window(policy.history.window_turns, chars, chars // SUMMARY_SHARE, max(fold, MIN_TURN_CHARS), context)


def turn_block(number: int, turn: TurnRow) -> str:
    """One earlier turn as the model sees it."""
    if turn.status == "completed":
        answer = turn.answer or ""
    else:
        answer = f"({turn.status}: {(turn.error or {}).get('message', '')})"
    return f"--- turn {number} ---\nUser: {turn.task}\nAssistant: {answer}"


def span(first: int, last: int) -> str:
    return f"turn {first}" if first == last else f"turns {first}-{last}"


@dataclass
class NewSummary:
    """What ``fold`` wrote, for the runner to keep."""

    text: str
    covers: list[str]
    model: str | None


@dataclass
class HistoryPlan:
    """A turn's history: the turns it sees, the latest given whole, the summary that stands, and the older
    turns it does not cover yet (``pending``, folded in by ``fold``)."""

    window: Window
    seen: list[str]
    recent: list[TurnRow]
    summary: HistorySummaryRow | None  # stored, and covers the first turns of ``seen``
    stale: HistorySummaryRow | None = None  # stored, but a turn it covers was replaced or forgotten
    pending: list[TurnRow] | None = None  # older turns to fold in now, oldest first
    folded: NewSummary | None = None

    @property
    def older(self) -> int:
        """How many of the turns seen are past the window."""
        return len(self.seen) - len(self.recent)

    @property
    def covered(self) -> int:
        if self.folded is not None:
            return len(self.folded.covers)
        return len(self.summary.covers) if self.summary is not None else 0

    @property
    def summary_text(self) -> str | None:
        if self.folded is not None:
            return self.folded.text
        return self.summary.text if self.summary is not None else None

    @property
    def needs_folding(self) -> bool:
        return bool(self.pending)

    def text(self) -> str:
        """The ``history`` input: the summary, a note of older turns it leaves out, then the latest turns."""
        if not self.seen or self.window.off:
            return ""  # the first turn: the model gets no history input at all
        parts = []
        covered = self.covered
        if covered and self.summary_text:
            parts.append(f"--- summary of {span(1, covered)} ---\n{self.summary_text}")
        if covered < self.older:
            parts.append(f"... ({span(covered + 1, self.older)} left out: not in the summary yet)")
        budget = self.window.chars - (len("\n\n".join(parts)) + 2 if parts else 0)
        blocks = [turn_block(self.older + i + 1, turn) for i, turn in enumerate(self.recent)]
        recent = "\n\n".join(blocks)
        if len(recent) > max(budget, 0):  # one turn longer than the budget alone: its newest text is kept
            recent = "... (cut)\n" + recent[-max(budget, 0) :]
        return "\n\n".join([*parts, recent])

    def fold(self, complete: Callable[[list[dict[str, str]]], str], model: str | None, settings: Settings) -> None:
        """Write the new summary with one call of ``complete`` (the sub-LM, given chat messages); kept in
        ``folded``. Raises what the call raises."""
        pending = self.pending or []
        if not pending:
            return
        old = self.summary_text if self.summary is not None else None
        start = self.covered + 1
        share = max(MIN_TURN_CHARS, self.window.fold_chars // len(pending))
        blocks = []
        for number, turn in enumerate(pending, start):
            block = turn_block(number, turn)
            blocks.append(block if len(block) <= share else block[: share - 14] + " ... (cut)")
        last = start + len(pending) - 1
        prompt = []
        if old:
            prompt.append(f"Summary so far ({span(1, start - 1)}):\n{old}")
        prompt.append(f"Turns to add ({span(start, last)}):\n" + "\n\n".join(blocks))
        prompt.append(f"Write the new summary of {span(1, last)}.")
        words = max(50, self.window.summary_chars // 7)
        messages = [
            {"role": "system", "content": SUMMARY_INSTRUCTIONS.format(words=words)},
            {"role": "user", "content": "\n\n".join(prompt)},
        ]
        text = settings.redactor.text(complete(messages).strip())
        if not text:
            raise ValueError("the sub-model wrote an empty summary")
        if len(text) > self.window.summary_chars:
            text = text[: self.window.summary_chars - 12].rstrip() + " ... (cut)"
        covers = [*(self.summary.covers if self.summary is not None else []), *(t.turn_id for t in pending)]
        self.folded = NewSummary(text, covers, model)
        self.pending = []


def split(read: HistoryRead, window: Window) -> HistoryPlan:
    """Which of the turns seen are given whole (the newest that fit the window) and whether the stored
    summary still stands; ``pending_ids`` of the plan are then the older turns it does not cover."""
    if window.off or not read.seen:
        return HistoryPlan(window, read.seen if not window.off else [], [], None)
    blocks = [turn_block(len(read.seen) - len(read.recent) + i + 1, t) for i, t in enumerate(read.recent)]
    everything = len(read.seen) == len(read.recent) and len("\n\n".join(blocks)) <= window.chars
    if everything:
        return HistoryPlan(window, read.seen, list(read.recent), None)
    budget = window.chars - window.summary_chars
    kept, used = 0, 0
    for block in reversed(blocks):
        cost = len(block) + (2 if kept else 0)
        if kept and used + cost > budget:
            break
        kept, used = kept + 1, used + cost
    recent = list(read.recent[len(read.recent) - kept :])
    stored = read.summary
    stands = stored is not None and bool(stored.covers) and read.seen[: len(stored.covers)] == list(stored.covers)
    plan = HistoryPlan(window, read.seen, recent, stored if stands else None, stale=None if stands else stored)
    return plan


def pending_ids(plan: HistoryPlan) -> list[str]:
    """The older turns the summary does not cover, as many as one summarising call reads."""
    ids = plan.seen[plan.covered : plan.older]
    return ids[: max(1, plan.window.fold_chars // MIN_TURN_CHARS)]


async def plan(store: Store, read: HistoryRead, window: Window) -> HistoryPlan:
    """``split``, with the rows of the pending turns loaded."""
    planned = split(read, window)
    ids = pending_ids(planned)
    if ids:
        planned.pending = await store.turns_in_order(ids)
    return planned


async def plan_history(store: Store, session_id: str, settings: Settings) -> HistoryPlan:
    """What the session's next turn sees: its plan, before anything is folded (``%fleet history``, the API)."""
    window = await asyncio.to_thread(window_for, settings)
    read = await store.history_read(session_id, window=window.turns)
    return await plan(store, read, window)


def first_text(outputs: Any) -> str:
    """The text of a ``dspy.LM`` call's first output (a string, or a dict with ``text``)."""
    first = outputs[0] if isinstance(outputs, list | tuple) and outputs else outputs
    if isinstance(first, dict):
        return str(first.get("text") or "")
    return str(first or "")
