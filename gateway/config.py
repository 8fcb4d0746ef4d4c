"""Configuration: one pydantic model per `[section]` of docs/configuration.md.

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

import difflib
import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo

ENV_PREFIX = "AGENT_GATEWAY_"
CONFIG_ENV = "AGENT_GATEWAY_CONFIG"
# The longest a run may be given (timeout_s, default_timeout_s): a bound, so that 1e308 or
# infinity is refused rather than taken as "no limit".
MAX_TIMEOUT_S = 7 * 24 * 3600
# The default PostgreSQL work pool of a stdio gateway (one per client window) and of an HTTP
# gateway (shared by a team): [persistence] pool_max.
POOL_MAX_STDIO = 2
POOL_MAX_HTTP = 10

# The most output a job may keep (limits.max_output_bytes) and so the largest byte offset
# into it: 1 TiB, far past any disk a gateway writes to, so 10**40 is a typo, not a limit.
MAX_OUTPUT_BYTES_BOUND = 1 << 40
PROVIDER_NAMES = ("claude", "codex", "gemini", "grok", "mistral", "devin", "cursor")
# Bounds on the numbers a config may hold: far past any real setting, so that `inf`, 1e308
# or 10**40 is refused as the typo it is rather than taken as "no limit" (#23 item 10).
MAX_COUNT = 1_000_000  # jobs, sessions, heartbeat failures
MAX_RETENTION_DAYS = 36_500
# A variable holding JSON (a list or a table) may nest this deep: real values nest two or
# three levels; `[` * 50000 would exhaust the parser's recursion and kill `serve`.
MAX_JSON_DEPTH = 32
# A value longer than this is never quoted in an error (it may be a pasted secret or a
# megabyte of junk); shorter ones are, unless their key holds secrets (`_may_echo`).
MAX_ECHOED_CHARS = 40
# Keys whose values are secrets, or may hold them: never quoted in an error.
SECRET_KEY_PARTS = frozenset({"env", "headers", "auth_token", "dsn"})


def gateway_home() -> Path:
    """`~/.agent-cli-gateway`, resolved at call time so tests can point HOME elsewhere."""
    return Path(os.path.expanduser("~")) / ".agent-cli-gateway"


def default_config_path() -> Path:
    env = os.environ.get(CONFIG_ENV)
    return Path(env).expanduser() if env else gateway_home() / "config.toml"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


def seconds(default: float, *, zero_ok: bool = False, most: float = MAX_TIMEOUT_S) -> Any:
    """A duration key: finite (no `inf`, no `nan`), above 0 (or at least 0), at most `most`."""
    if zero_ok:
        return Field(default=default, ge=0, le=most, allow_inf_nan=False)
    return Field(default=default, gt=0, le=most, allow_inf_nan=False)


def count(default: int, *, least: int = 1) -> Any:
    """A count key (jobs, sessions, failures): an integer from `least` to MAX_COUNT."""
    return Field(default=default, ge=least, le=MAX_COUNT)


MAX_USD = 1_000_000.0  # a budget or reservation past this is a typo, not a limit


def usd(*, above_zero: bool = False) -> Any:
    """An amount in US dollars (unset: no limit): finite, 0 (or above) to MAX_USD."""
    if above_zero:
        return Field(default=None, gt=0, le=MAX_USD, allow_inf_nan=False)
    return Field(default=None, ge=0, le=MAX_USD, allow_inf_nan=False)


def byte_size(default: int) -> Any:
    """A size in bytes: 1 to MAX_OUTPUT_BYTES_BOUND."""
    return Field(default=default, ge=1, le=MAX_OUTPUT_BYTES_BOUND)


class PersistenceConfig(_Section):
    backend: Literal["sqlite", "postgres", "memory"] = "sqlite"
    path: Path = Field(default_factory=lambda: gateway_home() / "jobs.db")
    dsn: str | None = None
    retention_days: float = seconds(30, most=MAX_RETENTION_DAYS)
    # Long enough for a client's retry after a timeout, short enough that a repeated
    # instruction to an agent ("run the tests and fix what fails") is new work.
    dedup_window_s: float = seconds(120, zero_ok=True)
    # PostgreSQL connections this gateway may hold for its work (the heartbeat has one slot
    # of its own besides). Unset: 2 for a stdio gateway (one per client window: 100 windows
    # must fit a server's default max_connections), 10 for a shared HTTP gateway.
    pool_max: int | None = Field(default=None, ge=1, le=1000)
    # "pgbouncer": the DSN points at PgBouncer in transaction pooling mode, so a connection
    # keeps no session state (no startup parameters, no named prepared statements).
    pooler: Literal["none", "pgbouncer"] = "none"

    def pool_max_for(self, role: str) -> int:
        """The work pool's size for a gateway of this role ("stdio", "http", ...)."""
        if self.pool_max is not None:
            return self.pool_max
        return POOL_MAX_HTTP if role == "http" else POOL_MAX_STDIO

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
    heartbeat_s: float = seconds(15)
    ttl_s: float = seconds(90)
    http_job_grace_s: float = seconds(300)
    sweep_interval_s: float = seconds(30)
    instance_gc_s: float = seconds(3600)
    cancel_poll_s: float = seconds(5)
    max_heartbeat_failures: int = count(3)
    drain_timeout_s: float = seconds(1.5)
    # "detach": a gateway that shuts down leaves its runs to their supervisors (the next
    # gateway on the host adopts them); "stop": it stops them and fails its queued jobs.
    on_shutdown: Literal["detach", "stop"] = "detach"
    # Uncharged re-queues of one job (its owner proven gone before it started) in an hour;
    # past it the job ends failed (requeue_limit): a poison job cannot walk every gateway.
    max_requeues: int = count(6)

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
    max_running_jobs: int = count(32)
    max_running_per_provider: int = count(16)
    max_queued_jobs: int = count(128, least=0)
    queue_timeout_s: float = seconds(120)
    max_output_bytes: int = byte_size(52_428_800)
    max_prompt_bytes: int = byte_size(1_048_576)
    sync_defer_after_s: float = seconds(45)
    default_timeout_s: float = seconds(3600)
    idle_timeout_s: float = seconds(600)
    kill_grace_s: float = seconds(5, zero_ok=True)


