"""The ``fleet`` command: parse, build, call. Domain errors become one readable line, never a traceback.

The API's own command, ``fleet serve``, is added by ``fleet_api.cli`` (the console script), so this
package never imports the API.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any

import click

from fleet_kernel import __version__
from fleet_kernel.errors import FleetError
from fleet_kernel.kernel.install import install
from fleet_kernel.lazy import skip_unused_imports
from fleet_kernel.telemetry.export import trace


def friendly(func: Callable[..., Any]) -> Callable[..., Any]:
    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except FleetError as exc:
            raise click.ClickException(exc.message) from exc

    return wrapper


@click.group()
@click.version_option(__version__, prog_name="fleet")
def main() -> None:
    """Fleet: recursive language models (dspy.RLM) from Jupyter, with a sandbox and a durable store."""
    skip_unused_imports()


@main.group()
def kernel() -> None:
    """The Jupyter kernel."""


@kernel.command("install")
@click.option("--user", "where", flag_value="user", help="Install for the current user.")
@click.option("--sys-prefix", "where", flag_value="sys-prefix", help="Install into this Python environment.")
@click.option("--prefix", type=click.Path(file_okay=False), help="Install under this prefix.")
@friendly
def kernel_install(where: str | None, prefix: str | None) -> None:
    """Install the "Fleet RLM" kernelspec so Jupyter can start it."""
    if where and prefix:
        raise click.UsageError("--user, --sys-prefix and --prefix are exclusive")
    path = install(user=where == "user", sys_prefix=where == "sys-prefix", prefix=prefix)
    click.echo(f"Installed the fleet kernelspec in {path}")


@main.group()
def db() -> None:
    """The store's schema."""


@db.command("upgrade")
@friendly
def db_upgrade() -> None:
    """Apply Alembic migrations to FLEET_DATABASE_URL."""
    # the settings and the store (SQLAlchemy, ~1 s): only this command needs them
    from fleet_kernel.config import load_settings
    from fleet_kernel.store import migrate  # Alembic (~0.3 s) only for `fleet db`

    settings = load_settings()
    if settings.database_url.startswith("sqlite"):
        settings.home.mkdir(parents=True, exist_ok=True)
    try:
        migrate.upgrade(settings.database_url)
    except Exception as exc:  # noqa: BLE001 - say what failed, in one line
        raise click.ClickException(f"upgrading {settings.database_url.split('@')[-1]} failed: {exc}") from exc
    click.echo(f"The store is at schema {migrate.head_revision()}.")


@main.command()
@click.argument(
    "target", required=False, type=click.Choice(["all", "lm", "sandbox", "store", "daytona"]), default="all"
)
def doctor(target: str) -> None:
    """Check the LM, the sandbox and the store; say what is wrong and how to fix it."""
    from fleet_kernel.doctor import run_checks  # the store and the checks: only this command needs them

    ok = asyncio.run(run_checks(target, echo=click.echo))
    sys.exit(0 if ok else 1)


@main.command("eval")
@click.argument("dataset", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--model", "models", multiple=True, help="A model to run every task on (repeat for more); default: FLEET_LM_MODEL."
)
@click.option("--repeat", default=1, show_default=True, type=int, help="Runs of each task on each model.")
@click.option("--concurrency", default=1, show_default=True, type=int, help="Runs at once.")
@click.option("--judge", "judge_model", help="The model that grades rubric tasks; default: FLEET_LM_MODEL.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), help="Folder for the results and report.")
@friendly
def eval_command(
    dataset: Path, models: tuple[str, ...], repeat: int, concurrency: int, judge_model: str | None, out: Path | None
) -> None:
    """Run every task of DATASET (.jsonl, .csv, .ipynb) on every model, each in a fresh session, and score it."""
    from fleet_kernel.evals.cli import run_eval  # the engine and the store: only this command needs them

    run_eval(dataset, list(models), repeat=repeat, concurrency=concurrency, judge_model=judge_model, out=out)


@main.command("optimize")
@click.argument("dataset", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--holdout", default=0.3, show_default=True, type=float, help="Fraction of tasks held out to decide.")
@click.option("--budget", default=20, show_default=True, type=int, help="Task runs GEPA may spend on training.")
@click.option("--reflection", "reflection_model", help="The model that proposes instructions; default: FLEET_LM_MODEL.")
@click.option("--judge", "judge_model", help="The model that grades rubric tasks; default: FLEET_LM_MODEL.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the split and of GEPA.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), help="Folder of the instruction versions.")
@friendly
def optimize_command(dataset: Path, **options: Any) -> None:
    """Evolve the RLM's instructions with GEPA on DATASET; adopt them only if they score better on held-out tasks."""
    from fleet_kernel.evals.cli import run_optimize  # the engine, dspy and gepa: only this command needs them

    run_optimize(dataset, **options)


main.add_command(trace)

if __name__ == "__main__":
    main()
