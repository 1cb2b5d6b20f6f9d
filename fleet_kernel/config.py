"""Configuration: non-secret policy from ``fleet.toml``, secrets and deployment values from the environment.

Precedence: environment > ``fleet.toml`` (``$FLEET_CONFIG``, else ``./fleet.toml``) > built-in defaults.
Every policy key is declared once below, with its default and bounds; an invalid file or value raises
``ConfigError`` naming the key and what is allowed.
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic import ValidationError as PydanticValidationError
from pydantic_core import PydanticCustomError

from fleet_kernel import ownership, sandbox_registry
from fleet_kernel.errors import ConfigError, ValidationError
from fleet_kernel.redact import Redactor, env_secrets
from fleet_kernel.tool_config import MCP, ToolSource, referenced_secrets


def _registered_sandbox(name: str) -> str:
    """A sandbox name must be registered (``fleet_kernel.sandbox_registry``, read when a value is checked)."""
    known = sandbox_registry.names()
    if name not in known:
        expected = " or ".join(filter(None, (", ".join(map(repr, known[:-1])), repr(known[-1]))))
        raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected})
    return name


SandboxName = Annotated[str, AfterValidator(_registered_sandbox)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Limits(_Section):
    """Bounds on one turn."""

    max_iters: int = Field(20, ge=1, le=500, description="RLM iterations per turn")
    max_llm_calls: int = Field(50, ge=0, le=10_000, description="sub-LM calls (llm_query*) per turn")
    turn_timeout_s: float = Field(900, gt=0, le=86_400, description="deadline for a whole turn")
    exec_timeout_s: float = Field(60, gt=0, le=3_600, description="deadline for one code execution")
    max_output_chars: int = Field(10_000, ge=100, le=1_000_000, description="REPL output shown to the model")
    max_depth: int = Field(2, ge=0, le=8, description="nesting depth of child RLMs")
    max_children: int = Field(8, ge=0, le=100, description="child RLMs per turn")
    max_turn_tokens: int = Field(
        2_000_000, ge=1, le=10_000_000_000, description="prompt plus completion tokens over all LM calls of a turn"
    )
    max_turn_cost_usd: float | None = Field(None, gt=0, le=1_000_000, description="LM cost of a turn; none: no cap")
    max_errors: int | None = Field(
        5, ge=1, le=500, description="steps in a row whose code fails before the turn stops; none: no limit"
    )

    def lowered(self, overrides: Mapping[str, Any]) -> Limits:
        """These limits with one turn's ``overrides``, none above what this policy allows.

        Raises:
            ValidationError: an unknown limit, an invalid value, or one above the policy.
        """
        try:
            merged = Limits.model_validate({**self.model_dump(), **overrides})
        except PydanticValidationError as exc:
            raise ValidationError(_format_validation_error("limits", exc)) from exc
        for name in overrides:
            allowed, value = getattr(self, name), getattr(merged, name)
            if allowed is not None and (value is None or value > allowed):
                raise ValidationError(
                    f"limits.{name} may be at most {allowed} for a turn (the fleet.toml policy); got {value}"
                )
        return merged


class LMPolicy(_Section):
    """What each LM request may ask for."""

    max_tokens: int = Field(4096, ge=1, le=1_000_000, description="completion cap sent with every root LM call")
    sub_max_tokens: int | None = Field(
        None, ge=1, le=1_000_000, description="the cap for llm_query and child RLM calls; default max_tokens"
    )
    allowed_models: tuple[str, ...] | None = Field(
        None,
        description="patterns (fnmatch) of the models a session may switch to; default: the configured models' "
        "providers (openai/*, ...)",
    )
    cassettes_dir: Path | None = Field(
        None, description="the folder replay/<file> models of a session are read from; default $FLEET_HOME/cassettes"
    )
    request_timeout_s: float = Field(
        120, gt=0, le=3_600, description="how long one LM request may wait for the model server"
    )
    sub_request_timeout_s: float | None = Field(
        None, gt=0, le=3_600, description="the same for llm_query and child RLM calls; default request_timeout_s"
    )
    num_retries: int = Field(
        2,
        ge=0,
        le=10,
        description="times one root LM request is sent again after a transient provider error (429, 5xx, a "
        "timeout or a dropped connection), with exponential backoff; each attempt counts as an LM call in the "
        "turn's budget",
    )
    sub_num_retries: int | None = Field(None, ge=0, le=10, description="the same for sub calls; default num_retries")
    temperature: float | None = Field(
        None, ge=0, le=2, description="sampling temperature sent with every root LM call; default: the provider's"
    )
    sub_temperature: float | None = Field(
        None, ge=0, le=2, description="the same for llm_query and child RLM calls; default temperature"
    )
    replay_pace: Literal["recorded", "at_once"] = Field(
        "recorded",
        description="a replay/<cassette> model streams each reply at the pace it was recorded (each pause at most "
        "0.5 s), or at once",
    )
    stream: bool = Field(
        True,
        description="ask for each turn's LM replies as streams, so watchers see the tokens as they arrive "
        "(lm.delta); false: whole replies",
    )
    instructions: Path | None = Field(
        None,
        description="a file whose text replaces the built-in task instructions of every turn's RLM (fleet optimize "
        "writes them); default: the built-in ones",
    )
    context_tokens: int | None = Field(
        None,
        ge=512,
        le=100_000_000,
        description="the root model's context length in tokens, which sizes a turn's history; default: what "
        "LiteLLM knows of the model, else [history] max_chars alone",
    )

    @property
    def sub_cap(self) -> int:
        return self.sub_max_tokens or self.max_tokens

    def for_role(self, role: Literal["root", "sub"]) -> tuple[int, float, int, float | None]:
        """``(max_tokens, request_timeout_s, num_retries, temperature)`` of the root or the sub model's calls."""
        if role == "root":
            return self.max_tokens, self.request_timeout_s, self.num_retries, self.temperature
        return (
            self.sub_cap,
            self.sub_request_timeout_s or self.request_timeout_s,
            self.num_retries if self.sub_num_retries is None else self.sub_num_retries,
            self.temperature if self.sub_temperature is None else self.sub_temperature,
        )


