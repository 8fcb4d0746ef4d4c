"""Configuration: one pydantic model per `[section]` (docs/configuration.md), loaded by
pydantic-settings.

Sources, strongest first: keyword arguments (tests), `AGENT_GATEWAY_<SECTION>__<KEY>` env
vars, secret files (`$AGENT_GATEWAY_SECRETS_DIR`, opt-in), the TOML file
(`$AGENT_GATEWAY_CONFIG` or `~/.agent-cli-gateway/config.toml`), defaults. No file is needed
to start. Unknown keys are rejected everywhere: a typo must never be silently ignored.
`load_settings` turns every validation problem into one readable line (`ConfigError`,
gateway/config/errors.py), so the CLI can exit 2 without a traceback. The sources and the
rules pydantic-settings does not know (ASCII-only names, bounded JSON) are in
gateway/config/sources.py.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from gateway.config.errors import ENV, ConfigError, Origin, ascii_lower, ascii_upper, describe
from gateway.config.sources import (
    CONFIG_ENV,
    ENV_PREFIX,
    SECRETS_DIR_ENV,
    SOURCE_VARIABLES,
    SourcePlan,
    field_by_key,
    gateway_variables,
    is_setting,
)
from gateway.platform import ENV_VAR as PLATFORM_ENV
from neutral.loopback import is_loopback_host
from providers.registry import CLI_PROVIDERS

__all__ = ["CONFIG_ENV", "ENV_PREFIX", "SECRETS_DIR_ENV", "ConfigError", "field_by_key"]

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
# The CLI providers a `[providers.<name>]` section may name: the registry's adapters.
PROVIDER_NAMES = tuple(CLI_PROVIDERS)
# Bounds on the numbers a config may hold: far past any real setting, so that `inf`, 1e308
# or 10**40 is refused as the typo it is rather than taken as "no limit" (#23 item 10).
MAX_COUNT = 1_000_000  # jobs, sessions, heartbeat failures
MAX_RETENTION_DAYS = 36_500
# [limits] provider_nice: provider CLIs (and, where Linux schedules by autogroup, each one's
# session) run this many nice levels below the gateway, so that its heartbeat and MCP answers
# are not starved by its own providers: with 32 CPU-bound ones, each in a session of its own,
# an un-niced gateway got ~1/34 of the CPU and answered 10-12 calls/s (128-143 at 10). What it
# costs: on a box busy with other work a niced CLI yields to every un-niced process, so a
# CPU-bound CLI takes longer there (bench/nice_bench.py measures both sides).
PROVIDER_NICE_DEFAULT = 10
MAX_NICE = 19  # the lowest priority a process can have (nice(1))


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
    queue_full_wait_s: float = seconds(5, zero_ok=True)
    max_output_bytes: int = byte_size(52_428_800)
    max_prompt_bytes: int = byte_size(1_048_576)
    sync_defer_after_s: float = seconds(45)
    default_timeout_s: float = seconds(3600)
    idle_timeout_s: float = seconds(600)
    kill_grace_s: float = seconds(5, zero_ok=True)
    provider_nice: int = Field(default=PROVIDER_NICE_DEFAULT, ge=0, le=MAX_NICE)


def _relative_path(name: str) -> str:
    """A path inside the repository. The message names no value: describe() quotes it when
    the file gave it and never when a variable did (gateway/config/errors.py)."""
    if not name or Path(name).is_absolute() or ".." in Path(name).parts or "\x00" in name:
        raise ValueError("must be a relative path inside the repository (no '..')")
    return name


class WorktreesConfig(_Section):
    """`[worktrees]`: isolated runs of CLI jobs in a git worktree of their own (issue #27)."""

    default_isolation: Literal["none", "worktree"] = "none"
    # Where worktrees are made: `<root>/<repo key>/<job id prefix>`; unset: the state dir's
    # `worktrees/`, outside every repository, so a `git status` there never shows them.
    root: Path | None = None
    branch_prefix: str = "agent-gateway/"
    retention_h: float = seconds(72, zero_ok=True, most=MAX_RETENTION_DAYS * 24)
    max_per_repo: int = count(20)
    copy_files: list[Annotated[str, AfterValidator(_relative_path)]] = Field(
        default_factory=list, alias="copy")
    lfs: bool = False

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @field_validator("root", mode="after")
    @classmethod
    def _expand_root(cls, value: Path | None) -> Path | None:
        return value.expanduser() if value is not None else None



def _absolute_checkout(path: Path) -> Path:
    path = path.expanduser()
    if not path.is_absolute():
        raise ValueError("must be an absolute path to a git checkout on this host")
    return path


class WorkerConfig(_Section):
    """`[worker]`: this host as a worker for jobs admitted elsewhere (`runs_on`, issue 42)."""

    # KEY = VALUE facts a `runs_on = {labels = {...}}` selector matches (`worker --label`
    # adds to them).
    labels: dict[str, str] = Field(default_factory=dict)
    # name -> the checkout on this host a job's `repo` names (worktree jobs on another host).
    repos: dict[str, Annotated[Path, AfterValidator(_absolute_checkout)]] = Field(
        default_factory=dict)
    max_jobs: int = count(4)  # jobs this worker runs at once
    # How long a job for another host waits for one that meets it, then fails (no_worker):
    # judged by the admitting gateway.
    queue_timeout_s: float = seconds(600)
    # Whether this host takes jobs admitted on another host at all: off unless said.
    accept_remote: bool = False
    # Only the jobs of these principals (gateway/mcp/principal.py); empty: anyone's.
    principals: list[str] = Field(default_factory=list)
    max_patch_bytes: int = byte_size(16_777_216)
    claim_poll_s: float = seconds(0.5)  # how often an idle worker looks for queued work


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


class AttemptsConfig(_Section):
    """`[attempts]`: best-of-N groups (issue 39; docs/attempts.md)."""

    max_attempts: int = count(8, least=2)  # attempts in one group, all targets together
    # The check a group runs in each attempt's worktree when the call names none (an argv,
    # never a shell string); empty: no check unless the call gives one.
    check: list[str] = Field(default_factory=list)
    judge_max_diff_bytes: int = Field(default=32 * 1024, ge=1024, le=1024 * 1024)
    # How long a group's judge (one more CLI job) may run; past it the judge's job times out
    # and the group keeps its deterministic order (judge.error says so).
    judge_timeout_s: float = Field(default=600.0, gt=0, le=24 * 3600)


def _default_providers() -> dict[str, ProviderConfig]:
    return {name: ProviderConfig() for name in PROVIDER_NAMES}


# A job's ends, and `done`: an attempt group's comparison is complete (store/outbox.py).
NotifyStatus = Literal["completed", "failed", "timed_out", "orphaned", "cancelled", "done"]


def _default_notify_on() -> list[NotifyStatus]:
    """Every end but a cancel (the caller's own doing)."""
    return ["completed", "failed", "timed_out", "orphaned", "done"]


def _webhook_url(url: str | None) -> str | None:
    """https://, or http:// to a loopback address only: a notice (and its signature) never
    crosses a network in clear text."""
    if url is None:
        return None
    parts = urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return url
    if parts.scheme == "http" and parts.hostname and is_loopback_host(parts.hostname):
        return url
    raise ValueError("webhook_url must be https://..., or http:// to a loopback address "
                     "(127.0.0.1, ::1, localhost)")


class NotifyConfig(_Section):
    """Completion notices (issue 40): the sinks, all off until turned on, and which ends
    are told. The filter (`on`, `min_duration_s`) is applied by the deliverer."""

    desktop: bool = False
    command: list[str] | None = Field(default=None, min_length=1)
    webhook_url: Annotated[str | None, AfterValidator(_webhook_url)] = None
    webhook_secret_env: str | None = None
    on: list[NotifyStatus] = Field(default_factory=_default_notify_on)
    min_duration_s: float = seconds(30, zero_ok=True)
    max_attempts: int = count(8)
    timeout_s: float = seconds(10, most=600)

    @property
    def sinks(self) -> list[str]:
        """The names of the sinks turned on, in delivery order."""
        return [name for name, on in (("desktop", self.desktop),
                                      ("command", self.command is not None),
                                      ("webhook", self.webhook_url is not None)) if on]


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
    worker: WorkerConfig = Field(default_factory=WorkerConfig)
    attempts: AttemptsConfig = Field(default_factory=AttemptsConfig)
    notify: NotifyConfig = Field(default_factory=NotifyConfig)

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
    def claims_remote(self) -> bool:
        """Whether a `serve` gateway also claims jobs of other hosts: "any live gateway or
        worker that can run it, the admitting one included" (DESIGN §9)."""
        return self.worker.accept_remote and self.persistence.backend == "postgres"

    @property
    def state_dir(self) -> Path:
        """Where per-job spool directories live: beside the SQLite file, else the home dir."""
        if self.persistence.backend == "sqlite":
            return self.persistence.path.parent
        return gateway_home()


def merge_tables(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Config data shaped like the file: `override` over `base`, table by table, as the
    loader merges its sources (for code that writes a config file, such as the tests)."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = merge_tables(merged[key], value)
        else:
            merged[key] = value
    return merged


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


# The gateway's variables that are no setting: those naming a source, and the platform
# choice (read by gateway.platform before any configuration, so even a broken config file
# cannot hide it).
READ_ELSEWHERE = (*SOURCE_VARIABLES, PLATFORM_ENV)


def unknown_env_warnings(environ: Mapping[str, str]) -> list[str]:
    """One warning per AGENT_GATEWAY_* variable that is no setting and names no source (it
    is ignored: a one-underscore typo such as AGENT_GATEWAY_LEASE_TTL_S), with the nearest
    variable that is one."""
    known = known_env_names()
    warnings = []
    for name, parts, _value in gateway_variables(environ):
        if is_setting(Settings, parts) or ascii_upper(name) in READ_ELSEWHERE:
            continue
        near = difflib.get_close_matches(ascii_upper(name), known, n=1, cutoff=0.6)
        hint = f"; did you mean {near[0]}?" if near else (
            "; settings are AGENT_GATEWAY_<SECTION>__<KEY> (two underscores)")
        warnings.append(f"the environment variable {name} matches no setting and is "
                        f"ignored{hint}")
    return warnings


# -- loading: pydantic-settings does it -----------------------------------------------------

# The sources of the load under way: `settings_customise_sources` is a classmethod that
# pydantic-settings calls with no room for a path, so the plan travels beside the call.
_PLAN: ContextVar[SourcePlan] = ContextVar("config_source_plan")


class _FromSources(BaseSettings, Settings):
    """`Settings`, filled by pydantic-settings from the sources of `_PLAN`. Only
    `load_settings` builds it; `Settings()` itself stays the plain defaults."""

    model_config: ClassVar[SettingsConfigDict] = SettingsConfigDict(
        extra="forbid", env_prefix=ENV_PREFIX, env_nested_delimiter="__",
        case_sensitive=True)

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Keyword arguments, then the environment, the secret files and the file; no .env.
        return (init_settings, *_PLAN.get().build(settings_cls))


def source_plan(path: Path | None = None,
                environ: Mapping[str, str] | None = None) -> SourcePlan:
    """The sources a load reads: the config file (`path`, else $AGENT_GATEWAY_CONFIG, else
    the default, which may be absent), the secrets directory (if set) and the environment.
    ConfigError when a file or directory named explicitly is missing or no file."""
    environ = os.environ if environ is None else environ
    explicit = path is not None or CONFIG_ENV in environ
    path = path or default_config_path()
    file: Path | None = path
    if not path.exists():
        if explicit:
            raise ConfigError(path, ["config file does not exist (run `agent-cli-gateway init`)"])
        file = None
    elif not path.is_file():
        raise ConfigError(path, ["cannot read config file: "
                                 + ("Is a directory" if path.is_dir() else "not a regular file")])
    secrets = environ.get(SECRETS_DIR_ENV)
    secrets_dir = Path(secrets).expanduser() if secrets else None
    if secrets_dir is not None and not secrets_dir.is_dir():
        raise ConfigError(None, [f"the secrets directory {secrets_dir} is not a directory"],
                          [SECRETS_DIR_ENV], in_file=False)
    return SourcePlan(file, secrets_dir, environ)


@contextmanager
def _planned(plan: SourcePlan) -> Iterator[SourcePlan]:
    token = _PLAN.set(plan)
    try:
        yield plan
    finally:
        _PLAN.reset(token)


def load_settings(path: Path | None = None, **overrides: Any) -> Settings:
    """Load and validate the configuration.

    Raises ConfigError (never a pydantic traceback) with one line per problem, naming the
    source of each: the variable, the secret file, or the file and key.
    """
    return load_planned(source_plan(path), **overrides)


def load_planned(plan: SourcePlan, **overrides: Any) -> Settings:
    """`load_settings` from a plan made already (`config show` asks it who set what)."""
    with _planned(plan):
        try:
            return _FromSources(**overrides)
        except RecursionError:  # a structure too deep to validate
            raise ConfigError(plan.file, ["the configuration nests too deeply"]) from None
        except SettingsError as exc:  # the secrets directory (too big, too many entries)
            raise ConfigError(None, [str(exc)], [SECRETS_DIR_ENV], in_file=False) from None
        except ValidationError as exc:
            raise _config_error(plan, exc) from None


def _config_error(plan: SourcePlan, exc: ValidationError) -> ConfigError:
    described = [describe(e, plan.origin_of) for e in exc.errors()]
    origins = [origin for _, origin in described if origin is not None]
    return ConfigError(plan.file, [line for line, _ in described],
                       [o.name for o in origins if o.kind == ENV],
                       in_file=plan.file is not None and any(o is None for _, o in described),
                       secret_files=[o.name for o in origins if o.kind != ENV])


def origin_label(plan: SourcePlan, parts: tuple[str, ...]) -> str:
    """Where the effective value of a key came from, as `config show` prints it:
    `env NAME`, `secret file PATH`, `file PATH` or `default`."""
    origin: Origin | None = plan.origin_of(parts, below=False)
    if origin is not None:
        return str(origin)
    node: Any = plan.file_data()
    for part in parts:
        if not isinstance(node, dict) or part not in node:
            return "default"
        node = node[part]
    return f"file {plan.file}"
