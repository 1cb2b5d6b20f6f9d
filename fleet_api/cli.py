"""The ``fleet`` console script: ``fleet_kernel``'s commands plus ``fleet serve``, which runs this package's app."""

from __future__ import annotations

import click

from fleet_kernel.cli import friendly, main

__all__ = ["main"]


@main.command()
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to bind. The default accepts only connections from this machine; "
    "any other address requires FLEET_API_TOKEN.",
)
@click.option("--port", default=8000, show_default=True, type=int, help="Port to listen on.")
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Server processes on the one port, each a replica that runs the turns it accepts on the shared store: "
    "for a machine with more cores than one process uses (its turns share one GIL).",
)
@friendly
def serve(host: str, port: int, workers: int) -> None:
    """Run the HTTP API (sessions, turns, SSE) on the shared store."""
    from fleet_api.server import serve as run_server  # uvicorn and the app: only this command needs them

    run_server(host=host, port=port, workers=workers)


if __name__ == "__main__":
    main()
