"""Tests for fleet_kernel.engine.sessions: what both front doors do with a session, over a real store on disk."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from scripted_lm import step

from fleet_kernel.config import Settings
from fleet_kernel.engine.sessions import Sessions
from fleet_kernel.errors import ConflictError, NotFoundError, PayloadTooLargeError


@pytest.fixture
def sessions(store, settings: Settings) -> Sessions:
    return Sessions(store, settings)


async def test_attach_never_overwrites_another_file_and_says_so(sessions: Sessions, settings: Settings) -> None:
    session = await sessions.create("attachments")
    first = await sessions.attach(session.session_id, "notes.txt", b"one")
    again = await sessions.attach(session.session_id, "notes.txt", b"one")
    other = await sessions.attach(session.session_id, "notes.txt", b"two", "text/plain; charset=utf-8")
    assert (first.attachment.path, first.renamed) == ("files/notes.txt", False)
    assert (again.attachment.path, again.renamed) == ("files/notes.txt", False)  # the same bytes: the same file
    assert (other.attachment.path, other.renamed) == ("files/notes-2.txt", True)
    assert other.attachment.mime == "text/plain" and other.attachment.filename == "notes.txt"
    files = settings.workspaces_dir / session.session_id / "files"
    assert (files / "notes.txt").read_bytes() == b"one" and (files / "notes-2.txt").read_bytes() == b"two"


async def test_a_name_made_safe_is_not_a_rename(sessions: Sessions) -> None:
    session = await sessions.create()
    attached = await sessions.attach(session.session_id, "../my report.csv", b"a,b\n")
    assert (attached.attachment.path, attached.renamed) == ("files/my_report.csv", False)
    assert attached.attachment.mime == "text/csv"


async def test_attach_refuses_too_large_files_and_unknown_sessions(
    sessions: Sessions, tmp_path: Path, settings: Settings
) -> None:
    session = await sessions.create()
    big = b"x" * (sessions.max_upload_bytes + 1)
    with pytest.raises(PayloadTooLargeError, match="storage.max_upload_mb"):
        await sessions.attach(session.session_id, "big.bin", big)
    (tmp_path / "big.bin").write_bytes(big)
    with pytest.raises(PayloadTooLargeError, match="big.bin is larger than storage.max_upload_mb"):
        await sessions.read_file(tmp_path / "big.bin")
    with pytest.raises(NotFoundError, match="no file"):
        await sessions.read_file(tmp_path / "missing.txt")
    with pytest.raises(NotFoundError):
        await sessions.attach("ses_unknown", "a.txt", b"a")
    assert not (settings.workspaces_dir / session.session_id / "files" / "big.bin").exists()


async def test_delete_removes_rows_workspace_and_says_which_turns_went(
    sessions: Sessions, runner, scripted_lm, settings: Settings
) -> None:
    session = await sessions.create("doomed")
    await sessions.attach(session.session_id, "a.txt", b"a")
    scripted_lm.add("*", [step("done", "SUBMIT(answer='ok')")])
    handle = await runner.start(session.session_id, "a task")
    async for _ in handle.events():
        pass
    kept = await sessions.create("kept")

    assert await sessions.delete(session.session_id) == (handle.turn_id,)

    assert not (settings.workspaces_dir / session.session_id).exists()
    with pytest.raises(NotFoundError):
        await sessions.get(session.session_id)
    with pytest.raises(NotFoundError):
        await sessions.delete(session.session_id)
    assert [s.session_id for s in await sessions.list()] == [kept.session_id]


async def test_a_session_with_a_running_turn_is_not_deleted(sessions: Sessions, runner, scripted_lm) -> None:
    session = await sessions.create()
    scripted_lm.add("*", [step("wait", "import time\ntime.sleep(30)"), step("done", "SUBMIT(answer='late')")])
    handle = await runner.start(session.session_id, "a slow task")
    try:
        with pytest.raises(ConflictError):
            await sessions.delete(session.session_id)
    finally:
        handle.cancel("test over")
        async for _ in handle.events():
            pass
    assert (await sessions.get(session.session_id)).session_id == session.session_id


async def test_export_is_a_notebook_named_after_the_session(
    sessions: Sessions, runner, scripted_lm, tmp_path: Path
) -> None:
    session = await sessions.create("Weekly report")
    scripted_lm.add("*", [step("done", "SUBMIT(answer='42')")])
    handle = await runner.start(session.session_id, "sum the numbers")
    async for _ in handle.events():
        pass
    await sessions.rename(session.session_id, "Weekly report, final")

    export = await sessions.export(session.session_id)

    assert export.filename.startswith("fleet-weekly-report-final-") and export.turns == 1
    written = export.write(tmp_path / "out")
    assert written == tmp_path / "out" / export.filename
    assert nbformat.read(written, as_version=4).cells[1].source == "sum the numbers"
    assert nbformat.reads(export.text(), as_version=4).metadata.kernelspec.name == "fleet"
    assert export.write(tmp_path / "named.ipynb") == tmp_path / "named.ipynb"
