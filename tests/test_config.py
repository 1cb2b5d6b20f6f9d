"""Tests for fleet_kernel.config: fleet.toml policy, environment values, and their errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fleet_kernel.config import home_dir, load_settings
from fleet_kernel.errors import ConfigError


def test_defaults_without_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    settings = load_settings({"FLEET_HOME": str(tmp_path)})
    assert settings.database_url == f"sqlite+aiosqlite:///{tmp_path}/fleet.db"
    assert settings.limits.max_iters == 20
    assert settings.lm_model is None
    assert settings.config_path is None


def test_file_policy_and_environment_wins(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text('[limits]\nmax_iters = 7\nexec_timeout_s = 5\n[sandbox]\nbackend = "pyodide"\nmemory_mb = 512\n')
    env = {"FLEET_CONFIG": str(path), "FLEET_HOME": str(tmp_path), "FLEET_SANDBOX": "unsafe-local"}
    settings = load_settings(env)
    assert settings.limits.max_iters == 7
    assert settings.limits.exec_timeout_s == 5
    assert settings.policy.sandbox.memory_mb == 512
    assert settings.sandbox == "unsafe-local"  # the environment wins over fleet.toml
    assert load_settings({**env, "FLEET_SANDBOX": ""}).sandbox == "pyodide"


def test_invalid_value_names_key_and_allowed_values(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text("[limits]\nmax_iters = 0\n")
    with pytest.raises(ConfigError) as info:
        load_settings({"FLEET_CONFIG": str(path), "FLEET_HOME": str(tmp_path)})
    assert "limits.max_iters" in info.value.message
    assert "greater than or equal to 1" in info.value.message


def test_unknown_key_and_bad_toml(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text("[limits]\nmax_iter = 3\n")
    with pytest.raises(ConfigError, match="limits.max_iter.*unknown key"):
        load_settings({"FLEET_CONFIG": str(path)})
    path.write_text("[limits\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings({"FLEET_CONFIG": str(path)})


def test_bad_environment_value_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({"FLEET_HOME": str(tmp_path), "FLEET_SANDBOX": "docker"})
    assert "FLEET_SANDBOX" in info.value.message
    assert "'local', 'pyodide', 'daytona' or 'unsafe-local'" in info.value.message


def test_home_defaults_to_dot_fleet_and_fleet_home_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert home_dir({}) == tmp_path / ".fleet" == load_settings({}).home
    assert home_dir({"FLEET_HOME": "~/state"}) == tmp_path / "state" == load_settings({"FLEET_HOME": "~/state"}).home
    monkeypatch.setenv("FLEET_HOME", str(tmp_path / "from-env"))
    assert home_dir() == tmp_path / "from-env"


def test_fleet_output_is_read_here_and_checked(tmp_path: Path) -> None:
    env = {"FLEET_HOME": str(tmp_path)}
    assert load_settings(env).output is None  # the kernel then uses [kernel] output
    assert load_settings({**env, "FLEET_OUTPUT": " Text "}).output == "text"
    with pytest.raises(ConfigError) as info:
        load_settings({**env, "FLEET_OUTPUT": "html"})
    assert "FLEET_OUTPUT" in info.value.message and "'rich' or 'text'" in info.value.message


def test_secrets_are_hidden_in_repr(tmp_path: Path) -> None:
    settings = load_settings({"FLEET_HOME": str(tmp_path), "FLEET_LM_API_KEY": "sk-very-secret"})
    assert "sk-very-secret" not in repr(settings)
    assert settings.secrets() == ["sk-very-secret"]


@pytest.mark.slow
def test_import_and_startup_make_no_network_calls(tmp_path: Path) -> None:
    """Importing Fleet, dspy and litellm and loading settings opens no socket to anything but loopback."""
    code = """
import socket
real = socket.socket.connect
def guard(self, address):
    host = address[0] if isinstance(address, tuple) else address
    if host not in ("127.0.0.1", "::1", "localhost") and not str(host).startswith("/"):
        raise SystemExit(f"network call to {address}")
    return real(self, address)
socket.socket.connect = guard
socket.create_connection = lambda *a, **k: (_ for _ in ()).throw(SystemExit(f"network call {a}"))
import fleet_kernel, fleet_kernel.config, fleet_kernel.engine, fleet_kernel.store
from fleet_kernel.engine import turn
import litellm
litellm.model_cost
fleet_kernel.config.load_settings({"FLEET_HOME": %r})
print("offline ok")
""" % str(tmp_path)  # noqa: UP031 - the snippet has f-strings of its own
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "offline ok" in result.stdout


def test_fleet_commands_load_the_engine_without_compiling_jsonschema_s_iri_grammar() -> None:
    """dspy imports jsonschema, which compiles a Lark grammar for the ``iri`` format (rfc3987_syntax, installed by
    Jupyter's extras) when it can: ~0.85 s of CPU in every ``fleet serve`` (and kernel, which skips it too) for a
    check nothing runs."""
    code = """
import sys
from click.testing import CliRunner
from fleet_api.cli import main
CliRunner().invoke(main, ["db", "--help"])  # the group runs, then a subcommand
import fleet_kernel.engine.turn
print(sys.modules.get("rfc3987_syntax"))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "None", result.stdout
