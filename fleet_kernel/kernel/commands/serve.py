"""``%fleet serve``: start the HTTP API on this kernel's store, as a process of its own."""

from __future__ import annotations

import asyncio
import subprocess

from fleet_kernel.errors import FleetError
from fleet_kernel.kernel.commands._base import Reply, command
from fleet_kernel.kernel.context import KernelContext


class Sidecar:
    """The API server this kernel started (one at most). Its own session: it keeps serving after the kernel exits."""

    process: subprocess.Popen[bytes] | None = None
    port: int = 0


@command("serve", "%fleet serve [port]", "start the HTTP API on this kernel's store", order=100)
async def cmd_serve(ctx: KernelContext, args: list[str]) -> Reply:
    from fleet_kernel.kernel.sidecar import spawn_sidecar  # subprocess plumbing only for %fleet serve

    settings = ctx.settings
    port = int(args[0]) if args and args[0].isdigit() else settings.policy.kernel.api_port
    if Sidecar.process is not None and Sidecar.process.poll() is None:
        return Reply(f"The API already runs at http://127.0.0.1:{Sidecar.port}/api (pid {Sidecar.process.pid}).")
    env = {"FLEET_HOME": str(settings.home), "FLEET_DATABASE_URL": settings.database_url}
    try:
        Sidecar.process = await asyncio.to_thread(spawn_sidecar, port, env=env, wait_s=15)
    except FleetError as exc:
        raise _serve_error(exc.message) from exc
    Sidecar.port = port
    pid = Sidecar.process.pid
    return Reply(
        f"The API serves this store at http://127.0.0.1:{port}/api (pid {pid}; it keeps serving after the kernel "
        f"exits, stop it with `kill {pid}`); log: {settings.logs_dir / f'api-{port}.log'}"
    )


def _serve_error(message: str) -> Exception:

    return FleetError(message, code="api_unavailable")
