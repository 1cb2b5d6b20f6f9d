"""What finishes a turn once its thread is done: the history summary it wrote, its artifacts collected
into the store, and the ending recorded with its one terminal event."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from fleet_kernel import safe_files
from fleet_kernel.config import Settings
from fleet_kernel.engine import choices as turn_choices
from fleet_kernel.engine.outcome import Outcome
from fleet_kernel.engine.running import CANCEL_GRACE_S, RunningTurn
from fleet_kernel.events import Artifact, EventData, TurnCancelledData, TurnCompleted, TurnFailed
from fleet_kernel.store import Store, TurnEnding
from fleet_kernel.workspace import Workspace, guess_mime

if TYPE_CHECKING:
    from fleet_kernel.engine.turn import TurnJob

log = logging.getLogger(__name__)


async def keep_summary(store: Store, running: RunningTurn, job: TurnJob) -> None:
    """Store the session's new history summary, when the turn wrote one (``compaction``), whatever its outcome."""
    folded = job.history_plan.folded if job.history_plan is not None else None
    if folded is None:
        return
    try:
        await store.put_history_summary(running.turn.session_id, folded.text, folded.covers, folded.model)
    except Exception:  # noqa: BLE001 - the turn is not the worse for it: the next one folds again
        log.exception("turn %s: its history summary could not be stored", running.turn.turn_id)


async def collect_artifacts(
    store: Store, settings: Settings, running: RunningTurn, job: TurnJob, *, cancelled: bool
) -> dict[str, dict[str, Any]]:
    """Files new or changed under ``artifacts/`` become artifact records and events; returns the
    references (``choices.artifact_ref``) of those collected, by workspace path.

    Sizes are checked before anything is read, each file is read and hashed through one descriptor
    opened without following links, and collection stops at the turn's deadline, or a grace period
    after it for a turn that was stopped (the token is spent by then: the outcome says why it ended).
    """
    turn = running.turn
    storage = settings.policy.storage
    max_bytes = int(storage.max_artifact_mb * 1024 * 1024)
    grace = time.monotonic() + CANCEL_GRACE_S
    deadline = grace if cancelled else max(running.started + running.settings.limits.turn_timeout_s, grace)

    def should_stop() -> bool:
        return time.monotonic() > deadline or running.late is not None

    workspace = Workspace(job.workspace)
    saved: dict[str, dict[str, Any]] = {}
    found = await asyncio.to_thread(workspace.files, "artifacts")
    if not found:  # most turns: no store read at all
        return saved
    known = await store.latest_artifact_digests(turn.session_id)
    added = 0
    for path, st in found:
        if added >= storage.max_artifacts_per_turn:
            break
        if should_stop():
            log.warning("turn %s: artifact collection stopped (deadline or cancellation)", turn.turn_id)
            break
        if st.st_size > max_bytes:
            log.warning(
                "turn %s: %s is %d bytes, over storage.max_artifact_mb; not collected",
                turn.turn_id,
                path,
                st.st_size,
            )
            continue
        try:
            changed = await asyncio.to_thread(
                workspace.read_if_changed, path, st, known.get(path), max_bytes=max_bytes, should_stop=should_stop
            )
        except safe_files.Refused as exc:
            log.warning("turn %s: artifact not collected: %s", turn.turn_id, exc)
            continue
        if changed is None:
            continue
        data, _ = changed
        row = await store.add_artifact(
            session_id=turn.session_id, turn_id=turn.turn_id, path=path, mime=guess_mime(path), data=data
        )
        added += 1
        running.emitter.emit(
            Artifact(artifact_id=row.artifact_id, path=row.path, mime=row.mime, size=row.size, sha256=row.sha256)
        )
        saved[row.path] = turn_choices.artifact_ref(row.artifact_id, row.path, row.mime, row.size, row.sha256)
    return saved


def with_artifact_refs(outcome: Outcome, job: TurnJob, saved: dict[str, dict[str, Any]]) -> Outcome:
    """A completed turn's result with its artifact paths (``"format": "artifact"`` in the output schema)
    replaced by references to the artifacts this turn saved there; failed when one names no such artifact."""
    schema = job.choices.output_schema
    if outcome.status != "completed" or schema is None or outcome.result is None:
        return outcome
    if not turn_choices.has_artifacts(schema):
        return outcome
    try:
        result = turn_choices.resolve_artifacts(schema, outcome.result, saved)
    except turn_choices.MissingArtifact as exc:
        error = {"type": "result_artifact_missing", "message": str(exc)}
        return Outcome("failed", error=error, usage=outcome.usage)
    return replace(outcome, result=result)


def terminal(running: RunningTurn, outcome: Outcome, duration_ms: float) -> tuple[EventData, TurnEnding]:
    """The turn's terminal event and the ending its row gets with it (what it used, against its budgets)."""
    usage = {"lm_calls": 0, "prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0, **outcome.usage}
    limits = running.settings.limits
    budgets = {"max_turn_tokens": limits.max_turn_tokens, "max_turn_cost_usd": limits.max_turn_cost_usd}
    # the row, committed with the terminal event, shows what the turn used against its budgets
    extraction = outcome.extraction_reason if outcome.status == "completed" and outcome.extracted else None
    ending = TurnEnding(
        outcome.status, outcome.answer, outcome.error, {**usage, "budgets": budgets}, outcome.result, extraction
    )
    data: EventData
    if outcome.status == "completed":
        data = TurnCompleted(
            answer=outcome.answer or "",
            usage=usage,
            duration_ms=round(duration_ms, 3),
            extracted=outcome.extracted,
            reason=extraction,
            result=outcome.result,
        )
    elif outcome.status == "cancelled":
        data = TurnCancelledData(reason=outcome.reason or running.reason)
    else:
        data = TurnFailed(error=outcome.error or {"type": "error", "message": "failed"})
    return data, ending
