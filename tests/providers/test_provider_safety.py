"""Input safety: what a caller sends can never become a flag, a truncated C string or an
argv the kernel refuses. Every adapter rejects the same bad inputs with a message that says
what to change."""

from __future__ import annotations

import os
from typing import Any, get_origin

import pytest
from pydantic import ValidationError

from providers.base import InvalidRequest, ProviderRequest
from providers.safety import (
    MAX_ARG_STRLEN,
    arg_max,
    check_argv_size,
    check_request,
)
from tests.fakes.argv_cases import DIALECTS, provider, request


@pytest.mark.parametrize(("name", "binary"), DIALECTS)
@pytest.mark.parametrize("prompt", ["", "   \n\t "])
def test_an_empty_prompt_is_refused(name: str, binary: str, prompt: str) -> None:
    adapter = provider(name)
    with pytest.raises(InvalidRequest, match="prompt is empty"):
        adapter.build_invocation(request(adapter, {}, prompt=prompt), binary)


@pytest.mark.parametrize(("name", "binary"), DIALECTS)
@pytest.mark.parametrize("where", ["prompt", "model", "session_id", "working_dir"])
def test_a_nul_byte_anywhere_is_refused(name: str, binary: str, where: str) -> None:
    adapter = provider(name)
    fields = {"prompt": "hello", "model": None, "session_id": None, "working_dir": None}
    fields[where] = "bad\x00value"
    req = ProviderRequest(options=adapter.options_model(), **fields)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match=f"{where} contains a NUL byte"):
        adapter.build_invocation(req, binary)


@pytest.mark.parametrize(("name", "binary"), DIALECTS)
def test_a_nul_byte_in_configured_extra_args_is_refused(name: str, binary: str) -> None:
    adapter = provider(name)
    with pytest.raises(InvalidRequest, match="NUL"):
        adapter.build_invocation(request(adapter, {}), binary, extra_args=["--x\x00"])


@pytest.mark.parametrize("name", ["claude", "codex"])  # the adapters with a list option
@pytest.mark.parametrize("value", ["-rf", "--help", "/ok\x00/no"])
def test_a_list_option_value_that_starts_with_a_dash_or_holds_nul_is_refused(
    name: str, value: str,
) -> None:
    adapter = provider(name)
    fields = adapter.options_model.model_fields
    list_field = next(n for n, f in fields.items() if get_origin(f.annotation) is list)
    if not value.startswith("/"):  # the options model refuses a relative path itself
        with pytest.raises(ValidationError, match="absolute path"):
            request(adapter, {list_field: ["/fine", value]})
    # The argv check holds even for options built without validation (defence in depth).
    values: dict[str, Any] = {list_field: ["/fine", value]}
    options = adapter.options_model.model_construct(**values)
    req = ProviderRequest(prompt="say hi", options=options)
    with pytest.raises(InvalidRequest, match=f"options.{list_field} item"):
        adapter.build_invocation(req, adapter.commands[0])


@pytest.mark.parametrize("name", ["claude", "codex"])
@pytest.mark.parametrize("value", ["relative/dir", "~/src", ".", ""])
def test_a_relative_add_dir_is_refused(name: str, value: str) -> None:
    """#23 item 9: add_dirs grants the agent a directory; a relative one would be resolved
    against the CLI's cwd, never what the caller meant."""
    with pytest.raises(ValidationError, match="absolute path"):
        request(provider(name), {"add_dirs": [value]})
    assert request(provider(name), {"add_dirs": ["/srv/data"]}).options is not None


@pytest.mark.parametrize(("name", "binary"), DIALECTS)
@pytest.mark.parametrize("session_id", ["-x", "--resume", "-"])
def test_a_session_id_that_starts_with_a_dash_is_refused(
    name: str, binary: str, session_id: str,
) -> None:
    adapter = provider(name)
    with pytest.raises(InvalidRequest, match=r"session_id .* starts with '-'"):
        adapter.build_invocation(request(adapter, {}, session_id=session_id), binary)


@pytest.mark.parametrize(("name", "binary"), DIALECTS)
def test_a_model_that_starts_with_a_dash_is_refused_even_from_config(
    name: str, binary: str,
) -> None:
    adapter = provider(name)
    with pytest.raises(InvalidRequest, match=r"model .* starts with '-'"):
        adapter.build_invocation(request(adapter, {}, model="--yolo"), binary)
    with pytest.raises(InvalidRequest, match=r"model .* starts with '-'"):
        adapter.build_invocation(request(adapter, {}), binary, default_model="-x")


