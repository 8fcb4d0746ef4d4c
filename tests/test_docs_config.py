"""docs/configuration.md and config.example.toml list exactly the keys the config model has.

The model is walked, not listed here: a key added to gateway/config/ without its docs row
and example line fails these tests, and so does a documented key the model no longer has.
"""

from __future__ import annotations

import re
import tomllib
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from gateway.config import ENV_PREFIX, Settings, field_by_key

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs" / "configuration.md"
EXAMPLE = REPO / "config.example.toml"
TEMPLATE = "<name>"  # how docs and tests spell the variable part of [providers.<name>]


def _table_of_sections(annotation: Any) -> type[BaseModel] | None:
    """The section type of a `dict[str, Section]` field, else None."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is dict and isinstance(args[1], type) and issubclass(args[1], BaseModel):
        return args[1]
    return None


def model_sections() -> dict[str, type[BaseModel]]:
    """'persistence' -> PersistenceConfig ..., 'providers.<name>' -> ProviderConfig ...,
    and a section's own table of sections: 'budgets.providers.<name>'."""
    sections: dict[str, type[BaseModel]] = {}
    for name, field in Settings.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            sections[name] = annotation
            for inner, inner_field in annotation.model_fields.items():
                if (table := _table_of_sections(inner_field.annotation)) is not None:
                    sections[f"{name}.{inner}.{TEMPLATE}"] = table
            continue
        if (table := _table_of_sections(annotation)) is not None:
            sections[f"{name}.{TEMPLATE}"] = table
            continue
        raise AssertionError(f"Settings.{name} is neither a section nor a table of sections")
    return sections


def model_keys() -> dict[str, set[str]]:
    """Each section's keys as a file spells them (a field's alias when it has one; a table of
    sections inside one is a section of its own)."""
    return {section: {field.alias or key for key, field in model.model_fields.items()
                      if _table_of_sections(field.annotation) is None}
            for section, model in model_sections().items()}


def env_name(section: str, key: str) -> str:
    parts = [*section.split("."), key]
    return ENV_PREFIX + "__".join(p if p == TEMPLATE else p.upper() for p in parts).replace(
        TEMPLATE, "<NAME>")


def toml_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, Path):
        home = str(Path.home())
        text = str(value)
        return f'"~{text[len(home):]}"' if text.startswith(home) else f'"{text}"'
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_literal(v) for v in value) + "]"
    if isinstance(value, dict) and not value:
        return "{}"
    raise AssertionError(f"no docs rendering for default {value!r}")


def documented_default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    return "unset" if value is None else f"`{toml_literal(value)}`"


# -- parsing the docs and the example ---------------------------------------------------

_HEADING = re.compile(r"^## `\[(?P<section>[a-z_]+(?:\.providers)?(?:\.<name>)?)\]`")
_ROW = re.compile(r"^\| `(?P<key>[a-z_]+)` \| (?P<default>[^|]+?) \| `(?P<env>[A-Z_<>]+)` \|")


def docs_rows() -> dict[str, dict[str, tuple[str, str]]]:
    """section -> key -> (default cell, env cell), from the tables under `## [section]`."""
    rows: dict[str, dict[str, tuple[str, str]]] = {}
    section: str | None = None
    for line in DOCS.read_text().splitlines():
        if line.startswith("## "):
            heading = _HEADING.match(line)
            section = heading["section"] if heading else None
            if section is not None:
                assert section not in rows, f"section [{section}] documented twice"
                rows[section] = {}
            continue
        row = _ROW.match(line)
        if row and section is not None:
            assert row["key"] not in rows[section], f"{section}.{row['key']} documented twice"
            rows[section][row["key"]] = (row["default"].strip(), row["env"])
    return rows


_EXAMPLE_SECTION = re.compile(
    r"^(?:# )?\[(?P<section>[a-z_]+(?:\.providers)?)(?:\.(?P<name>[a-z_]+))?\]\s*$")
_EXAMPLE_KEY = re.compile(r"^(?:# )?(?P<key>[a-z_]+) = \S")


def example_keys() -> dict[str, set[str]]:
    """section -> keys in config.example.toml, counting commented-out `# key = value` lines."""
    keys: dict[str, set[str]] = {}
    section: str | None = None
    for line in EXAMPLE.read_text().splitlines():
        header = _EXAMPLE_SECTION.match(line)
        if header:
            section = header["section"] + (f".{TEMPLATE}" if header["name"] else "")
            assert section not in keys, f"[{section}] appears twice in the example"
            keys[section] = set()
            continue
        key = _EXAMPLE_KEY.match(line)
        if key:
            assert section is not None, f"key before any section: {line!r}"
            assert key["key"] not in keys[section], f"{section}.{key['key']} appears twice"
            keys[section].add(key["key"])
    return keys


# -- the checks --------------------------------------------------------------------------


def test_the_model_walk_finds_every_section() -> None:
    assert set(model_sections()) == {"persistence", "lease", "limits", "http", "worktrees",
                                     "logging", "worker", "attempts",
                                     "providers.<name>", "api_providers.<name>", "budgets",
                                     "budgets.providers.<name>", "notify"}


def test_the_docs_document_exactly_the_sections_of_the_model() -> None:
    assert set(docs_rows()) == set(model_keys())


@pytest.mark.parametrize("section", sorted(model_keys()))
def test_the_docs_list_exactly_the_keys_of_each_section(section: str) -> None:
    documented = set(docs_rows().get(section, {}))
    expected = model_keys()[section]
    assert documented == expected, (
        f"[{section}] missing from docs: {sorted(expected - documented)}; "
        f"documented but not in the model: {sorted(documented - expected)}")


@pytest.mark.parametrize("section", sorted(model_keys()))
def test_the_docs_give_each_key_its_real_default_and_env_var(section: str) -> None:
    model = model_sections()[section]
    for key, (default, env) in docs_rows()[section].items():
        field = field_by_key(model, key)
        assert field is not None, f"{section}.{key}"
        assert default == documented_default(field), f"{section}.{key}"
        assert env == env_name(section, key), f"{section}.{key}"


def test_the_docs_say_how_the_file_is_found() -> None:
    text = DOCS.read_text()
    for needle in ("--config PATH", "AGENT_GATEWAY_CONFIG", "~/.agent-cli-gateway/config.toml",
                   "init", "0600", "AGENT_GATEWAY_<SECTION>__<KEY>"):
        assert needle in text


def test_the_example_lists_exactly_the_keys_of_each_section() -> None:
    assert example_keys() == model_keys()


def test_the_commented_examples_in_the_example_are_valid_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Uncomment every `# key = value` and `# [section]` line: the result must still load.
    monkeypatch.setenv("HOME", str(tmp_path))
    lines = []
    for line in EXAMPLE.read_text().splitlines():
        bare = line.removeprefix("# ")
        if line.startswith("# ") and (_EXAMPLE_KEY.match(bare) or _EXAMPLE_SECTION.match(bare)):
            line = bare
        lines.append(line)
    uncommented = "\n".join(lines)
    data = tomllib.loads(uncommented)
    assert data["api_providers"]["openrouter"]["kind"] == "openai"
    settings = Settings(**data)
    assert settings.persistence.dsn is not None
    assert settings.api_providers["openrouter"].api_key_env == "OPENROUTER_API_KEY"
