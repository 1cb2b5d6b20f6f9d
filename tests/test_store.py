"""Tests for fleet_kernel.store.Store: the repository API on a real database (SQLite, or PostgreSQL)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest

from fleet_kernel.errors import ConflictError, NotFoundError, StoreUnavailableError, ValidationError
from fleet_kernel.events import make_event
from fleet_kernel.store import EndedTurn, Store, TurnEnding, migrate


def _events(session_id: str, turn_id: str, seqs: range) -> list:
    return [
        make_event("output", {"iteration": 1, "stream": "stdout", "text": f"line {i}\n"}, seq=i,
                   session_id=session_id, turn_id=turn_id)
        for i in seqs
    ]  # fmt: skip


async def test_sessions_crud(store: Store) -> None:
    created = await store.create_session("first")
    assert (await store.get_session(created.session_id)).title == "first"
    renamed = await store.rename_session(created.session_id, "renamed")
    assert renamed.title == "renamed"
    assert created.session_id in [s.session_id for s in await store.list_sessions()]
    await store.delete_session(created.session_id)
    with pytest.raises(NotFoundError):
        await store.get_session(created.session_id)


async def test_claim_turn_idempotency_and_busy(store: Store) -> None:
    ses = await store.create_session()
    turn, created = await store.claim_turn(ses.session_id, "count rows", idempotency_key="k1")
    assert created and turn.status == "running" and turn.position == 1
    again, created_again = await store.claim_turn(ses.session_id, "count rows", idempotency_key="k1")
    assert not created_again and again.turn_id == turn.turn_id
    with pytest.raises(ValidationError):
        await store.claim_turn(ses.session_id, "another task", idempotency_key="k1")
    with pytest.raises(ConflictError) as busy:
        await store.claim_turn(ses.session_id, "second turn")
    assert busy.value.turn_id == turn.turn_id
    with pytest.raises(ConflictError):
        await store.delete_session(ses.session_id)
    await store.finish_turn(turn.turn_id, "completed", answer="42")
    second, _ = await store.claim_turn(ses.session_id, "second turn")
    assert second.position == 2
    assert (await store.get_session(ses.session_id)).title == "count rows"


async def test_a_terminal_event_and_its_turn_s_ending_are_one_commit(store: Store) -> None:
    ses = await store.create_session()
    turn, _ = await store.claim_turn(ses.session_id, "t")
    before = (await store.get_session(ses.session_id)).updated_at
    done = make_event("turn.completed", {"answer": "42", "usage": {}, "duration_ms": 1.0, "result": {"n": [1, None]}},
                      seq=1, session_id=ses.session_id, turn_id=turn.turn_id)  # fmt: skip
    usage = {"lm_calls": 1, "budgets": {"max_turn_tokens": None}}
    ending = TurnEnding("completed", "42", None, usage, {"n": [1, None]})
    await store.append_events([done], {turn.turn_id: ending})
    row = await store.get_turn(turn.turn_id)
    assert (row.status, row.answer, row.error, row.usage, row.result) == (
        "completed",
        "42",
        None,
        usage,
        {"n": [1, None]},
    )
    assert row.last_seq == 1 and row.finished_at is not None and row.finished_at >= row.started_at
    assert (await store.get_session(ses.session_id)).updated_at == row.finished_at > before
    # an ended turn is never ended again (a late or repeated ending changes nothing)
    await store.append_events([], {turn.turn_id: TurnEnding("failed", error={"type": "x", "message": "late"})})
    assert (await store.get_turn(turn.turn_id)).status == "completed"
    await store.finish_turn(turn.turn_id, "cancelled")
    assert (await store.get_turn(turn.turn_id)).error is None


async def test_concurrent_claims_run_once(store: Store) -> None:
    ses = await store.create_session()
    results = await asyncio.gather(
        *(store.claim_turn(ses.session_id, "same", idempotency_key="dup") for _ in range(8)), return_exceptions=True
    )
    claims = [r for r in results if not isinstance(r, BaseException)]
    assert sum(1 for _, created in claims if created) == 1
    assert len({turn.turn_id for turn, _ in claims}) == 1


async def test_events_replay_from_any_seq(store: Store) -> None:
    ses = await store.create_session()
    turn, _ = await store.claim_turn(ses.session_id, "t")
    await store.append_events(_events(ses.session_id, turn.turn_id, range(1, 11)))
    assert [e.seq for e in await store.events_after(turn.turn_id, 4)] == list(range(5, 11))
    assert (await store.get_turn(turn.turn_id)).last_seq == 10


async def test_commits_of_events_wake_listeners_in_other_processes(store: Store) -> None:
    # PostgreSQL notifies listeners of each commit (readers in other processes need not poll); SQLite cannot.
    writer = await Store.open(store.url)
    woke = asyncio.Event()
    try:
        async with store.event_notifications(woke.set) as notified:
            assert notified is not store.sqlite
            ses = await writer.create_session()
            turn, _ = await writer.claim_turn(ses.session_id, "t")
            assert not woke.is_set()
            await writer.append_events(_events(ses.session_id, turn.turn_id, [1]))
            if notified:
                await asyncio.wait_for(woke.wait(), 5)
    finally:
        await writer.close()


async def test_cancellation_states(store: Store) -> None:
    ses = await store.create_session()
    turn, _ = await store.claim_turn(ses.session_id, "t")
    assert (await store.request_cancel(turn.run_id))[1] == "requested"
    assert (await store.request_cancel(turn.run_id))[1] == "already_requested"
    assert await store.cancel_requests([turn.turn_id]) == {turn.turn_id: "cancelled by request"}
    await store.finish_turn(turn.turn_id, "cancelled")
    assert (await store.request_cancel(turn.run_id))[1] == "already_terminal"
    with pytest.raises(NotFoundError):
        await store.request_cancel("run_unknown")


async def test_stale_turn_is_interrupted_with_a_terminal_event(store: Store) -> None:
    ses = await store.create_session()
    turn, _ = await store.claim_turn(ses.session_id, "t")
    await store.append_events(_events(ses.session_id, turn.turn_id, range(1, 4)))
    assert await store.reap_stale_turns() == []  # fresh heartbeat
    reaped = [t for t in await store.reap_stale_turns(timedelta(seconds=-1)) if t.session_id == ses.session_id]
    row = await store.get_turn(turn.turn_id)
    assert row.status == "interrupted" and "stopped before it finished" in row.error["message"]
    # The store writes no event: its caller emits the terminal one, at the seq after the last stored.
    assert reaped == [EndedTurn(turn.turn_id, ses.session_id, 4, row.error)]
    assert [e.seq for e in await store.events_after(turn.turn_id)] == [1, 2, 3]
    assert turn.turn_id not in [t.turn_id for t in await store.reap_stale_turns(timedelta(seconds=-1))]  # once


async def test_blobs_attachments_artifacts(store: Store) -> None:
    ses = await store.create_session()
    turn, _ = await store.claim_turn(ses.session_id, "t")
    att = await store.add_attachment(session_id=ses.session_id, filename="a.txt", path="files/a.txt",
                                     mime="text/plain", data=b"hello")  # fmt: skip
    assert (await store.get_attachment(att.attachment_id)).size == 5
    art = await store.add_artifact(session_id=ses.session_id, turn_id=turn.turn_id, path="artifacts/p.png",
                                   mime="image/png", data=b"\x89PNG")  # fmt: skip
    assert await store.get_blob(art.sha256) == b"\x89PNG"
    assert await store.latest_artifact_digests(ses.session_id) == {"artifacts/p.png": art.sha256}
    await store.finish_turn(turn.turn_id, "completed")
    await store.delete_session(ses.session_id)
    with pytest.raises(NotFoundError):
        await store.get_artifact(art.artifact_id)


async def test_unmigrated_non_sqlite_store_says_run_upgrade() -> None:
    url = os.environ.get("FLEET_TEST_DATABASE_URL")
    if not url:
        pytest.skip("needs FLEET_TEST_DATABASE_URL (PostgreSQL)")
    empty = url.rsplit("/", 1)[0] + "/postgres"
    with pytest.raises(StoreUnavailableError, match="fleet db upgrade"):
        await Store.open(empty)


async def test_unreachable_store_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(StoreUnavailableError, match="cannot"):
        await Store.open("postgresql+asyncpg://nobody:x@127.0.0.1:1/none")


@pytest.mark.parametrize("open_store", ["Store.open", "fleet db upgrade"])
async def test_a_postgresql_store_without_its_driver_names_the_extra(
    open_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """asyncpg is the `postgres` extra, not a dependency: without it the store says what to install."""
    monkeypatch.setitem(sys.modules, "asyncpg", None)  # `import asyncpg` now fails, as where it is not installed
    url = "postgresql+asyncpg://fleet:secret@127.0.0.1:1/fleet"
    with pytest.raises(StoreUnavailableError) as caught:
        await (Store.open(url) if open_store == "Store.open" else asyncio.to_thread(migrate.upgrade, url))
    assert "pip install 'fleet-kernel[postgres]'" in str(caught.value)
    assert "secret" not in str(caught.value)


@pytest.mark.slow
def test_processes_opening_a_new_sqlite_store_at_once_all_get_it(tmp_path: Path) -> None:
    """A kernel and its sidecar open a fresh store together: each must find it created, none may fail."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'fresh.db'}"
    code = (
        "import asyncio, sys\nfrom fleet_kernel.store import Store\n"
        "async def main():\n    await (await Store.open(sys.argv[1])).close()\nasyncio.run(main())"
    )
    openers = [subprocess.Popen([sys.executable, "-c", code, url], stderr=subprocess.PIPE, text=True)
               for _ in range(4)]  # fmt: skip
    errors = [p.communicate(timeout=120)[1] for p in openers]
    assert [p.returncode for p in openers] == [0] * 4, "\n".join(errors)


WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from fleet_kernel.events import make_event
    from fleet_kernel.store import Store

    async def main(url, session_id, turn_id, count):
        store = await Store.open(url)
        for seq in range(1, count + 1):
            event = make_event("output", {"iteration": 1, "stream": "stdout", "text": "x" * 200}, seq=seq,
                               session_id=session_id, turn_id=turn_id)
            await store.append_events([event])
        await store.close()

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
    """
)


@pytest.mark.slow
async def test_three_processes_write_at_once_without_locks_or_loss(store: Store, tmp_path: Path) -> None:
    sessions = [await store.create_session() for _ in range(3)]
    turns = [(await store.claim_turn(s.session_id, "t"))[0] for s in sessions]
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    count = 300
    procs = [
        await asyncio.to_thread(
            subprocess.Popen,
            [sys.executable, str(script), store.url, t.session_id, t.turn_id, str(count)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for t in turns
    ]
    for proc in procs:
        _, err = await asyncio.to_thread(proc.communicate, timeout=120)
        assert proc.returncode == 0, err[-2000:]
        assert "locked" not in err
    for turn in turns:
        assert await store.count_events(turn.turn_id) == count


CANCELLER = textwrap.dedent(
    """
    import asyncio, sys
    from fleet_kernel.store import Store

    async def main(url):
        store = await Store.open(url)
        await store.create_session()

        async def reader():
            while True:
                await store.list_sessions()

        for i in range(1200):  # the hang needs a rare interleaving: try many
            task = asyncio.create_task(reader())
            await asyncio.sleep(0.001 * (i % 3))
            task.cancel()  # a client goes away mid-query...
            for _ in range(i % 4):
                await asyncio.sleep(0)
            task.cancel()  # ...and its server shuts down while the query is being cleaned up
            await asyncio.wait([task])
        await store.close()

    asyncio.run(main(sys.argv[1]))
    print("shut down")
    """
)


@pytest.mark.slow
async def test_callers_cancelled_mid_query_do_not_hang_shutdown(store: Store, tmp_path: Path) -> None:
    # An SSE client that goes away cancels its reader in the middle of a query; the process must still exit.
    # (Without the store's ``uninterrupted`` guard this hangs in most runs: aiosqlite 0.22 under SQLAlchemy 2.1.)
    script = tmp_path / "canceller.py"
    script.write_text(CANCELLER)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), store.url, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    except TimeoutError:
        proc.kill()
        pytest.fail("the event loop never shut down after callers were cancelled mid-query")
    assert proc.returncode == 0 and out.decode().strip() == "shut down", err.decode()[-2000:]


def test_the_head_read_from_the_scripts_is_alembic_s_and_opening_a_store_leaves_alembic_unloaded(
    tmp_path: Path,
) -> None:
    from alembic.script import ScriptDirectory

    assert (
        migrate.head_revision() == ScriptDirectory.from_config(migrate.alembic_config("sqlite://")).get_current_head()
    )
    # a store at head opens without Alembic (a fresh process, so nothing else has loaded it)
    url = f"sqlite+aiosqlite:///{tmp_path / 'fleet.db'}"
    asyncio.run(_open_and_close(url))  # creates and upgrades: Alembic is needed here
    probe = textwrap.dedent(
        f"""
        import asyncio, sys
        from fleet_kernel.store import Store

        async def main():
            store = await Store.open({url!r})
            await store.close()

        asyncio.run(main())
        print("alembic" in sys.modules)
        """
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False", done.stderr


def test_revision_lines_read_merges_and_leave_computed_revisions_to_alembic(tmp_path: Path) -> None:
    merge = tmp_path / "0009_merge.py"
    merge.write_text('revision = "0009"\ndown_revision = ("0008a", "0008b")\nbranch_labels = None\n')
    assert migrate._revision_lines(merge) == ("0009", ("0008a", "0008b"))
    first = tmp_path / "0001.py"
    first.write_text('revision: str = "0001"\ndown_revision = None\n')
    assert migrate._revision_lines(first) == ("0001", ())
    computed = tmp_path / "0010.py"
    computed.write_text('import os\nrevision = os.environ.get("REV", "0010")\ndown_revision = "0009"\n')
    assert migrate._revision_lines(computed) is None


async def _open_and_close(url: str) -> None:
    store = await Store.open(url)
    await store.close()


async def test_a_second_open_in_one_process_keeps_the_first_s_sqlite_locks(store: Store) -> None:
    """Closing any descriptor of a file drops every POSIX lock the process holds on it. SQLite holds a shared lock
    on its -shm file while a connection is open; a process that lost it lets the next process take the file for
    its first user and rebuild the shared index under the open connection (a "disk I/O error", or commits that
    another process does not see). Opening the store again, as a second ``Store`` in the same process does, must
    leave those locks alone."""
    if not store.sqlite:
        pytest.skip("SQLite's own file locks")
    await store.create_session("held open")  # a connection is open, with the WAL and its shared index
    shm = f"{store.sqlite_file}-shm"
    dms = 128  # SQLite's "dead man switch" byte of the -shm file: shared-locked by every process using it
    probe = textwrap.dedent(f"""
        import fcntl, os, sys
        fd = os.open({shm!r}, os.O_RDWR)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, {dms})
        except OSError:
            sys.exit(0)  # held: another process uses the file
        sys.exit(1)
    """)

    def held() -> bool:
        return subprocess.run([sys.executable, "-c", probe], check=False).returncode == 0

    assert await asyncio.to_thread(held), "no lock even before"
    await (await Store.open(store.url)).close()
    assert await asyncio.to_thread(held), "the second open dropped the first connection's lock on the -shm file"