def test_a_blank_session_id_is_refused_with_a_hint() -> None:
    with pytest.raises(InvalidRequest, match="omit it to start a new session"):
        check_request(ProviderRequest(prompt="hi", session_id="  "))


def test_a_normal_argv_fits() -> None:
    check_argv_size(["claude", "--print", "hello"])


@pytest.mark.skipif(os.uname().sysname != "Linux", reason="per-argument cap is Linux's")
def test_one_argument_over_the_linux_per_argument_cap_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="bytes per argument"):
        check_argv_size(["grok", "-p=" + "x" * MAX_ARG_STRLEN])


def test_an_argv_larger_than_arg_max_is_refused_and_says_the_limit() -> None:
    pieces = ["x" * 1000] * (arg_max() // 1000 + 10)
    with pytest.raises(InvalidRequest, match=f"ARG_MAX {arg_max()}"):
        check_argv_size(["devin", *pieces])


def test_the_environment_counts_against_the_budget() -> None:
    argv = ["devin"] + ["x" * 1000] * (arg_max() // 2000)
    check_argv_size(argv, env={})
    with pytest.raises(InvalidRequest):
        check_argv_size(argv, env={"BIG": "y" * (arg_max() // 2 + 1000)})


STDIN_PROVIDERS = ("claude", "codex", "devin")  # the prompt on stdin, never in argv (#23 item 11)


@pytest.mark.parametrize(("name", "binary"), [d for d in DIALECTS
                                              if d[0] not in STDIN_PROVIDERS])
def test_a_prompt_too_big_for_the_command_line_is_refused_before_spawning(
    name: str, binary: str,
) -> None:
    adapter = provider(name)
    huge = "word " * (arg_max() // 4)
    with pytest.raises(InvalidRequest, match="Shorten the prompt"):
        adapter.build_invocation(request(adapter, {}, prompt=huge), binary)


@pytest.mark.parametrize("name", STDIN_PROVIDERS)
def test_stdin_providers_take_a_prompt_of_any_size(name: str) -> None:
    adapter = provider(name)
    huge = "word " * (arg_max() // 4)
    invocation = adapter.build_invocation(request(adapter, {}, prompt=huge),
                                          adapter.commands[0])
    assert invocation.stdin == huge.encode()
    assert all(len(a) < 1000 for a in invocation.argv)


# Whitespace a caller can put before a flag: the adapters strip the model, and CLIs trim
# (JavaScript's trim() also drops U+FEFF; U+200B renders as nothing).
HIDING_PREFIXES = ["  ", "\t", "\n", "\r\n ", "\u00a0", "\u2003", "\u200b", "\ufeff"]


@pytest.mark.parametrize(("name", "binary"), DIALECTS)
@pytest.mark.parametrize("prefix", HIDING_PREFIXES)
def test_flag_injection_through_leading_whitespace_is_refused_for_every_option(
    name: str, binary: str, prefix: str,
) -> None:
    adapter = provider(name)
    for flag in ("--yolo", "--dangerously-skip-permissions", "-x"):
        hidden = prefix + flag
        with pytest.raises(InvalidRequest, match=r"model .* starts with '-'"):
            adapter.build_invocation(request(adapter, {}, model=hidden), binary)
        with pytest.raises(InvalidRequest, match=r"model .* starts with '-'"):
            adapter.build_invocation(request(adapter, {}), binary, default_model=hidden)
        with pytest.raises(InvalidRequest, match=r"session_id .* starts with '-'"):
            adapter.build_invocation(request(adapter, {}, session_id=hidden), binary)
        list_fields = [n for n, f in adapter.options_model.model_fields.items()
                       if f.annotation == list[str]]
        for field_name in list_fields:
            with pytest.raises(InvalidRequest, match=f"options.{field_name} item"):
                adapter.build_invocation(request(adapter, {field_name: ["/ok", hidden]}),
                                         binary)


@pytest.mark.parametrize(("name", "binary"), DIALECTS)
def test_flag_injection_through_whitespace_never_reaches_a_fake_cli_as_a_flag(
    name: str, binary: str,
) -> None:
    """What is accepted is the value that is used: a padded model builds exactly the argv
    of the unpadded one, and no argv element is a flag hidden behind whitespace."""
    adapter = provider(name)
    plain = adapter.build_invocation(request(adapter, {}, model="m1"), binary)
    padded = adapter.build_invocation(request(adapter, {}, model="  m1\t"), binary)
    assert padded.argv == plain.argv
    assert not any(arg.strip() != arg and arg.strip().startswith("-") for arg in padded.argv)
