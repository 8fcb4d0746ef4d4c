"""The underscored hooks of pydantic-settings the config sources override
(gateway/config/sources.py `PRIVATE_HOOKS`).

Each is checked on the installed release: it exists on the class the source subclasses,
takes the parameters the override takes, and is still called where the override counts on
it (while the source is built). A release that renames one, changes its signature or stops
calling it fails here, by name, instead of a configuration that quietly loads nothing from
the environment, the secrets directory or the file.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NestedSecretsSettingsSource,
    TomlConfigSettingsSource,
)

from gateway.config import ConfigError
from gateway.config.sources import (
    PRIVATE_HOOKS,
    GatewayEnvSource,
    SecretFilesSource,
    TomlFileSource,
)

# The pydantic-settings class each fenced name is on, and the gateway's source over it.
LIBRARY: dict[str, type[Any]] = {
    "EnvSettingsSource": EnvSettingsSource,
    "NestedSecretsSettingsSource": NestedSecretsSettingsSource,
    "TomlConfigSettingsSource": TomlConfigSettingsSource,
}
OURS: dict[str, type[Any]] = {
    "EnvSettingsSource": GatewayEnvSource,
    "NestedSecretsSettingsSource": SecretFilesSource,
    "TomlConfigSettingsSource": TomlFileSource,
}


class Lease(BaseModel):
    ttl_s: float = 90.0


class Probe(BaseSettings):
    """A config model of one section: the sources know no model but the one handed in."""

    lease: Lease = Lease()


def parameters(method: Callable[..., Any]) -> list[tuple[str, Any]]:
    """The names and kinds of a method's parameters (their annotations differ in spelling)."""
    return [(p.name, p.kind) for p in inspect.signature(method).parameters.values()]


def returns(method: Callable[..., Any]) -> str:
    """A method's return annotation as text, module prefixes dropped (`collections.abc.`):
    pydantic-settings spells some as strings, some as objects."""
    annotation = inspect.signature(method).return_annotation
    text = annotation if isinstance(annotation, str) else str(annotation)
    return re.sub(r"\b(?:\w+\.)+(?=\w)", "", text)


def test_the_fence_names_exactly_the_private_names_the_sources_override() -> None:
    # Methods only: ABCMeta gives every class an `_abc_impl` of its own.
    overridden = {(owner, name) for owner, ours in OURS.items()
                  for name, value in vars(ours).items()
                  if inspect.isfunction(value) and name.startswith("_") and not name.startswith("__")}
    assert overridden == set(PRIVATE_HOOKS)


@pytest.mark.parametrize(("owner", "name"), PRIVATE_HOOKS)
def test_every_fenced_hook_is_on_its_class_with_the_signature_overridden(
        owner: str, name: str) -> None:
    library, ours = LIBRARY[owner], OURS[owner]
    assert issubclass(ours, library)
    assert callable(getattr(library, name, None)), f"{owner}.{name} is gone"
    hook, override = getattr(library, name), getattr(ours, name)
    assert parameters(hook) == parameters(override), f"{owner}.{name} takes other parameters"
    assert returns(hook) == returns(override), f"{owner}.{name} returns something else"


def test_the_env_source_reads_the_variables_through_load_env_vars_once_built() -> None:
    source = GatewayEnvSource(Probe, {"AGENT_GATEWAY_LEASE__TTL_S": "120", "HOME": "/h"})
    # What the override returned is what the library kept: it called the hook in __init__.
    assert source.env_vars == {"AGENT_GATEWAY_lease__ttl_s": "120"}
    assert source() == {"lease": {"ttl_s": "120"}}


def test_the_secrets_source_reads_the_files_by_name_through_load_env_vars(
        tmp_path: Path) -> None:
    (tmp_path / "lease__ttl_s").write_text("120\n")
    source = SecretFilesSource(Probe, tmp_path)
    # The override saw the file through the library's own _load_env_vars (name -> value,
    # the trailing newline stripped) while the source was built.
    assert [(s.keys, s.value) for s in source.settings] == [(("lease", "ttl_s"), "120")]
    assert source() == {"lease": {"ttl_s": "120"}}


def test_the_toml_source_reads_its_file_through_read_file_once_built(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text("[lease]\nttl_s = 120\n")
    assert TomlFileSource(Probe, good).toml_data == {"lease": {"ttl_s": 120}}
    bad = tmp_path / "bad.toml"
    bad.write_text("[lease\n")
    with pytest.raises(ConfigError) as raised:  # the override's error: it was the one called
        TomlFileSource(Probe, bad)
    assert raised.value.path == bad
