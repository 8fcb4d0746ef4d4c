"""The sources pydantic-settings loads the configuration from, with the house rules on top.

pydantic-settings reads the `AGENT_GATEWAY_*` variables, splits them at `__`, decodes the
JSON of list and table keys, reads the TOML file and the secret files, and merges them
table by table (gateway/config/__init__.py `load_settings`). These subclasses add only what
it does not do itself:

- names are matched case-insensitively in ASCII only (a Kelvin sign never names `k`), yet
  the keys of a table of strings (a CLI's `env`, HTTP `headers`) keep their case;
- a variable or secret file whose section names no key is handed on, so that validation
  rejects it as an unknown key naming its source (pydantic-settings would skip it);
- a value that must be JSON is checked first, depth-bounded, so its error names the
  variable and never quotes the value (it may hold a secret);
- an unreadable or invalid TOML file is a ConfigError naming the file.

It knows no config model: the model class comes in as `settings_cls`.

pydantic-settings has no public hook for any of this, so the sources override its
underscored methods, here and nowhere else (`PRIVATE_HOOKS`): `EnvSettingsSource.
_load_env_vars` (the variables, read once while the source is built),
`NestedSecretsSettingsSource._load_env_vars` (the secret files by name) and
`TomlConfigSettingsSource._read_file` (the one file). pyproject pins pydantic-settings to
the minor release these were checked on (`>=2.16,<2.17`), and tests/test_config_fence.py
asserts each exists with the signature overridden here and is still called where the
override counts on it, so a release that renames or changes one fails there, by name, first
(tests/test_packaging.py holds the pin).
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_settings import (
    EnvSettingsSource,
    NestedSecretsSettingsSource,
    PydanticBaseSettingsSource,
    SecretsSettingsSource,
    TomlConfigSettingsSource,
)

from gateway.config.errors import ENV, SECRET_FILE, ConfigError, Origin, ascii_lower, ascii_upper

if TYPE_CHECKING:
    from pydantic_settings import BaseSettings

ENV_PREFIX = "AGENT_GATEWAY_"
DELIMITER = "__"
CONFIG_ENV = "AGENT_GATEWAY_CONFIG"
# Opt-in: a directory of secret files, one per key (`persistence__dsn`, `http__auth_token`),
# such as a mounted Docker or Kubernetes secret. Unset: no secret files are read.
SECRETS_DIR_ENV = "AGENT_GATEWAY_SECRETS_DIR"
# Variables that point at a source rather than set a key.
SOURCE_VARIABLES = (CONFIG_ENV, SECRETS_DIR_ENV)
# A value holding JSON (a list or a table) may nest this deep: real values nest two or
# three levels; `[` * 50000 would exhaust the parser's recursion and kill `serve`.
MAX_JSON_DEPTH = 32
# The underscored hooks of pydantic-settings overridden below, for the fence's test: (the
# pydantic-settings class that defines it, the name).
PRIVATE_HOOKS: tuple[tuple[str, str], ...] = (
    ("EnvSettingsSource", "_load_env_vars"),
    ("NestedSecretsSettingsSource", "_load_env_vars"),
    ("TomlConfigSettingsSource", "_read_file"),
)


@dataclass(frozen=True)
class Setting:
    """One variable or secret file that sets a key: its origin, the config keys its name
    stands for, the JSON its value must be (if any) and the value."""

    origin: Origin
    keys: tuple[str, ...]
    shape: str | None
    value: str


def field_by_key(model: type[BaseModel], key: str) -> FieldInfo | None:
    """The field a config key names: its alias when it has one (`[worktrees] copy`, a name
    BaseModel itself uses), else its own name."""
    for name, field in model.model_fields.items():
        if (field.alias or name) == key:
            return field
    return None


def _json_shape(annotation: Any) -> str | None:
    """What a value for a key of this type must spell as JSON: a list, a table (or a
    whole section), or nothing (a plain value, converted like the file's)."""
    if get_origin(annotation) is list:
        return """a list, e.g. '["--flag"]'"""
    if get_origin(annotation) is dict or (isinstance(annotation, type)
                                          and issubclass(annotation, BaseModel)):
        return """a table, e.g. '{"key": "value"}'"""
    return None


def key_path(model: type[BaseModel], parts: list[str]) -> tuple[tuple[str, ...], str | None]:
    """The config keys a name's `__`-separated parts stand for, and the JSON its value
    must be. Sections, keys and provider names match in ASCII lower case; the keys of a
    table of strings are the user's own names and keep their case. A part that names no
    key is kept (lower case), so validation rejects it as an unknown key."""
    node: Any = model
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
    return tuple(keys), _json_shape(node)


def gateway_variables(environ: Mapping[str, str]) -> list[tuple[str, list[str], str]]:
    """(name, the parts after the prefix, value) of every AGENT_GATEWAY_* variable."""
    return [(name, name[len(ENV_PREFIX):].split(DELIMITER), value)
            for name, value in environ.items() if ascii_upper(name).startswith(ENV_PREFIX)]


def is_setting(model: type[BaseModel], parts: list[str]) -> bool:
    """A name without `__` that names no section (`AGENT_GATEWAY_CONFIG`, a source's
    variable, or a typo) is not a setting."""
    return len(parts) > 1 or ascii_lower(parts[0]) in model.model_fields


def env_settings(model: type[BaseModel], environ: Mapping[str, str]) -> list[Setting]:
    """Every AGENT_GATEWAY_<SECTION>__<KEY>[__<KEY>] variable, shallowest first."""
    found = []
    for name, parts, value in gateway_variables(environ):
        if is_setting(model, parts):
            keys, shape = key_path(model, parts)
            found.append(Setting(Origin(ENV, name), keys, shape, value))
    return sorted(found, key=lambda setting: len(setting.keys))


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


def json_problem(setting: Setting) -> str | None:
    """Why a value that must be JSON is not (never quoting it: it may hold a secret)."""
    if setting.shape is None:
        return None
    noun = "environment variable" if setting.origin.kind == ENV else setting.origin.kind
    what = (f"{'.'.join(setting.keys)}: the {noun} {setting.origin.name} must be JSON for "
            f"{setting.shape}; it")
    if json_depth(setting.value) > MAX_JSON_DEPTH:
        return f"{what} nests deeper than {MAX_JSON_DEPTH} levels"
    try:
        json.loads(setting.value)
    except (ValueError, RecursionError) as exc:
        reason = exc if isinstance(exc, ValueError) else "nested too deeply"
        return f"{what} does not parse ({reason})"
    return None


def check_json(settings: list[Setting]) -> None:
    """ConfigError naming every variable or secret file whose JSON is bad."""
    bad = [(setting, problem) for setting in settings
           if (problem := json_problem(setting)) is not None]
    if bad:
        raise ConfigError(None, [problem for _, problem in bad],
                          [s.origin.name for s, _ in bad if s.origin.kind == ENV],
                          secret_files=[s.origin.name for s, _ in bad if s.origin.kind != ENV])


def with_unknown_sections(data: dict[str, Any], model: type[BaseModel],
                          settings: list[Setting]) -> dict[str, Any]:
    """`data` plus the settings whose first key names no section: pydantic-settings reads
    known fields only, and an unknown one must fail validation, not vanish."""
    for setting in settings:
        if setting.keys[0] in model.model_fields:
            continue
        node = data
        for key in setting.keys[:-1]:
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                break
            node = child
        else:
            node[setting.keys[-1]] = setting.value
    return data


class Origins:
    """Which variable or secret file set a key path: the deepest one at or above it, else
    (`below`) one that set a key under it (an error about a whole section)."""

    def __init__(self, settings: list[Setting]) -> None:
        self._by_keys = {setting.keys: setting.origin for setting in settings}

    def of(self, parts: tuple[str, ...], *, below: bool = True) -> Origin | None:
        for end in range(len(parts), 0, -1):
            if (origin := self._by_keys.get(parts[:end])) is not None:
                return origin
        if below:
            for keys, origin in self._by_keys.items():
                if keys[:len(parts)] == parts:
                    return origin
        return None


class GatewayEnvSource(EnvSettingsSource):
    """The AGENT_GATEWAY_* variables, named as `key_path` reads them (see the module)."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self.settings = env_settings(settings_cls, environ)
        self.origins = Origins(self.settings)
        super().__init__(settings_cls, case_sensitive=True, env_prefix=ENV_PREFIX,
                         env_nested_delimiter=DELIMITER)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        check_json(self.settings)
        return {ENV_PREFIX + DELIMITER.join(s.keys): s.value for s in self.settings}

    def __call__(self) -> dict[str, Any]:
        return with_unknown_sections(super().__call__(), self.settings_cls, self.settings)


class SecretFilesSource(NestedSecretsSettingsSource):
    """The files of the secrets directory, one per key, named like a variable without its
    prefix (`persistence__dsn`), their contents the value (trailing newline stripped)."""

    def __init__(self, settings_cls: type[BaseSettings], directory: Path) -> None:
        self.directory = directory
        self.settings: list[Setting] = []
        super().__init__(SecretsSettingsSource(settings_cls, secrets_dir=directory),
                         secrets_dir=directory, secrets_dir_missing="error",
                         secrets_case_sensitive=True, secrets_prefix="",
                         secrets_nested_delimiter=DELIMITER)
        self.origins = Origins(self.settings)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        files = super()._load_env_vars()
        for name, value in files.items():
            keys, shape = key_path(self.settings_cls, name.split(DELIMITER))
            origin = Origin(SECRET_FILE, str(self.directory / name))
            self.settings.append(Setting(origin, keys, shape, value or ""))
        self.settings.sort(key=lambda setting: len(setting.keys))
        check_json(self.settings)
        return {DELIMITER.join(s.keys): s.value for s in self.settings}

    def __call__(self) -> dict[str, Any]:
        return with_unknown_sections(super().__call__(), self.settings_cls, self.settings)


class TomlFileSource(TomlConfigSettingsSource):
    """The config file; a file that cannot be read or parsed is a ConfigError naming it."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path) -> None:
        self.path = path
        super().__init__(settings_cls, toml_file=path)

    def _read_file(self, file_path: Any) -> dict[str, Any]:
        try:
            with file_path.open("rb") as fh:
                data: dict[str, Any] = tomllib.load(fh)
                return data
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(self.path, [f"not valid TOML: {exc}"]) from None
        except RecursionError:
            raise ConfigError(self.path, ["not valid TOML: arrays or tables nested too "
                                          "deeply"]) from None
        except OSError as exc:
            raise ConfigError(self.path, [f"cannot read config file: {exc.strerror}"]) from None


@dataclass
class SourcePlan:
    """What one load reads: the file (if there is one), the secrets directory (if set) and
    the environment. `build` makes the sources, strongest first, and keeps them so the
    loader can ask afterwards who set what."""

    file: Path | None
    secrets_dir: Path | None
    environ: Mapping[str, str]
    env: GatewayEnvSource | None = None
    secrets: SecretFilesSource | None = None
    toml: TomlFileSource | None = None

    def build(self, settings_cls: type[BaseSettings]) -> tuple[PydanticBaseSettingsSource, ...]:
        self.env = GatewayEnvSource(settings_cls, self.environ)
        sources: list[PydanticBaseSettingsSource] = [self.env]
        if self.secrets_dir is not None:
            self.secrets = SecretFilesSource(settings_cls, self.secrets_dir)
            sources.append(self.secrets)
        if self.file is not None:
            self.toml = TomlFileSource(settings_cls, self.file)
            sources.append(self.toml)
        return tuple(sources)

    def origin_of(self, parts: tuple[str, ...], *, below: bool = True) -> Origin | None:
        """The variable or secret file that set this key path (the variable if both did:
        the environment is the stronger source), else None."""
        for source in (self.env, self.secrets):
            if source is not None and (origin := source.origins.of(parts, below=below)):
                return origin
        return None

    def file_data(self) -> dict[str, Any]:
        return self.toml.toml_data if self.toml is not None else {}