class WorktreesConfig(_Section):
    """`[worktrees]`: isolated runs of CLI jobs in a git worktree of their own (issue #27)."""

    default_isolation: Literal["none", "worktree"] = "none"
    # Where worktrees are made: `<root>/<repo key>/<job id prefix>`; unset: the state dir's
    # `worktrees/`, outside every repository, so a `git status` there never shows them.
    root: Path | None = None
    branch_prefix: str = "agent-gateway/"
    retention_h: float = seconds(72, zero_ok=True, most=MAX_RETENTION_DAYS * 24)
    max_per_repo: int = count(20)
    copy_files: list[str] = Field(default_factory=list, alias="copy")
    lfs: bool = False

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @field_validator("root", mode="after")
    @classmethod
    def _expand_root(cls, value: Path | None) -> Path | None:
        return value.expanduser() if value is not None else None

    @field_validator("copy_files", mode="after")
    @classmethod
    def _relative_copies(cls, value: list[str]) -> list[str]:
        for name in value:
            parts = Path(name).parts
            if not name or Path(name).is_absolute() or ".." in parts or "\x00" in name:
                raise ValueError(f"worktrees.copy entry {name!r} must be a relative path "
                                 f"inside the repository (no '..')")
        return value


class HttpConfig(_Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8765, ge=0, le=65535)
    path: str = "/mcp"
    auth_token: str | None = Field(default=None, repr=False)
    max_body_bytes: int = byte_size(8_388_608)
    max_sessions: int = count(100)
    # Clients that leave without DELETE (many do) hold a session until this idles out.
    session_idle_timeout_s: float = seconds(300, most=86_400)
    # Browser origins (scheme://host:port) allowed to call; none by default (DNS rebinding).
    allowed_origins: list[str] = Field(default_factory=list)


class LoggingConfig(_Section):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = "auto"

    @field_validator("level", "format", mode="before")
    @classmethod
    def _lower_case(cls, value: Any) -> Any:
        # `level = "INFO"` and AGENT_GATEWAY_LOGGING__LEVEL=DEBUG are what people type.
        return ascii_lower(value) if isinstance(value, str) else value


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
    timeout_s: float = seconds(600)
    headers: dict[str, str] = Field(default_factory=dict, repr=False)


