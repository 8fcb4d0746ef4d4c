"""Golden tests of the argv each adapter builds.

Every flag an adapter can emit, for every combination of its options, a session and a
model, must be one the real CLI's help lists (the help snapshots, as the fakes' flag
tables), with a value the help allows, and the prompt must arrive exactly where the CLI
reads it — even a prompt that looks like a flag.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from providers.base import InvalidRequest
from tests.fakes.argv_cases import (
    DIALECTS,
    MODEL_VALUES,
    SESSION_VALUES,
    load_fakecli,
    option_sets,
    provider,
    request,
)

fakecli = load_fakecli()

FLAG_LIKE_PROMPT = "--model evil --output-format text -- -p=x review this"
REPO_ROOT = Path(__file__).resolve().parents[2]


def parse_like_the_cli(binary: str, argv: list[str], stdin: bytes | None,
                       monkeypatch: pytest.MonkeyPatch) -> Any:
    """The fake's reading of `argv` (its parser knows exactly the snapshot's flags)."""
    monkeypatch.setattr(fakecli, "read_stdin", lambda: (stdin or b"").decode())
    run, code = fakecli.build_run(binary, argv[1:])
    assert run is not None, f"{binary} would refuse {argv} (exit {code})"
    return run


@pytest.mark.parametrize(("name", "binary"), DIALECTS)
def test_every_emitted_flag_is_in_the_help_snapshot_for_every_option_combination(
    name: str, binary: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    adapter = provider(name)
    checked = 0
    for options in option_sets(adapter):
        for session_id in SESSION_VALUES:
            for model in MODEL_VALUES:
                req = request(adapter, options, prompt=FLAG_LIKE_PROMPT,
                              session_id=session_id, model=model)
                if name == "codex" and session_id and options.get("add_dirs"):
                    with pytest.raises(InvalidRequest, match="add_dirs"):
                        adapter.build_invocation(req, binary)
                    continue
                invocation = adapter.build_invocation(req, binary)
                try:
                    run = parse_like_the_cli(binary, invocation.argv, invocation.stdin,
                                             monkeypatch)
                except fakecli.UsageError as exc:
                    pytest.fail(f"{invocation.argv}: {exc}")
                assert run.prompt == FLAG_LIKE_PROMPT, invocation.argv
                if session_id and name not in ("mistral", "devin"):
                    assert run.session_id == session_id, invocation.argv
                checked += 1
    assert checked > 0


@pytest.mark.parametrize(("name", "binary"), DIALECTS)
def test_config_extra_args_come_before_the_prompt_boundary(name: str, binary: str) -> None:
    adapter = provider(name)
    invocation = adapter.build_invocation(request(adapter, {}), binary,
                                          extra_args=["--extra-flag", "value"])
    argv = invocation.argv
    position = argv.index("--extra-flag")
    assert argv[position + 1] == "value"
    if "--" in argv:
        assert position < argv.index("--")
    elif invocation.stdin is None:  # inline prompt: the last element
        assert position < len(argv) - 1 and "say hi" in argv[-1]


GOLDEN: list[tuple[str, str, dict[str, Any], str | None, str | None, list[str], bytes | None]] = [
    ("claude", "claude", {}, None, None,
     ["claude", "--print", "--output-format", "stream-json", "--verbose",
      "--include-partial-messages"], b"say hi"),
    ("claude", "claude", {"output_format": "json", "permission_mode": "plan",
                          "add_dirs": ["/tmp"]}, "sess-1", "opus",
     ["claude", "--print", "--output-format", "json", "--model", "opus", "--permission-mode",
      "plan", "--add-dir", "/tmp", "--resume", "sess-1"], b"say hi"),
    ("codex", "codex", {}, None, None,
     ["codex", "exec", "--json", "--skip-git-repo-check", "--", "-"], b"say hi"),
    ("codex", "codex", {"sandbox": "workspace-write"}, "sess-1", "gpt-5.5",
     ["codex", "exec", "resume", "--json", "--skip-git-repo-check", "--model", "gpt-5.5",
      "--config", 'sandbox_mode="workspace-write"', "--", "sess-1", "-"], b"say hi"),
    ("gemini", "agy", {"approval_mode": "auto_edit"}, "sess-1", None,
     ["agy", "--mode", "accept-edits", "--conversation", "sess-1", "--print=say hi"], None),
    ("gemini", "/usr/local/bin/gemini", {"approval_mode": "yolo", "output_format": "json"},
     None, "gemini-2.5-pro",
     ["/usr/local/bin/gemini", "--model", "gemini-2.5-pro", "--approval-mode", "yolo",
      "--output-format", "json", "--prompt=say hi"], None),
    ("grok", "grok", {"always_approve": True}, "sess-1", None,
     ["grok", "--output-format", "streaming-json", "--always-approve", "--resume", "sess-1",
      "-p=say hi"], None),
    ("mistral", "vibe", {"agent": "accept-edits", "trust_workspace": True}, None, None,
     ["vibe", "--agent", "accept-edits", "--trust", "--prompt=say hi"], None),
    ("devin", "devin", {"permission_mode": "accept-edits"}, None, "swe-1.5",
     ["devin", "--print", "--model", "swe-1.5", "--permission-mode", "accept-edits",
      "--prompt-file", "/dev/stdin"], b"say hi"),
    ("cursor", "cursor-agent", {"mode": "plan", "force": True}, "sess-1", None,
     ["cursor-agent", "--print", "--output-format", "json", "--mode", "plan", "--force",
      "--resume", "sess-1", "--", "say hi"], None),
]


@pytest.mark.parametrize(("name", "command", "options", "session_id", "model", "argv", "stdin"),
                         GOLDEN, ids=[f"{g[0]}-{i}" for i, g in enumerate(GOLDEN)])
def test_golden_argv(name: str, command: str, options: dict[str, Any], session_id: str | None,
                     model: str | None, argv: list[str], stdin: bytes | None) -> None:
    adapter = provider(name)
    invocation = adapter.build_invocation(
        request(adapter, options, session_id=session_id, model=model), command)
    assert invocation.argv == argv
    assert invocation.stdin == stdin


# Where the prompt travels, per provider (#23 item 11): argv is visible to every local user
# (`ps`), stdin is not. The CLIs whose help (tests/fakes, the help snapshots) offers no
# stdin or prompt-file form keep it in argv; docs/providers.md lists them.
PROMPT_IN_ARGV = {"gemini", "grok", "mistral", "cursor"}


@pytest.mark.parametrize("name", ["claude", "codex", "gemini", "grok", "mistral", "devin",
                                  "cursor"])
def test_prompts_stay_out_of_argv_where_a_cli_can_read_stdin_or_a_file(name: str) -> None:
    adapter = provider(name)
    secret = "the-prompt-text-4711"
    invocation = adapter.build_invocation(request(adapter, {}, prompt=secret),
                                          adapter.commands[0])
    in_argv = any(secret in arg for arg in invocation.argv)
    assert in_argv == (name in PROMPT_IN_ARGV), invocation.argv
    if not in_argv:
        assert invocation.stdin == secret.encode()


def test_mistral_passes_the_model_in_the_environment_not_as_a_flag() -> None:
    adapter = provider("mistral")
    invocation = adapter.build_invocation(request(adapter, {}, model="devstral-2"), "vibe")
    assert invocation.env == {"VIBE_ACTIVE_MODEL": "devstral-2"}
    assert not any("devstral" in a for a in invocation.argv)
    assert adapter.build_invocation(request(adapter, {}), "vibe").env == {}


@pytest.mark.parametrize("name", ["claude", "codex", "gemini", "grok", "devin", "cursor"])
def test_model_flag_only_when_a_model_or_default_is_given(name: str) -> None:
    adapter = provider(name)
    command = adapter.commands[0]
    assert "--model" not in adapter.build_invocation(request(adapter, {}), command).argv
    with_default = adapter.build_invocation(request(adapter, {}), command, default_model="m-d")
    assert with_default.argv[with_default.argv.index("--model") + 1] == "m-d"
    explicit = adapter.build_invocation(request(adapter, {}, model="m-x"), command,
                                        default_model="m-d")
    assert explicit.argv[explicit.argv.index("--model") + 1] == "m-x"
    aliased = adapter.build_invocation(request(adapter, {}, model="default"), command,
                                       default_model="m-d")
    assert aliased.argv[aliased.argv.index("--model") + 1] == "m-d"
    assert "--model" not in adapter.build_invocation(
        request(adapter, {}, model="latest"), command).argv


def test_gemini_dialect_follows_the_command_name() -> None:
    adapter = provider("gemini")
    req = request(adapter, {"approval_mode": "plan"}, session_id="s-1")
    agy = adapter.build_invocation(req, "/opt/x/agy").argv
    gemini = adapter.build_invocation(req, "/opt/x/gemini").argv
    assert agy[1:] == ["--mode", "plan", "--conversation", "s-1", "--print=say hi"]
    assert gemini[1:] == ["--approval-mode", "plan", "--resume", "s-1", "--prompt=say hi"]


# -- the fakes' flag tables are the snapshots ----------------------------------------------

# ../shared beside the checkout (a worktree's parent too); CLI_HELP_SNAPSHOTS names another.
SNAPSHOT_DIRS = (REPO_ROOT.parent / "shared" / "reference" / "cli-help-snapshots",)
SNAPSHOT_OF = {"claude": ("claude", None), "codex exec": ("codex", "exec"),
               "codex exec resume": ("codex", "exec resume"), "agy": ("gemini", None),
               "grok": ("grok", None), "vibe": ("mistral", None), "devin": ("devin", None),
               "cursor-agent": ("cursor", None)}


def _snapshot_dir() -> Path | None:
    env = os.environ.get("CLI_HELP_SNAPSHOTS")
    for candidate in ((Path(env),) if env else ()) + SNAPSHOT_DIRS:
        if (candidate / "claude.json").is_file():
            return candidate
    return None


@pytest.mark.parametrize("table", sorted(SNAPSHOT_OF))
def test_fake_flag_tables_are_exactly_the_help_snapshots(table: str) -> None:
    directory = _snapshot_dir()
    if directory is None:
        pytest.skip("help snapshots (shared/reference/cli-help-snapshots) not found")
    cli, sub = SNAPSHOT_OF[table]
    snapshot = json.loads((directory / f"{cli}.json").read_text())
    surface = snapshot["subcommands"][sub] if sub else snapshot["helpSurface"]
    assert set(fakecli.FLAGS[table]) == set(surface["discoveredFlags"])
