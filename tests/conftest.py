"""Shared fixtures: an isolated FLEET_HOME, a migrated store on disk, the scripted LM, a runner."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from homes import env_for, new_home
from scripted_lm import ScriptedLM

from fleet_kernel.config import Settings, load_settings
from fleet_kernel.lazy import skip_unused_imports

# The servers and turns tests run in this process skip what `fleet serve` and the kernel skip (and each worker's
# collection, which imports nbformat and so jsonschema, saves ~0.85 s of CPU).
skip_unused_imports()

# No test may reach a real provider or read the developer's own configuration.
# FLEET_TEST_DATABASE_URL (the PostgreSQL pass), FLEET_RLM_CLIENT_DIR (where fleet-rlm's client is installed,
# tests/api/test_fleet_rlm_client.py) and FLEET_FUZZ_EXAMPLES (cases per API fuzz test, 8 by default) are the
# tests' own settings, not Fleet's.
TEST_SETTINGS = ("FLEET_TEST_DATABASE_URL", "FLEET_RLM_CLIENT_DIR", "FLEET_FUZZ_EXAMPLES")
for _var in [v for v in os.environ if v.startswith(("FLEET_", "OPENAI_", "ANTHROPIC_", "DAYTONA_"))]:
    if _var not in TEST_SETTINGS:
        os.environ.pop(_var)
# Under pytest-xdist each worker has a PostgreSQL database of its own (scripts/test.sh makes fleet_test_gw0, ...),
# so one worker's migrations and sessions never meet another's.
if os.environ.get("FLEET_TEST_DATABASE_URL") and os.environ.get("PYTEST_XDIST_WORKER"):
    from sqlalchemy.engine import make_url

    _url = make_url(os.environ["FLEET_TEST_DATABASE_URL"])
    _url = _url.set(database=f"{_url.database}_{os.environ['PYTEST_XDIST_WORKER']}")
    os.environ["FLEET_TEST_DATABASE_URL"] = _url.render_as_string(hide_password=False)
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture(scope="session")
def migrated_store_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite store migrated to head once per test session: each test copies it instead of running Alembic."""
    from fleet_kernel.store import Store

    path = tmp_path_factory.mktemp("store-template") / "fleet.db"

    async def migrate() -> None:
        await (await Store.open(f"sqlite+aiosqlite:///{path}")).close()  # closing checkpoints the WAL into the file

    asyncio.run(migrate())
    return path


@pytest.fixture(scope="session", autouse=True)
def migrated_test_database() -> None:
    """The PostgreSQL pass: this worker's database is at head before any test, whichever runs first (a test that
    starts a server on a fresh database would otherwise race it through the migration)."""
    url = os.environ.get("FLEET_TEST_DATABASE_URL")
    if url:
        from fleet_kernel.store import migrate

        migrate.upgrade(url)


@pytest.fixture
def fleet_home(tmp_path: Path, migrated_store_file: Path) -> Path:
    """A private FLEET_HOME whose ``fleet.db`` is a fresh copy of the migrated template (on SQLite runs):
    the store fixture, servers and kernels opening it find it at head and skip the migration."""
    return new_home(tmp_path, migrated_store_file)


@pytest.fixture(scope="session")
def shared_scripted_lm() -> Iterator[ScriptedLM]:
    """One scripted LM server per pytest worker: starting and stopping one per test cost most of a second."""
    with ScriptedLM() as lm:
        yield lm


@pytest.fixture
def scripted_lm(shared_scripted_lm: ScriptedLM) -> ScriptedLM:
    """The worker's scripted LM with no script, request or setting left from an earlier test."""
    shared_scripted_lm.reset()
    return shared_scripted_lm


@pytest.fixture
def fleet_env(fleet_home: Path, scripted_lm: ScriptedLM) -> dict[str, str]:
    """Environment of a Fleet process wired to the scripted LM and a private home."""
    return env_for(fleet_home, scripted_lm)


@pytest.fixture
def settings(fleet_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Settings:
    monkeypatch.chdir(tmp_path)
    return load_settings(fleet_env)


@pytest.fixture
async def store(settings: Settings) -> AsyncIterator:
    from fleet_kernel.store import Store

    if not settings.database_url.startswith("sqlite"):
        from fleet_kernel.store import migrate

        await asyncio.to_thread(migrate.upgrade, settings.database_url)  # Alembic runs its own loop
    st = await Store.open(settings.database_url)
    yield st
    await st.close()


@pytest.fixture
async def runner(store, settings: Settings) -> AsyncIterator:
    from fleet_kernel.engine import TurnRunner

    r = await TurnRunner(store, settings).open()
    yield r
    await r.close()


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """An 8 MB tmpfs, a disk a test may fill without touching the machine's own (root only)."""
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("a full disk is made with a small tmpfs, which needs root to mount")
    mount = tmp_path / "small-disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def private_slots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temp dir of this test's own, so the machine-wide sandbox slots (``_slots``) are this test's alone.

    The process's pool is closed first: its thread finds the slot folder anew at each start, so a pool left
    running by an earlier test would take a slot in this test's folder. A fresh pool serves this test, and
    another fresh one the tests after it.
    """
    import shutil
    import tempfile

    from fleet_kernel.sandbox import pool

    # In the real temp dir, not under pytest's owner-only folder: root's sandboxes run as another uid, which
    # must reach the support folders made here (the sandbox probe's too).
    path = Path(tempfile.mkdtemp(prefix="fleet-test-slots-"))
    path.chmod(0o711)
    pool.POOL.close()
    pool.POOL = pool.Pool()
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    yield path
    pool.POOL.close()
    pool.POOL = pool.Pool()
    shutil.rmtree(path, ignore_errors=True)