class SandboxLimits(_Section):
    """What model-written code may consume."""

    backend: SandboxName | None = Field(None, description="sandbox; default local, else pyodide")
    memory_mb: int = Field(1024, ge=64, le=65_536)
    cpu_seconds: int = Field(300, ge=1, le=86_400, description="CPU time per sandbox process")
    cpu_cores: float = Field(1.0, gt=0, le=1024, description="cores the local sandbox may keep busy at once")
    max_processes: int = Field(64, ge=1, le=4096)
    max_file_mb: int = Field(256, ge=1, le=65_536, description="largest file code may write")
    max_output_bytes: int = Field(1_000_000, ge=1_000, le=100_000_000, description="captured output per execution")
    workspace_mb: int = Field(1024, ge=1, le=1_048_576, description="size of a session workspace")
    workspace_files: int = Field(100_000, ge=16, le=10_000_000, description="files and folders in a workspace")
    pool_size: int | None = Field(None, ge=0, le=256, description="pre-started local sandboxes; default: cores, <= 4")
    idle_stop_s: float = Field(600, ge=0, description="stop a sandbox that runs no code this long (0: never)")
    max_sandboxes: int | None = Field(
        None, ge=1, le=4096, description="local sandboxes at once on this machine (this user); default: RAM / memory_mb"
    )
    packages: tuple[str, ...] = Field(
        (),
        max_length=100,
        description="more importable packages the model is told about (local sandboxes: those the host can import)",
    )

    @field_validator("packages")
    @classmethod
    def _package_names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        bad = [name for name in names if not name.isidentifier()]
        if bad:
            raise ValueError(f"packages are import names such as 'polars' (no versions or dots); got {bad}")
        return names

    @property
    def pool(self) -> int:
        """Pre-started sandboxes to keep: ``pool_size``, else one per core up to 4 (each idles at ~29 MB RSS)."""
        return self.pool_size if self.pool_size is not None else min(4, os.cpu_count() or 1)

    @property
    def sandbox_cap(self) -> int:
        """``max_sandboxes``, else as many as the machine's memory holds at ``memory_mb`` each (at least 1)."""
        if self.max_sandboxes is not None:
            return self.max_sandboxes
        try:
            total_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
        except (ValueError, OSError):  # not every platform names these
            return 4
        return max(1, total_mb // self.memory_mb)


class History(_Section):
    """How much of a session's past turns feeds the next one."""

    window_turns: int = Field(8, ge=0, le=200, description="the latest turns given whole; older ones are summarised")
    max_chars: int = Field(16_000, ge=0, le=1_000_000, description="the history's characters, summary included")


class Storage(_Section):
    max_upload_mb: float = Field(25, gt=0, le=10_240)
    max_artifacts_per_turn: int = Field(50, ge=0, le=10_000)
    max_artifact_mb: float = Field(25, gt=0, le=10_240)


class Memory(_Section):
    """The memories a session's model keeps with ``remember`` (see docs/configuration.md)."""

    max_chars: int = Field(4_000, ge=16, le=1_000_000, description="characters in one memory")
    max_count: int = Field(500, ge=1, le=1_000_000, description="memories in one session")


class Skills(_Section):
    """Skill cards (see docs/kernel.md, Skills)."""

    project: bool = Field(
        False,
        description="use the cards of ./.fleet/skills in every folder without %fleet skill trust (only for "
        "folders whose files you vet)",
    )


OutputMode = Literal["rich", "text"]


class Kernel(_Section):
    output: OutputMode = "rich"
    serve_api: bool = Field(False, description="start the API sidecar with the kernel")
    api_port: int = Field(8000, ge=1, le=65_535)
    max_input_mb: float = Field(256, gt=0, le=4_096, description="all %%fleet --in values of one turn, as sent")


class Policy(_Section):
    """The whole of ``fleet.toml``."""

    limits: Limits = Limits()
    lm: LMPolicy = LMPolicy()
    sandbox: SandboxLimits = SandboxLimits()
    history: History = History()
    storage: Storage = Storage()
    memory: Memory = Memory()
    kernel: Kernel = Kernel()
    skills: Skills = Skills()
    tools: tuple[ToolSource, ...] = ()
    mcp: MCP = MCP()


# Environment variables (DESIGN.md Part 2) and the Settings attribute each one sets.
ENV_VARS: dict[str, str] = {
    "FLEET_HOME": "home",
    "FLEET_DATABASE_URL": "database_url",
    "FLEET_LM_MODEL": "lm_model",
    "FLEET_LM_BASE_URL": "lm_base_url",
    "FLEET_LM_API_KEY": "lm_api_key",
    "FLEET_SUB_LM_MODEL": "sub_lm_model",
    "FLEET_SANDBOX": "sandbox",
    "FLEET_DAYTONA_API_KEY": "daytona_api_key",
    "FLEET_DAYTONA_API_URL": "daytona_api_url",
    "FLEET_API_TOKEN": "api_token",
    "FLEET_ALLOWED_HOSTS": "allowed_hosts",
    "FLEET_LM_RECORD": "lm_record",
    "FLEET_OUTPUT": "output",
    "FLEET_TRACE_CONTENT": "trace_content",
}
# The OpenTelemetry SDK's own variables: Fleet only checks whether traces are switched on.
OTEL_ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_HOST_NAME = re.compile(r"[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*")


def canonical_host(value: str) -> str | None:
    """A host name or IP literal as the API compares them (lowercase, no brackets, no trailing dot),
    or None when ``value`` is not one (a scheme, port, path or stray character)."""
    host = value.strip().lower().removesuffix(".")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if ":" in host:
        try:
            address = ipaddress.IPv6Address(host)
        except ValueError:
            return None
        return str(address.ipv4_mapped or address)  # a dual-stack socket's IPv4 peer, as itself
    return host if _HOST_NAME.fullmatch(host) else None


class Settings(BaseModel):
    """Everything a Fleet process needs to know, resolved once at start-up."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    home: Path
    database_url: str
    lm_model: str | None = None
    lm_base_url: str | None = None
    lm_api_key: SecretStr | None = None
    sub_lm_model: str | None = None
    sandbox: SandboxName | None = None
    daytona_api_key: SecretStr | None = None
    daytona_api_url: str | None = None
    api_token: SecretStr | None = None
    allowed_hosts: tuple[str, ...] = ()
    lm_record: Path | None = None
    output: OutputMode | None = None
    """``FLEET_OUTPUT``: how this kernel shows turns, chosen for it (``[kernel] output`` is the default)."""
    trace_content: bool = False
    """``FLEET_TRACE_CONTENT=1``: traces carry the task, reasoning, code, outputs and answers."""
    tracing: bool = False
    """An OTLP traces endpoint is set (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``)
    and ``OTEL_SDK_DISABLED`` is not true; the OpenTelemetry SDK reads those variables itself."""
    policy: Policy = Policy()
    config_path: Path | None = None
    configured_models: tuple[str, ...] = ()
    """The models the operator configured (``FLEET_LM_MODEL``, ``FLEET_SUB_LM_MODEL``), kept when a session or
    ``%fleet model`` chooses another: they are always allowed, and their providers are by default."""
    provider_keys: tuple[SecretStr, ...] = ()
    """The key variables dspy/LiteLLM and provider SDKs read themselves (``OPENAI_API_KEY``, ...;
    ``redact.SECRET_VAR``): scrubbed like Fleet's own."""

    @model_validator(mode="before")
    @classmethod
    def _remember_models(cls, values: Any) -> Any:
        if isinstance(values, dict) and "configured_models" not in values:
            models = (values.get("lm_model"), values.get("sub_lm_model"))
            values = {**values, "configured_models": tuple(m for m in models if m)}
        return values

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _split_hosts(cls, value: object) -> object:
        """``FLEET_ALLOWED_HOSTS`` is comma separated; each entry must be a bare host name or IP."""
        entries = value.split(",") if isinstance(value, str) else value
        if not isinstance(entries, list | tuple):
            return value
        hosts = []
        for entry in (str(e) for e in entries if str(e).strip()):
            host = canonical_host(entry)
            if host is None:
                raise ValueError(
                    f"{entry.strip()!r} is not a host name: list names such as fleet.example.com, "
                    "comma separated, without scheme, port or path"
                )
            hosts.append(host)
        return tuple(hosts)

    @field_validator("output", mode="before")
    @classmethod
    def _lower_output(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @property
    def limits(self) -> Limits:
        return self.policy.limits

    def for_turn(self, limits: Mapping[str, Any] | None) -> Settings:
        """These settings with one turn's limits lowered (see ``Limits.lowered``); unchanged without any."""
        if not limits:
            return self
        policy = self.policy.model_copy(update={"limits": self.limits.lowered(limits)})
        return self.model_copy(update={"policy": policy})

    @cached_property
    def workspaces_dir(self) -> Path:
        return self.home / "workspaces"

    @cached_property
    def logs_dir(self) -> Path:
        return self.home / "logs"

    @property
    def cassettes_dir(self) -> Path:
        """Where a session's ``replay/<file>`` models are read from (``[lm] cassettes_dir``)."""
        folder = self.policy.lm.cassettes_dir
        return folder.expanduser().absolute() if folder is not None else self.home / "cassettes"

    def secrets(self) -> list[str]:
        """Every secret value in force, so outputs can be scrubbed of them."""
        keys = (self.lm_api_key, self.daytona_api_key, self.api_token, *self.provider_keys)
        values = dict.fromkeys(s.get_secret_value() for s in keys if s)  # FLEET_LM_API_KEY is both
        values.update(dict.fromkeys(referenced_secrets(self.policy.mcp)))  # ${VAR}s of [[mcp.servers]]
        if self.lm_base_url and (password := urlsplit(self.lm_base_url).password):  # https://user:key@host
            values[password] = None
        return [v for v in values if len(v) >= 4]

    @property
    def redactor(self) -> Redactor:
        """Replaces every secret in force with ``***`` (events, traces, logs, error messages)."""
        return Redactor.of(tuple(self.secrets()))


def _format_validation_error(source: str, exc: PydanticValidationError) -> str:
    lines = [f"{source} is invalid:"]
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"])
        allowed = ""
        ctx = err.get("ctx") or {}
        if "expected" in ctx:
            allowed = f" (allowed: {ctx['expected']})"
        elif err["type"] == "extra_forbidden":
            allowed = " (unknown key; see docs/configuration.md for the keys)"
        elif any(k != "error" for k in ctx):
            allowed = " (" + ", ".join(f"{k} {v}" for k, v in ctx.items() if k != "error") + ")"
        lines.append(f"  {key}: {err['msg']}{allowed}; got {err.get('input')!r}")
    return "\n".join(lines)


def _read_policy(path: Path | None) -> Policy:
    if path is None:
        return Policy()
    path = path.absolute()  # the file read, named in full: a kernel's working folder is not the user's
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}. Fix FLEET_CONFIG or create the file.") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    try:
        return Policy.model_validate(raw)
    except PydanticValidationError as exc:
        raise ConfigError(_format_validation_error(str(path), exc)) from exc


def _config_path(env: dict[str, str]) -> Path | None:
    if env.get("FLEET_CONFIG"):
        return Path(env["FLEET_CONFIG"]).expanduser()
    local = Path("fleet.toml")
    return local if local.is_file() else None


DEFAULT_HOME = "~/.fleet"


def home_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$FLEET_HOME``, else ``~/.fleet``: the store, workspaces and logs.

    The kernel logs there before settings load.
    """
    env = os.environ if env is None else env
    return Path(env.get("FLEET_HOME") or DEFAULT_HOME).expanduser().absolute()


def load_settings(env: dict[str, str] | None = None) -> Settings:
    """Resolve settings from the environment and ``fleet.toml``.

    Raises:
        ConfigError: a value is invalid (the message names the key and the allowed values), or FLEET_HOME
            is not safely this user's (``ownership.check_home``).
    """
    env = dict(os.environ if env is None else env)
    path = _config_path(env)
    policy = _read_policy(path)
    values: dict[str, Any] = {"policy": policy, "config_path": path}
    for var, attr in ENV_VARS.items():
        if env.get(var):
            values[attr] = env[var]
    values["home"] = home_dir(env)
    values.setdefault("database_url", f"sqlite+aiosqlite:///{values['home'] / 'fleet.db'}")
    values.setdefault("sandbox", policy.sandbox.backend)
    disabled = env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
    values["tracing"] = not disabled and any(env.get(var, "").strip() for var in OTEL_ENDPOINT_VARS)
    if not values.get("lm_api_key"):
        # dspy/LiteLLM read the provider's own variable (OPENAI_API_KEY, ...) themselves.
        values.pop("lm_api_key", None)
    values["provider_keys"] = env_secrets(env)
    try:
        settings = Settings.model_validate(values)
    except PydanticValidationError as exc:
        message = _format_validation_error("environment", exc)
        for var, attr in ENV_VARS.items():
            message = message.replace(f"  {attr}:", f"  {var}:")
        raise ConfigError(message) from exc
    ownership.check_home(settings.home)  # before anything is read from it or written below it
    return settings
