"""Alembic, driven from code: ``fleet db upgrade`` and the SQLite first-use upgrade."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory


def migrations_dir() -> Path:
    """The Alembic environment: ``fleet_kernel/migrations`` in a wheel, ``migrations/`` in a checkout."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "migrations", here.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise FileNotFoundError("Fleet's Alembic migrations are missing from this installation; reinstall fleet-kernel")


def alembic_config(database_url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return cfg


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def upgrade(database_url: str) -> None:
    """Apply every migration up to head. Blocking: call it from a thread when a loop runs."""
    command.upgrade(alembic_config(database_url), "head")
