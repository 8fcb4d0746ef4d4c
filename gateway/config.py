"""Configuration: one pydantic model per `[section]` of DESIGN.md section 7.

Sources, strongest first: keyword arguments (tests), `AGENT_GATEWAY_<SECTION>__<KEY>` env
vars, the TOML file (`$AGENT_GATEWAY_CONFIG` or `~/.agent-cli-gateway/config.toml`), defaults.
No file is needed to start. Unknown keys are rejected everywhere: a typo must never be
silently ignored. `load_settings` turns every validation problem into one readable line
(`ConfigError`), so the CLI can exit 2 without a traceback.

The environment is read here rather than through pydantic-settings: that package and the
dotenv, CLI and cloud-secret sources it imports cost about a tenth of the gateway's share of
its startup (bench/: startup), for the one source it was used for.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

ENV_PREFIX = "AGENT_GATEWAY_"
CONFIG_ENV = "AGENT_GATEWAY_CONFIG"
# The longest a run may be given (timeout_s, default_timeout_s): a bound, so that 1e308 or
# infinity is refused rather than taken as "no limit".
MAX_TIMEOUT_S = 7 * 24 * 3600
# The most output a job may keep (limits.max_output_bytes) and so the largest byte offset
# into it: 1 TiB, far past any disk a gateway writes to, so 10**40 is a typo, not a limit.
MAX_OUTPUT_BYTES_BOUND = 1 << 40
PROVIDER_NAMES = ("claude", "codex", "gemini", "grok", "mistral", "devin", "cursor")


def gateway_home() -> Path:
    """`~/.agent-cli-gateway`, resolved at call time so tests can point HOME elsewhere."""
    return Path(os.path.expanduser("~")) / ".agent-cli-gateway"


def default_config_path() -> Path:
    env = os.environ.get(CONFIG_ENV)
    return Path(env).expanduser() if env else gateway_home() / "config.toml"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PersistenceConfig(_Section):
    backend: Literal["sqlite", "postgres", "memory"] = "sqlite"
    path: Path = Field(default_factory=lambda: gateway_home() / "jobs.db")
    dsn: str | None = None
    retention_days: float = Field(default=30, gt=0)
    # Long enough for a client's retry after a timeout, short enough that a repeated
    # instruction to an agent ("run the tests and fix what fails") is new work.
    dedup_window_s: float = Field(default=120, ge=0)

    @model_validator(mode="after")
    def _postgres_needs_dsn(self) -> PersistenceConfig:
        if self.backend == "postgres" and not self.dsn:
            raise ValueError(
                "persistence.dsn is required when persistence.backend = 'postgres' "
                "(e.g. dsn = 'postgresql://user@host/dbname')"
            )
        return self

    @field_validator("path")
    @classmethod
    def _expand_home(cls, value: Path) -> Path:
        return value.expanduser()


class LeaseConfig(_Section):
    heartbeat_s: float = Field(default=15, gt=0)
    ttl_s: float = Field(default=90, gt=0)
    http_job_grace_s: float = Field(default=300, gt=0)
    sweep_interval_s: float = Field(default=30, gt=0)
    instance_gc_s: float = Field(default=3600, gt=0)
    cancel_poll_s: float = Field(default=5, gt=0)
    max_heartbeat_failures: int = Field(default=3, ge=1)
    drain_timeout_s: float = Field(default=1.5, gt=0)
    # "detach": a gateway that shuts down leaves its runs to their supervisors (the next
    # gateway on the host adopts them); "stop": it stops them and fails its queued jobs.
    on_shutdown: Literal["detach", "stop"] = "detach"

    @model_validator(mode="after")
    def _lease_invariants(self) -> LeaseConfig:
        # These orderings are what make "never falsely orphaned" hold: a lease must survive
        # at least one missed heartbeat, and an http job or an instance row must outlive it.
        problems = []
        if self.ttl_s < 2 * self.heartbeat_s:
            problems.append(
                f"lease.ttl_s ({self.ttl_s:g}) must be at least 2 * lease.heartbeat_s "
                f"({2 * self.heartbeat_s:g}) so one late heartbeat never expires a lease"
            )
        if self.http_job_grace_s < self.ttl_s:
            problems.append(
                f"lease.http_job_grace_s ({self.http_job_grace_s:g}) must be >= lease.ttl_s "
                f"({self.ttl_s:g})"
            )
        if self.instance_gc_s < self.ttl_s:
            problems.append(
                f"lease.instance_gc_s ({self.instance_gc_s:g}) must be >= lease.ttl_s "
                f"({self.ttl_s:g})"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self


class LimitsConfig(_Section):
    max_running_jobs: int = Field(default=32, ge=1)
    max_running_per_provider: int = Field(default=16, ge=1)
    max_queued_jobs: int = Field(default=128, ge=0)
    queue_timeout_s: float = Field(default=120, gt=0)
    max_output_bytes: int = Field(default=52_428_800, ge=1, le=MAX_OUTPUT_BYTES_BOUND)
    max_prompt_bytes: int = Field(default=1_048_576, ge=1)
    sync_defer_after_s: float = Field(default=45, gt=0)
    default_timeout_s: float = Field(default=3600, gt=0, le=MAX_TIMEOUT_S)
    idle_timeout_s: float = Field(default=600, gt=0)
    kill_grace_s: float = Field(default=5, ge=0)


class HttpConfig(_Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8765, ge=0, le=65535)
    path: str = "/mcp"
    auth_token: str | None = Field(default=None, repr=False)
    max_body_bytes: int = Field(default=8_388_608, ge=1)
    max_sessions: int = Field(default=100, ge=1)
    # Clients that leave without DELETE (many do) hold a session until this idles out.
    session_idle_timeout_s: float = Field(default=300, gt=0, le=86_400)
    # Browser origins (scheme://host:port) allowed to call; none by default (DNS rebinding).
    allowed_origins: list[str] = Field(default_factory=list)


class LoggingConfig(_Section):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = "auto"

    @field_validator("level", "format", mode="before")
    @classmethod
    def _lower_case(cls, value: Any) -> Any:
        # `level = "INFO"` and AGENT_GATEWAY_LOGGING__LEVEL=DEBUG are what people type.
        return value.lower() if isinstance(value, str) else value


class ProviderConfig(_Section):
    enabled: bool = True
    command: str | None = None
    default_model: str | None = None
    extra_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict, repr=False)


class ApiProviderConfig(_Section):
    kind: Literal["openai", "anthropic"]
    base_url: str
    api_key_env: str | None = None
    default_model: str | None = None
    timeout_s: float = Field(default=600, gt=0, le=MAX_TIMEOUT_S)
    headers: dict[str, str] = Field(default_factory=dict, repr=False)


def _default_providers() -> dict[str, ProviderConfig]:
    return {name: ProviderConfig() for name in PROVIDER_NAMES}


class Settings(_Section):
    """The whole configuration. Build it with `load_settings`, not directly."""

    persistence: PersistenceConfig = Field(default_factory=PersistenceConfig)
    lease: LeaseConfig = Field(default_factory=LeaseConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    http: HttpConfig = Field(default_factory=HttpConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    providers: dict[str, ProviderConfig] = Field(default_factory=_default_providers)
    api_providers: dict[str, ApiProviderConfig] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known_providers(self) -> Settings:
        unknown = sorted(set(self.providers) - set(PROVIDER_NAMES))
        if unknown:
            raise ValueError(
                f"unknown provider section(s) {unknown}: [providers.<name>] takes one of "
                f"{list(PROVIDER_NAMES)}; HTTP model APIs go under [api_providers.<name>]"
            )
        # A section that names only some keys still gets every other provider's defaults.
        for name in PROVIDER_NAMES:
            self.providers.setdefault(name, ProviderConfig())
        clash = sorted(set(self.api_providers) & set(PROVIDER_NAMES))
        if clash:
            raise ValueError(f"api_providers {clash} clash with CLI provider names; rename them")
        return self

    @property
    def state_dir(self) -> Path:
        """Where per-job spool directories live: beside the SQLite file, else the home dir."""
        if self.persistence.backend == "sqlite":
            return self.persistence.path.parent
        return gateway_home()


class ConfigError(Exception):
    """The configuration is invalid. `problems` holds one readable line per problem."""

    def __init__(self, path: Path | None, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        where = f" in {path}" if path else ""
        super().__init__(f"invalid configuration{where}:\n" + "\n".join(f"  - {p}" for p in problems))


def _json_shape(annotation: Any) -> str | None:
    """What an env var for a key of this type must spell as JSON: a list, a table (or a
    whole section), or nothing (a plain value, converted like the file's)."""
    if get_origin(annotation) is list:
        return """a list, e.g. '["--flag"]'"""
    if get_origin(annotation) is dict or (isinstance(annotation, type)
                                          and issubclass(annotation, BaseModel)):
        return """a table, e.g. '{"key": "value"}'"""
    return None


def _env_keys(parts: list[str]) -> tuple[list[str], str | None]:
    """The config keys an env var's name parts stand for, and the JSON its value must be.

    Sections, keys and provider names are matched case-insensitively (they are all lower
    case); the keys of a table of strings (a CLI's `env`, HTTP `headers`) are the user's own
    names and keep their case. A part that names no key is kept (lower case), so that
    validation rejects it as an unknown key naming the variable."""
    node: Any = Settings
    keys: list[str] = []
    for part in parts:
        if isinstance(node, type) and issubclass(node, BaseModel):
            key = part.lower()
            field = node.model_fields.get(key)
            node = field.annotation if field is not None else None
        elif get_origin(node) is dict:
            node = get_args(node)[1]
            key = part if node is str else part.lower()
        else:
            key, node = part.lower(), None
        keys.append(key)
    return keys, _json_shape(node)


def merge_tables(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """`override` over `base`, table by table (an env var sets one key, not its section)."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = merge_tables(merged[key], value)
        else:
            merged[key] = value
    return merged


def environment_settings(environ: Mapping[str, str]) -> dict[str, Any]:
    """The `AGENT_GATEWAY_<SECTION>__<KEY>[__<KEY>]` variables as data shaped like the file.

    A variable without `__` that names no section (`AGENT_GATEWAY_CONFIG`, the file's path)
    is not a setting. Deeper variables win over a section or table given as JSON.
    Raises ConfigError naming the variable when a value that must be JSON is not.
    """
    data: dict[str, Any] = {}
    problems: list[str] = []
    found = [(name, name[len(ENV_PREFIX):].split("__"), value)
             for name, value in environ.items() if name.upper().startswith(ENV_PREFIX)]
    for name, parts, value in sorted(found, key=lambda item: len(item[1])):
        if len(parts) == 1 and parts[0].lower() not in Settings.model_fields:
            continue
        keys, shape = _env_keys(parts)
        parsed: Any = value
        if shape is not None:
            try:
                parsed = json.loads(value)
            except ValueError as exc:
                # Not the value itself: a CLI's env or extra_args may hold a secret.
                problems.append(f"{'.'.join(keys)}: the environment variable {name} must be "
                                f"JSON for {shape}; it does not parse ({exc})")
                continue
        for key in reversed(keys):
            parsed = {key: parsed}
        data = merge_tables(data, parsed)
    if problems:
        raise ConfigError(None, problems)
    return data


def _env_source(parts: list[str]) -> str:
    """` (set by env NAME)` when an env var supplied this key (or keys below it): the file
    does not contain it."""
    if not parts:
        return ""
    name = ENV_PREFIX + "__".join(parts).upper()
    for key in os.environ:
        upper = key.upper()
        if upper == name or upper.startswith(name + "__"):
            return f" (set by env {key})"
    return ""


def _describe(err: Mapping[str, Any]) -> str:
    parts = [str(p) for p in err.get("loc", ()) if p not in ("function-after",)]
    loc = ".".join(parts)
    msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    source = _env_source(parts)
    if err.get("type") == "extra_forbidden":
        return (
            f"unknown key '{loc}'{source} (check the spelling; see config.example.toml "
            "for every key)"
        )
    value = err.get("input")
    shown = "" if isinstance(value, dict) or value is None else f" (got {value!r})"
    if not loc or msg.startswith(loc.split(".")[0]):
        return f"{msg}{shown}{source}"
    return f"{loc}: {msg}{shown}{source}"


def read_config_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, [f"not valid TOML: {exc}"]) from None
    except OSError as exc:
        raise ConfigError(path, [f"cannot read config file: {exc.strerror}"]) from None


def load_settings(path: Path | None = None, **overrides: Any) -> Settings:
    """Load and validate the configuration.

    Raises ConfigError (never a pydantic traceback) with one line per problem.
    """
    explicit = path is not None or CONFIG_ENV in os.environ
    path = path or default_config_path()
    data: dict[str, Any] = {}
    if path.exists():
        data = read_config_file(path)
    elif explicit:
        raise ConfigError(path, ["config file does not exist (run `agent-cli-gateway init`)"])
    data = merge_tables(merge_tables(data, environment_settings(os.environ)), overrides)
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(path if path.exists() else None, [_describe(e) for e in exc.errors()]) from None
