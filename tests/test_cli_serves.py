"""Which command lines serve (issue #45): serving builds serve's own parser only, so an MCP
client's first answer does not wait for every other command's imports. A command line the
quick look does not recognise goes to the whole parser, which owns its errors and help."""

from __future__ import annotations

import pytest

from gateway.cli.main import build_parser, serves


@pytest.mark.parametrize("argv", [
    [], ["serve"], ["serve", "--transport", "http", "--port", "9"], ["--config", "c.toml"],
    ["--config=c.toml", "serve"], ["--debug"], ["--debug", "--config", "c.toml", "serve"],
    ["--config", "serve"],  # the value of --config, not the command: still serving
])
def test_serving_command_lines(argv: list[str]) -> None:
    assert serves(argv)


@pytest.mark.parametrize("argv", [
    ["doctor"], ["jobs", "list"], ["--config", "c.toml", "doctor"], ["--help"], ["-h"],
    ["--version"], ["srve"], ["--conf", "c.toml"], ["--debug", "usage"],
])
def test_other_command_lines_get_the_whole_parser(argv: list[str]) -> None:
    assert not serves(argv)


def test_the_serving_parser_reads_serve_exactly_as_the_whole_one() -> None:
    argv = ["--config", "c.toml", "serve", "--transport", "http", "--host", "127.0.0.1",
            "--port", "8765", "--no-auth", "--debug"]
    whole, serving = build_parser().parse_args(argv), build_parser(commands=False).parse_args(argv)
    assert vars(serving) == vars(whole)
    assert vars(build_parser(commands=False).parse_args([])) == vars(build_parser().parse_args([]))
