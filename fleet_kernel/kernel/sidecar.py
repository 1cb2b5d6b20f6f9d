"""The API as a process of its own: ``%fleet serve`` starts ``python -m fleet_api serve`` and waits until it answers.

The kernel never imports ``fleet_api`` (the API depends on the kernel package, not the other way round):
it knows the server only by its command line and its ``/api/health`` URL.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

from fleet_kernel import safe_files
from fleet_kernel.config import load_settings
from fleet_kernel.errors import ConfigError


def serve_command(host: str, port: int, workers: int = 1) -> list[str]:
    """``fleet serve`` as this interpreter runs it."""
    return [sys.executable, "-m", "fleet_api", "serve", "--host", host, "--port", str(port), "--workers", str(workers)]


def spawn_sidecar(
    port: int, *, host: str = "127.0.0.1", env: dict[str, str] | None = None, wait_s: float = 20.0, workers: int = 1
) -> subprocess.Popen[bytes]:
    """Start ``fleet serve`` as its own process (new session: it outlives its parent) and wait until it answers.

    Raises:
        ConfigError: it exited or did not answer ``/api/health`` within ``wait_s``.
    """
    settings = load_settings(env)
    log_path = settings.logs_dir / f"api-{port}.log"
    with safe_files.private_dirs(settings.home, [settings.logs_dir.name]) as logs:
        log_fd = safe_files.open_append(logs, f"api-{port}.log")
    with open(log_fd, "ab") as log:
        process = subprocess.Popen(  # noqa: S603 - fleet serve's fixed argv
            serve_command(host, port, workers),
            env={**os.environ, **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    probe = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)  # noqa: S104 - maps a wildcard to the loopback address to probe
    url = f"http://{'[' + probe + ']' if ':' in probe else probe}:{port}/api/health"
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ConfigError(f"the API exited with status {process.returncode}; see {log_path}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return process
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    process.terminate()
    raise ConfigError(f"the API did not answer on {url} within {wait_s:g} s")
