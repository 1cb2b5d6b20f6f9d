"""A FLEET_HOME for a test or a worker, and the environment that points a Fleet process at it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from scripted_lm import ScriptedLM


def new_home(folder: Path, template: Path) -> Path:
    """``folder/fleet-home`` with a fresh copy of the migrated template store (on SQLite runs), so whatever opens
    it finds it at head and skips the migration."""
    home = folder / "fleet-home"
    home.mkdir()
    if not os.environ.get("FLEET_TEST_DATABASE_URL"):
        shutil.copyfile(template, home / "fleet.db")
        (home / "fleet.db").chmod(0o600)
    return home


def env_for(home: Path, lm: ScriptedLM) -> dict[str, str]:
    """Environment of a Fleet process on ``home`` (or this worker's PostgreSQL database) and the scripted LM."""
    env = {"FLEET_HOME": str(home), **lm.env()}
    if os.environ.get("FLEET_TEST_DATABASE_URL"):
        env["FLEET_DATABASE_URL"] = os.environ["FLEET_TEST_DATABASE_URL"]
    return env