class ProviderBudgetConfig(_Section):
    """`[budgets.providers.<name>]`: one provider's limits (unset: none)."""

    daily_usd: float | None = usd()
    monthly_usd: float | None = usd()
    max_jobs_per_day: int | None = Field(default=None, ge=0, le=MAX_COUNT)


class BudgetsConfig(_Section):
    """`[budgets]`: spend limits over UTC days and months (issue 28; gateway/jobs/budgets.py).
    All unset: no limit, and admission reserves nothing."""

    daily_usd: float | None = usd()
    monthly_usd: float | None = usd()
    job_reservation_usd: float | None = usd(above_zero=True)
    providers: dict[str, ProviderBudgetConfig] = Field(default_factory=dict)


def _default_providers() -> dict[str, ProviderConfig]:
    return {name: ProviderConfig() for name in PROVIDER_NAMES}


class Settings(_Section):
    """The whole configuration. Build it with `load_settings`, not directly."""

    persistence: PersistenceConfig = Field(default_factory=PersistenceConfig)
    lease: LeaseConfig = Field(default_factory=LeaseConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    http: HttpConfig = Field(default_factory=HttpConfig)
    worktrees: WorktreesConfig = Field(default_factory=WorktreesConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    providers: dict[str, ProviderConfig] = Field(default_factory=_default_providers)
    api_providers: dict[str, ApiProviderConfig] = Field(default_factory=dict)
    budgets: BudgetsConfig = Field(default_factory=BudgetsConfig)

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
        stray = sorted(set(self.budgets.providers) - set(PROVIDER_NAMES) - set(self.api_providers))
        if stray:
            raise ValueError(f"[budgets.providers.<name>] names no provider: {stray}; use one of "
                             f"{[*PROVIDER_NAMES, *self.api_providers]}")
        return self

    @property
    def state_dir(self) -> Path:
        """Where per-job spool directories live: beside the SQLite file, else the home dir."""
        if self.persistence.backend == "sqlite":
            return self.persistence.path.parent
        return gateway_home()


class ConfigError(Exception):
    """The configuration is invalid. `problems` holds one readable line per problem;
    `env_names` the environment variables at fault and `in_file` whether the file is too,
    so every message can name the source that is wrong (`source`)."""

    def __init__(self, path: Path | None, problems: list[str],
                 env_names: list[str] | None = None, *, in_file: bool | None = None) -> None:
        self.path = path
        self.problems = problems
        self.env_names = sorted(set(env_names or []))
        self.in_file = path is not None if in_file is None else in_file
        super().__init__(f"invalid configuration in {self.where}:\n"
                         + "\n".join(f"  - {p}" for p in problems))

    @property
    def where(self) -> str:
        """The file's path and/or the variables' names: the short form, for the header."""
        parts = [str(self.path)] if self.in_file and self.path else []
        if self.env_names:
            noun = "variable" if len(self.env_names) == 1 else "variables"
            parts.append(f"the environment {noun} {', '.join(self.env_names)}")
        return " and ".join(parts) or "the configuration"

    @property
    def source(self) -> str:
        """The source that is wrong, in words: `the config file P`, `the environment
        variable X` (set in the MCP client's env block or the shell), or both."""
        parts = [f"the config file {self.path}"] if self.in_file and self.path else []
        if self.env_names:
            noun = "variable" if len(self.env_names) == 1 else "variables"
            parts.append(f"the environment {noun} {', '.join(self.env_names)} (set in the "
                         f"MCP client's env block or the shell that started the gateway)")
        return " and ".join(parts) or "the configuration"


# -- keys: compared in ASCII only -----------------------------------------------------------


def ascii_lower(text: str) -> str:
    """Lower-case A-Z only. `str.lower` folds the Kelvin sign (U+212A) to `k`, which would
    let a look-alike key name a real one; a non-ASCII letter stays and names no key."""
    return text.translate(_ASCII_LOWER)


def ascii_upper(text: str) -> str:
    """Upper-case a-z only (see ascii_lower)."""
    return text.translate(_ASCII_UPPER)


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_ASCII_UPPER = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")


# -- values: what an error may quote --------------------------------------------------------


def _may_echo(parts: list[str], value: Any) -> bool:
    """Whether an error may quote this value: not under a key that holds secrets (a CLI's
    `env`, HTTP `headers`, `auth_token`, `dsn`, anything named like a token or key), not a
    table, and short."""
    if value is None or isinstance(value, dict):
        return False
    if any(part in SECRET_KEY_PARTS or _secret_name(part) for part in parts):
        return False
    return len(repr(value)) <= MAX_ECHOED_CHARS


def _secret_name(key: str) -> bool:
    lowered = ascii_lower(key)
    return any(word in lowered for word in ("token", "secret", "password", "api_key", "apikey"))


# -- JSON in a variable: bounded depth ------------------------------------------------------


def json_depth(text: str) -> int:
    """The deepest nesting of `[`/`{` in a JSON text (strings skipped), without parsing it:
    the parser itself recurses, and `[` * 50000 would exhaust the stack."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def parse_env_json(name: str, value: str, shape: str) -> Any:
    """An env var's JSON value; ValueError (whose text never quotes the value: it may hold
    a secret) when it does not parse or nests deeper than MAX_JSON_DEPTH."""
    if json_depth(value) > MAX_JSON_DEPTH:
        raise ValueError(f"the environment variable {name} must be JSON for {shape}; it "
                         f"nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(value)
    except (ValueError, RecursionError) as exc:
        reason = exc if isinstance(exc, ValueError) else "nested too deeply"
        raise ValueError(f"the environment variable {name} must be JSON for {shape}; it "
                         f"does not parse ({reason})") from None


# -- environment variables ------------------------------------------------------------------


def _json_shape(annotation: Any) -> str | None:
    """What an env var for a key of this type must spell as JSON: a list, a table (or a
    whole section), or nothing (a plain value, converted like the file's)."""
    if get_origin(annotation) is list:
        return """a list, e.g. '["--flag"]'"""
    if get_origin(annotation) is dict or (isinstance(annotation, type)
                                          and issubclass(annotation, BaseModel)):
        return """a table, e.g. '{"key": "value"}'"""
    return None


def field_by_key(model: type[BaseModel], key: str) -> FieldInfo | None:
    """The field a config key names: its alias when it has one (`[worktrees] copy`, a name
    BaseModel itself uses), else its own name."""
    for name, field in model.model_fields.items():
        if (field.alias or name) == key:
            return field
    return None


def _env_keys(parts: list[str]) -> tuple[list[str], str | None]:
    """The config keys an env var's name parts stand for, and the JSON its value must be.

    Sections, keys and provider names are matched case-insensitively in ASCII (they are all
    lower case); the keys of a table of strings (a CLI's `env`, HTTP `headers`) are the
    user's own names and keep their case. A part that names no key is kept (lower case),
    so that validation rejects it as an unknown key naming the variable."""
    node: Any = Settings
    keys: list[str] = []
    for part in parts:
        if isinstance(node, type) and issubclass(node, BaseModel):
            key = ascii_lower(part)
            field = field_by_key(node, key)
            node = field.annotation if field is not None else None
        elif get_origin(node) is dict:
            node = get_args(node)[1]
            key = part if node is str else ascii_lower(part)
        else:
            key, node = ascii_lower(part), None
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


def _gateway_variables(environ: Mapping[str, str]) -> list[tuple[str, list[str], str]]:
    """(name, the parts after the prefix, value) of every AGENT_GATEWAY_* variable."""
    return [(name, name[len(ENV_PREFIX):].split("__"), value)
            for name, value in environ.items() if ascii_upper(name).startswith(ENV_PREFIX)]


def _is_setting(parts: list[str]) -> bool:
    """A variable without `__` that names no section (`AGENT_GATEWAY_CONFIG`, the file's
    path, or a typo) is not a setting."""
    return len(parts) > 1 or ascii_lower(parts[0]) in Settings.model_fields


def environment_settings(environ: Mapping[str, str]) -> dict[str, Any]:
    """The `AGENT_GATEWAY_<SECTION>__<KEY>[__<KEY>]` variables as data shaped like the file.

    Deeper variables win over a section or table given as JSON. Raises ConfigError naming
    the variable when a value that must be JSON is not (or nests too deep).
    """
    data: dict[str, Any] = {}
    problems: list[str] = []
    names: list[str] = []
    found = [v for v in _gateway_variables(environ) if _is_setting(v[1])]
    for name, parts, value in sorted(found, key=lambda item: len(item[1])):
        keys, shape = _env_keys(parts)
        parsed: Any = value
        if shape is not None:
            try:
                parsed = parse_env_json(name, value, shape)
            except ValueError as exc:
                problems.append(f"{'.'.join(keys)}: {exc}")
                names.append(name)
                continue
        for key in reversed(keys):
            parsed = {key: parsed}
        data = merge_tables(data, parsed)
    if problems:
        raise ConfigError(None, problems, names)
    return data


def known_env_names() -> list[str]:
    """The variable of every key: AGENT_GATEWAY_<SECTION>__<KEY>, and per CLI provider
    AGENT_GATEWAY_PROVIDERS__<NAME>__<KEY>."""
    names = []
    for section, field in Settings.model_fields.items():
        model = field.annotation
        if isinstance(model, type) and issubclass(model, BaseModel):
            names += [f"{ENV_PREFIX}{section}__{key}".upper() for key in model.model_fields]
    for provider in PROVIDER_NAMES:
        names += [f"{ENV_PREFIX}PROVIDERS__{provider}__{key}".upper()
                  for key in ProviderConfig.model_fields]
    return names


def unknown_env_warnings(environ: Mapping[str, str]) -> list[str]:
    """One warning per AGENT_GATEWAY_* variable that is no setting and not CONFIG (it is
    ignored: a one-underscore typo such as AGENT_GATEWAY_LEASE_TTL_S), with the nearest
    variable that is one."""
    known = known_env_names()
    warnings = []
    for name, parts, _value in _gateway_variables(environ):
        if _is_setting(parts) or ascii_upper(name) == CONFIG_ENV:
            continue
        near = difflib.get_close_matches(ascii_upper(name), known, n=1, cutoff=0.6)
        hint = f"; did you mean {near[0]}?" if near else (
            "; settings are AGENT_GATEWAY_<SECTION>__<KEY> (two underscores)")
        warnings.append(f"the environment variable {name} matches no setting and is "
                        f"ignored{hint}")
    return warnings


def _env_source(parts: list[str]) -> str | None:
    """The env var that supplied this key (or keys below it), if one did: the file does
    not contain it then."""
    if not parts:
        return None
    name = ENV_PREFIX + "__".join(ascii_upper(p) for p in parts)
    for key in os.environ:
        upper = ascii_upper(key)
        if upper == name or upper.startswith(name + "__"):
            return key
    return None


def _describe(err: Mapping[str, Any]) -> tuple[str, str | None]:
    """One problem as a line naming its key (and its variable when one set it), and that
    variable. The value is quoted only when `_may_echo` allows."""
    parts = [str(p) for p in err.get("loc", ()) if p not in ("function-after",)]
    loc = ".".join(parts)
    msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    variable = _env_source(parts)
    source = f" (set by env {variable})" if variable else ""
    if err.get("type") == "extra_forbidden":
        return (f"unknown key '{loc}'{source} (check the spelling; see config.example.toml "
                "for every key)"), variable
    value = err.get("input")
    shown = f" (got {value!r})" if _may_echo(parts, value) else ""
    if not loc or msg.startswith(loc.split(".")[0]):
        return f"{msg}{shown}{source}", variable
    return f"{loc}: {msg}{shown}{source}", variable


def read_config_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, [f"not valid TOML: {exc}"]) from None
    except RecursionError:
        raise ConfigError(path, ["not valid TOML: arrays or tables nested too deeply"]) from None
    except OSError as exc:
        raise ConfigError(path, [f"cannot read config file: {exc.strerror}"]) from None


def load_settings(path: Path | None = None, **overrides: Any) -> Settings:
    """Load and validate the configuration.

    Raises ConfigError (never a pydantic traceback) with one line per problem, naming the
    source of each: the variable, or the file and key.
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
    except (ValidationError, RecursionError) as exc:
        if isinstance(exc, RecursionError):  # a structure too deep to validate
            raise ConfigError(path if path.exists() else None,
                              ["the configuration nests too deeply"]) from None
        described = [_describe(e) for e in exc.errors()]
        variables = [v for _, v in described if v is not None]
        from_file = path.exists() and any(v is None for _, v in described)
        raise ConfigError(path if path.exists() else None, [line for line, _ in described],
                          variables, in_file=from_file) from None
