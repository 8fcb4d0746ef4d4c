"""The shared core of the fake provider CLIs in tests/fakes/bin (protocol: tests/fakes/README.md).

Each fake parses its argv the way the real CLI would for the calls our adapters make:
it knows exactly the flags the real CLI's help lists (FLAGS below, copied from the help
snapshots; tests/fakes/test_fakes.py checks they still match), which of them take a value,
and the allowed values where the real help names them. An unknown flag exits 2 with
"error: unknown option '<flag>'". It reads the prompt from where the real CLI does, prints
the real CLI's output format and obeys directives found in the prompt (@sleep, @until, @stream,
@bytes, @tokens, @cost, @enospc-retry, @exit, @auth, @stderr, @ignore-term, @grandchild, @late).

Stdlib only and few imports: the job tests spawn these hundreds of times.
"""

from __future__ import annotations

import errno
import json
import os
import runpy
import signal
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

CHUNK = 64 * 1024  # @bytes filler is written in chunks of this size
DEFAULT_STREAM_INTERVAL_S = 0.05  # @stream=N without :I

# -- flag tables ---------------------------------------------------------------------------
# Arity: 0 = boolean, 1 = takes a value, "?" = optional value, "*" = one or more values.
# Long flags are exactly the snapshot's `discoveredFlags` (root, or `exec` / `exec resume`
# for codex; gemini-cli's from `gemini --help` 0.61.0); SHORT maps the short aliases the
# real help lists to their long flag. `--version` is accepted everywhere.


Arity = int | str  # 0, 1, "?" or "*"


def _table(flags: str, valued: str = "", optional: str = "",
           variadic: str = "") -> dict[str, Arity]:
    table: dict[str, Arity] = {f: 0 for f in flags.split()}
    for names, arity in ((valued, 1), (optional, "?"), (variadic, "*")):
        for name in names.split():
            if name not in table:
                raise AssertionError(f"{name} is not in the flag list")
            table[name] = arity
    return table


FLAGS: dict[str, dict[str, Arity]] = {
    "claude": _table(
        "--add-dir --agent --agents --allow-dangerously-skip-permissions --allowed "
        "--allowed-tools --append-system-prompt --autocompact --ax-screen-reader --background "
        "--bare --betas --bg --brief --chrome --cloud --continue --dangerously-skip-permissions "
        "--debug --debug-file --disable-slash-commands --disallowed --disallowed-tools --effort "
        "--environment --exclude-dynamic-system-prompt-sections --fallback-model --file "
        "--fork-session --forward-subagent-text --from-pr --ide --include-hook-events "
        "--include-partial-messages --input-format --json-schema --max-budget-usd --mcp-config "
        "--model --name --no-chrome --no-session-persistence --output-format --permission-mode "
        "--plugin-dir --plugin-url --print --prompt-suggestions --remote-control "
        "--remote-control-session-name-prefix --replay-user-messages --resume --safe-mode "
        "--session-id --setting-sources --settings --strict-mcp-config --system-prompt "
        "--teleport --tmux --tools --verbose --version --worktree",
        valued="--agent --agents --append-system-prompt --autocompact --debug-file --effort "
               "--environment --fallback-model --input-format --json-schema --max-budget-usd "
               "--model --name --output-format --permission-mode --plugin-dir --plugin-url "
               "--remote-control-session-name-prefix --session-id --setting-sources --settings "
               "--system-prompt",
        optional="--cloud --debug --from-pr --prompt-suggestions --remote-control --resume "
                 "--teleport --worktree",
        variadic="--add-dir --allowed --allowed-tools --betas --disallowed --disallowed-tools "
                 "--file --mcp-config --tools",
    ),
    "codex exec": _table(
        "--add-dir --approve-for-me --cd --color --config --dangerously-bypass-approvals-and-sandbox "
        "--dangerously-bypass-hook-trust --disable --enable --ephemeral --ignore-rules "
        "--ignore-user-config --image --json --local-provider --model --oss "
        "--output-last-message --output-schema --profile --sandbox --skip-git-repo-check "
        "--strict-config --version",
        valued="--add-dir --cd --color --config --disable --enable --local-provider --model "
               "--output-last-message --output-schema --profile --sandbox",
        variadic="--image",
    ),
    "codex exec resume": _table(
        "--all --config --dangerously-bypass-approvals-and-sandbox --dangerously-bypass-hook-trust "
        "--disable --enable --ephemeral --ignore-rules --ignore-user-config --image --json "
        "--last --model --output-last-message --output-schema --skip-git-repo-check "
        "--strict-config",
        valued="--config --disable --enable --image --model --output-last-message --output-schema",
    ),
    "agy": _table(
        "--add-dir --agent --continue --conversation --dangerously-skip-permissions "
        "--disable-slash-commands --effort --json-schema --log-file --mode --model --new-project "
        "--output-format --print --print-timeout --project --prompt --prompt-interactive "
        "--sandbox",
        valued="--add-dir --agent --conversation --effort --json-schema --log-file --mode "
               "--model --output-format --print --print-timeout --project --prompt "
               "--prompt-interactive",
    ),
    "gemini": _table(
        "--debug --model --prompt --prompt-interactive --skip-trust --worktree --sandbox --yolo "
        "--approval-mode --policy --admin-policy --acp --experimental-acp "
        "--allowed-mcp-server-names --allowed-tools --extensions --list-extensions --resume "
        "--session-file --session-id --list-sessions --delete-session --include-directories "
        "--screen-reader --output-format --raw-output --accept-raw-output-risk --version",
        valued="--model --prompt --prompt-interactive --approval-mode --resume --session-file "
               "--session-id --delete-session --output-format",
        optional="--worktree",
        variadic="--policy --admin-policy --allowed-mcp-server-names --allowed-tools "
                 "--extensions --include-directories",
    ),
    "grok": _table(
        "--agent --agents --allow --always-approve --continue --cwd --debug --debug-file --deny "
        "--disable-web-search --disallowed-tools --experimental-memory --fork-session "
        "--fullscreen --include-partial-messages --json-schema --leader-socket --max-turns "
        "--minimal --model --no-alt-screen --no-memory --no-plan --no-subagents --oauth "
        "--output-format --permission-mode --prompt-file --prompt-json --reasoning-effort "
        "--restore-code --resume --rules --sandbox --session-id --single "
        "--system-prompt-override --tools --verbatim --version --worktree --worktree-ref",
        valued="--agent --agents --allow --cwd --debug-file --deny --disallowed-tools "
               "--json-schema --leader-socket --max-turns --model --output-format "
               "--permission-mode --prompt-file --prompt-json --reasoning-effort --resume "
               "--rules --sandbox --session-id --single --system-prompt-override --tools "
               "--worktree-ref",
        optional="--worktree",
    ),
    "vibe": _table(
        "--add-dir --agent --auto-approve --check-upgrade --continue --disabled-tools "
        "--enabled-tools --max-price --max-tokens --max-turns --output --prompt --resume "
        "--setup --trust --version --workdir --worktree --yolo",
        valued="--add-dir --agent --disabled-tools --enabled-tools --max-price --max-tokens "
               "--max-turns --output --workdir",
        optional="--prompt --resume --worktree",
    ),
    "devin": _table(
        "--config --continue --export --model --permission-mode --print --prompt-file "
        "--respect-workspace-trust --resume --sandbox --version",
        valued="--config --model --permission-mode --prompt-file --respect-workspace-trust "
               "--resume",
        optional="--export",
    ),
    "cursor-agent": _table(
        "--add-dir --api-key --approve-mcps --auto-review --continue --endpoint --force "
        "--header --list-models --mode --model --output-format --plan --plugin-dir --print "
        "--resume --sandbox --skip-worktree-setup --stream-partial-output --trust --version "
        "--workspace --worktree --worktree-base --yolo",
        valued="--add-dir --api-key --endpoint --header --mode --model --output-format "
               "--plugin-dir --sandbox --workspace --worktree-base",
        optional="--resume --worktree",
    ),
}

SHORT: dict[str, dict[str, str]] = {
    "claude": {"-p": "--print", "-c": "--continue", "-d": "--debug", "-r": "--resume",
               "-n": "--name", "-w": "--worktree", "-v": "--version"},
    "codex exec": {"-c": "--config", "-i": "--image", "-m": "--model", "-p": "--profile",
                   "-s": "--sandbox", "-C": "--cd", "-o": "--output-last-message",
                   "-V": "--version"},
    "codex exec resume": {"-c": "--config", "-i": "--image", "-m": "--model",
                          "-o": "--output-last-message"},
    "agy": {"-p": "--print", "-c": "--continue"},
    "gemini": {"-d": "--debug", "-m": "--model", "-p": "--prompt", "-i": "--prompt-interactive",
               "-w": "--worktree", "-s": "--sandbox", "-y": "--yolo", "-e": "--extensions",
               "-l": "--list-extensions", "-r": "--resume", "-o": "--output-format",
               "-v": "--version"},
    "grok": {"-p": "--single", "-m": "--model", "-r": "--resume", "-c": "--continue",
             "-s": "--session-id"},
    "vibe": {"-p": "--prompt", "-c": "--continue", "-v": "--version"},
    "devin": {"-p": "--print", "-c": "--continue", "-r": "--resume"},
    "cursor-agent": {"-p": "--print", "-f": "--force", "-c": "--continue"},
}

# Allowed values, where the real help names them.
CHOICES: dict[str, dict[str, tuple[str, ...]]] = {
    "claude": {
        "--output-format": ("text", "json", "stream-json"),
        "--input-format": ("text", "stream-json"),
        "--permission-mode": ("acceptEdits", "auto", "bypassPermissions", "manual", "dontAsk",
                              "plan"),
    },
    "codex exec": {"--sandbox": ("read-only", "workspace-write", "danger-full-access"),
                   "--color": ("always", "never", "auto")},
    "codex exec resume": {},
    "agy": {"--output-format": ("text", "json", "stream-json")},
    "gemini": {"--approval-mode": ("default", "auto_edit", "yolo", "plan"),
               "--output-format": ("text", "json", "stream-json")},
    "grok": {"--output-format": ("plain", "json", "streaming-json"),
             "--permission-mode": ("default", "acceptEdits", "auto", "dontAsk",
                                   "bypassPermissions", "plan")},
    "vibe": {"--output": ("text", "json", "streaming")},
    "devin": {"--permission-mode": ("auto", "accept-edits", "smart", "dangerous")},
    "cursor-agent": {"--output-format": ("text", "json", "stream-json"),
                     "--mode": ("plan", "ask"), "--sandbox": ("enabled", "disabled")},
}

PROVIDER_OF = {"claude": "claude", "codex": "codex", "agy": "gemini", "gemini": "gemini",
               "grok": "grok", "vibe": "mistral", "devin": "devin",
               "cursor-agent": "cursor"}


class UsageError(Exception):
    """A command line the real CLI would refuse (exit 2)."""


# -- argv parsing --------------------------------------------------------------------------


# A parsed command line: each long flag given and its values, in order (a string each, or
# True for an optional value given bare).
Flags = dict[str, list[Any]]


def parse(table_name: str, args: list[str]) -> tuple[Flags, list[str]]:
    """Parse `args` against one flag table: ({long flag: [values]}, positionals)."""
    table, shorts = FLAGS[table_name], SHORT.get(table_name, {})
    choices = CHOICES.get(table_name, {})
    flags: Flags = {}
    positionals: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            positionals.extend(args[i:])
            break
        if not arg.startswith("-") or arg == "-":
            positionals.append(arg)
            continue
        given, eq, inline = arg.partition("=")
        name = _long_name(given, table, shorts)
        values = flags.setdefault(name, [])
        i = _take_values(name, table.get(name, 0), inline if eq else None, args, i, values)
        _check_choices(name, values, choices.get(name))
    return flags, positionals


def _long_name(given: str, table: dict[str, Arity], shorts: dict[str, str]) -> str:
    """The long flag `given` (a long or a short one) names; UsageError for an unknown one."""
    name = given
    if not name.startswith("--"):
        if name not in shorts:
            raise UsageError(f"error: unknown option '{name}'")
        name = shorts[name]
    if name not in table and name != "--version":
        raise UsageError(f"error: unknown option '{name}'")
    return name


def _take_values(name: str, arity: Arity, inline: str | None, args: list[str], i: int,
                 values: list[Any]) -> int:
    """Append the values flag `name` takes (`inline`: its `=value`; else from args[i:]),
    as the real CLIs' parsers do; return the index of the next argument."""
    if inline is not None:
        if arity == 0:
            raise UsageError(f"error: option '{name}' does not take a value")
        values.append(inline)
        return i
    if arity == 1:
        if i >= len(args):
            raise UsageError(f"error: option '{name}' argument missing")
        values.append(args[i])
        return i + 1
    if arity == "?":
        if i < len(args) and not args[i].startswith("-"):
            values.append(args[i])
            return i + 1
        values.append(True)
        return i
    if arity == "*":
        start = i
        while i < len(args) and not args[i].startswith("-"):
            values.append(args[i])
            i += 1
        if i == start:
            raise UsageError(f"error: option '{name}' argument missing")
        return i
    values.append(True)
    return i


def _check_choices(name: str, values: list[Any], allowed: tuple[str, ...] | None) -> None:
    if not allowed:
        return
    for value in values:
        if value not in allowed:
            raise UsageError(f"error: option '{name}' argument '{value}' is invalid. "
                             f"Allowed choices are {', '.join(allowed)}.")


def last(flags: Flags, name: str, default: Any = None) -> Any:
    values = flags.get(name)
    return values[-1] if values else default


# -- directives ----------------------------------------------------------------------------


def directives(prompt: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for token in prompt.split():
        if token.startswith("@") and len(token) > 1:
            key, _, value = token[1:].partition("=")
            found[key] = value
    return found


# -- output helpers ------------------------------------------------------------------------


def out(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def line(obj: object) -> None:
    out(json.dumps(obj, separators=(",", ":")) + "\n")


def err(text: str) -> None:
    sys.stderr.write(text if text.endswith("\n") else text + "\n")
    sys.stderr.flush()


def new_session_id() -> str:
    h = os.urandom(16).hex()
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-a{h[17:20]}-{h[20:32]}"


def log_invocation(record: dict[str, Any]) -> None:
    path = os.environ.get("FAKE_CLI_LOG")
    if not path:
        return
    data = (json.dumps(record) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def read_stdin() -> str:
    try:
        return sys.stdin.read()
    except (OSError, ValueError):
        return ""


# -- the run -------------------------------------------------------------------------------


# What a CLI's argument parser decided: the run to perform, or None and the exit code.
Answered = tuple["Run | None", int]


class Run:
    """One invocation: where the prompt came from, its format, and its directives."""

    def __init__(self, binary: str, prompt: str, fmt: str, session_id: str | None) -> None:
        self.binary = binary
        self.provider = PROVIDER_OF[binary]
        self.prompt = prompt
        self.fmt = fmt
        self.session_id = session_id or new_session_id()
        self.d = directives(prompt)
        self.answer = f"fake-{self.provider} answer: {prompt}"
        self.started = False  # the stream's opening events (init, thread.started) are out

    def usage(self) -> tuple[int, int]:
        if "tokens" in self.d:  # @tokens=IN:OUT
            tokens_in, _, tokens_out = self.d["tokens"].partition(":")
            return int(tokens_in), int(tokens_out)
        return len(self.prompt.split()) + 3, len(self.answer.split())

    def cost(self, default: float) -> float:
        return float(self.d["cost"]) if "cost" in self.d else default


def setup_signals(run: Run) -> None:
    if "ignore-term" in run.d:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif "late" in run.d:
        late = int(run.d["late"] or 0)

        def on_term(signum: int, frame: FrameType | None) -> None:
            try:
                sys.stdout.flush()
                remaining = late
                while remaining > 0:
                    n = min(CHUNK, remaining)
                    chunk = b"L" * (n - 1) + b"\n"
                    os.write(1, chunk)
                    remaining -= n
            finally:
                os._exit(143)

        signal.signal(signal.SIGTERM, on_term)


def spawn_grandchild(run: Run) -> None:
    seconds = float(run.d["grandchild"] or 30)
    pid = os.fork()
    if pid == 0:  # the grandchild: same process group, outlives its parent
        try:
            signal.signal(signal.SIGTERM,
                          signal.SIG_IGN if "ignore-term" in run.d else signal.SIG_DFL)
            time.sleep(seconds)
        finally:
            os._exit(0)
    log_invocation({"grandchild_pid": pid, "parent_pid": os.getpid()})


def write_filler(count: int, retry_enospc: bool = False) -> None:
    remaining = count
    while remaining > 0:
        n = min(CHUNK, remaining)
        data = "x" * (n - 1) + "\n" if n == remaining else "x" * n
        if retry_enospc:  # as a CLI that ignores write errors: raw writes, retried forever
            view = memoryview(data.encode())
            while view:
                try:
                    view = view[os.write(1, view):]
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    time.sleep(0.05)
        else:
            out(data)
        remaining -= n


def write_files(run: Run) -> None:
    """`@write=a.txt,sub/b.txt`: write each file (relative to the cwd) like an agent editing
    its checkout: one line naming the fake and its pid, appended."""
    for name in run.d["write"].split(","):
        path = os.path.join(os.getcwd(), name)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "a") as fh:
            fh.write(f"written by fake-{run.provider} pid {os.getpid()}\n")


def stream_settings(run: Run) -> tuple[int, float]:
    count, _, interval = run.d.get("stream", "").partition(":")
    return (int(count or 0), float(interval) if interval else DEFAULT_STREAM_INTERVAL_S)


def main(binary: str) -> None:
    """Entry point of tests/fakes/bin/<binary>."""
    try:
        run, exit_code = build_run(binary, sys.argv[1:])
    except UsageError as exc:
        err(str(exc))
        sys.exit(2)
    if run is None:  # --version
        log_invocation({"binary": binary, "version_probe": True, "env": dict(os.environ)})
        sys.exit(exit_code)
    # Signal handlers first: once the log line exists, a test may send SIGTERM.
    setup_signals(run)
    log_invocation({"provider": run.provider, "binary": binary, "argv": sys.argv,
                    "pid": os.getpid(), "pgid": os.getpgid(0), "cwd": os.getcwd(),
                    "prompt": run.prompt, "t": time.time(), "env": dict(os.environ)})
    if "stderr" in run.d:
        err(run.d["stderr"])
    if "grandchild" in run.d:
        spawn_grandchild(run)
    if run.d.get("sleep"):
        time.sleep(float(run.d["sleep"]))
    while run.d.get("until") and not os.path.exists(run.d["until"]):
        time.sleep(0.01)  # the test says when: no guess at how long its checks take
    if run.d.get("write"):
        write_files(run)
    if run.d.get("script"):
        # `@script=FILE`: run a Python file in this process, in the cwd, as an agent's own
        # commands (tampering with its worktree, planting git config): what a job did. The
        # script sees this run as `fake_run` (it may set fake_run.answer: a judge's verdict).
        runpy.run_path(run.d["script"], init_globals={"fake_run": run},
                       run_name="__fake_script__")
    try:
        if "auth" in run.d:
            code = AUTH[run.binary](run)
            sys.exit(code)
        count, interval = stream_settings(run)
        for k in range(count):
            PROGRESS[run.binary](run, k + 1, count)
            time.sleep(interval)
        if run.d.get("bytes"):
            write_filler(int(run.d["bytes"]), "enospc-retry" in run.d)
        ANSWER[run.binary](run)
    except BrokenPipeError:
        os._exit(141)
    sys.exit(int(run.d["exit"]) if run.d.get("exit") else 0)


def build_run(binary: str, args: list[str]) -> tuple[Run | None, int]:
    """Parse argv like the real CLI; (None, code) when it answers without a run."""
    if binary == "codex":
        if args == ["--version"]:  # the real one answers at the root too
            out(f"{binary} 0.0.0-fake\n")
            return None, 0
        if args[:2] == ["login", "status"]:  # offline, like the real one: reads auth.json
            home = os.environ.get("CODEX_HOME") or os.path.expanduser("~/.codex")
            if os.path.exists(os.path.join(home, "auth.json")):
                out("Logged in using ChatGPT\n")
                return None, 0
            err("Not logged in\n")
            return None, 1
        if not args or args[0] != "exec":
            raise UsageError("error: the fake codex only implements `codex exec`")
        resume = len(args) > 1 and args[1] == "resume"
        table = "codex exec resume" if resume else "codex exec"
        flags, positionals = parse(table, args[2 if resume else 1:])
        if "--version" in flags:
            out(f"{binary} 0.0.0-fake\n")
            return None, 0
        return _prompt_codex(binary, flags, positionals, resume)
    else:
        table = binary
        flags, positionals = parse(table, args)
    if "--version" in flags:
        out(f"{binary} 0.0.0-fake\n")
        return None, 0
    return PROMPT[binary](binary, flags, positionals)


# -- per CLI: where the prompt is, and what it prints ----------------------------------------


def _prompt_claude(binary: str, flags: Flags, positionals: list[str]) -> Answered:
    if "--print" not in flags:
        raise UsageError("error: the fake claude only implements --print")
    fmt = last(flags, "--output-format", "text")
    if fmt == "stream-json" and "--verbose" not in flags:
        err("Error: When using --print, --output-format=stream-json requires --verbose")
        return None, 1
    prompt = " ".join(positionals) or read_stdin()
    if not prompt.strip():
        err("Error: Input must be provided either through stdin or as a prompt argument "
            "when using --print")
        return None, 1
    resume = last(flags, "--resume")
    return Run(binary, prompt, fmt, resume if isinstance(resume, str) else None), 0


def _prompt_codex(binary: str, flags: Flags, positionals: list[str], resume: bool) -> Answered:
    resume_id = None
    if resume:
        if not positionals:
            raise UsageError("error: codex exec resume needs a SESSION_ID or --last")
        resume_id, positionals = positionals[0], positionals[1:]
    if len(positionals) > 1:
        raise UsageError(f"error: unexpected argument '{positionals[1]}' found")
    prompt = positionals[0] if positionals else "-"
    if prompt == "-":
        prompt = read_stdin()
    if not prompt.strip():
        err("No prompt provided via stdin.")
        return None, 1
    return Run(binary, prompt, "json" if "--json" in flags else "text", resume_id), 0


def _prompt_agy(binary: str, flags: Flags, positionals: list[str]) -> Answered:
    prompt = last(flags, "--print") or last(flags, "--prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise UsageError("error: the fake agy only implements --print <prompt>")
    if positionals:
        raise UsageError(f"error: unexpected argument '{positionals[0]}'")
    return Run(binary, prompt, last(flags, "--output-format", "text"),
               last(flags, "--conversation")), 0


def _prompt_gemini(binary: str, flags: Flags, positionals: list[str]) -> Answered:
    prompt = last(flags, "--prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise UsageError("error: the fake gemini only implements --prompt <prompt>")
    if positionals:
        raise UsageError(f"error: unexpected argument '{positionals[0]}'")
    return Run(binary, prompt, last(flags, "--output-format", "text"),
               last(flags, "--resume")), 0


def _prompt_grok(binary: str, flags: Flags, positionals: list[str]) -> Answered:
    prompt = last(flags, "--single")
    if not isinstance(prompt, str) or not prompt.strip():
        raise UsageError("error: the fake grok only implements -p <prompt>")
    if positionals:
        raise UsageError(f"error: unexpected argument '{positionals[0]}'")
    return Run(binary, prompt, last(flags, "--output-format", "plain"),
               last(flags, "--resume")), 0


def _prompt_vibe(binary: str, flags: Flags, positionals: list[str]) -> Answered:
    prompt = last(flags, "--prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise UsageError("error: the fake vibe only implements --prompt=<prompt>")
    if positionals:
        raise UsageError(f"error: unexpected argument '{positionals[0]}'")
    resume = last(flags, "--resume")
    return Run(binary, prompt, last(flags, "--output", "text"),
               resume if isinstance(resume, str) else None), 0


def _prompt_after_dashdash(binary: str, flags: Flags, positionals: list[str]) -> Answered:
    if "--print" not in flags:
        raise UsageError(f"error: the fake {binary} only implements --print")
    prompt = " ".join(positionals)
    prompt_file = last(flags, "--prompt-file")
    if isinstance(prompt_file, str):  # devin: the prompt read from a file (/dev/stdin)
        if positionals:
            raise UsageError(f"error: the fake {binary} takes --prompt-file or a prompt, "
                             f"not both")
        if prompt_file == "/dev/stdin":  # the gateway's form: stdin, as the fake reads it
            prompt = read_stdin()
        else:
            with open(prompt_file, encoding="utf-8") as fh:
                prompt = fh.read()
    if not prompt.strip():
        err("Error: a prompt is required with --print")
        return None, 1
    resume = last(flags, "--resume")
    return Run(binary, prompt, last(flags, "--output-format", "text"),
               resume if isinstance(resume, str) else None), 0


PROMPT: dict[str, Callable[[str, Flags, list[str]], Answered]] = {
    "claude": _prompt_claude, "agy": _prompt_agy, "gemini": _prompt_gemini, "grok": _prompt_grok,
    "vibe": _prompt_vibe, "devin": _prompt_after_dashdash, "cursor-agent": _prompt_after_dashdash,
}


def _claude_result(run: Run, text: str, *, is_error: bool = False) -> dict[str, Any]:
    tokens_in, tokens_out = run.usage()
    return {
        "type": "result", "subtype": "success", "is_error": is_error, "duration_ms": 12,
        "duration_api_ms": 10, "num_turns": 1, "result": text, "stop_reason": "end_turn",
        "session_id": run.session_id, "total_cost_usd": 0 if is_error else run.cost(0.0042),
        "usage": {"input_tokens": 0 if is_error else tokens_in,
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0 if is_error else 7,
                  "output_tokens": 0 if is_error else tokens_out},
    }


def _claude_assistant(run: Run, text: str, **more: Any) -> dict[str, Any]:
    return {"type": "assistant", "session_id": run.session_id,
            "message": {"role": "assistant", "model": "fake-claude-model",
                        "content": [{"type": "text", "text": text}]}, **more}


def start_claude(run: Run) -> None:
    if not run.started:
        run.started = True
        line({"type": "system", "subtype": "init", "session_id": run.session_id,
              "model": "fake-claude-model", "cwd": os.getcwd(), "tools": []})


def answer_claude(run: Run) -> None:
    if run.fmt == "json":
        line(_claude_result(run, run.answer))
    elif run.fmt == "stream-json":
        start_claude(run)
        line(_claude_assistant(run, run.answer))
        line(_claude_result(run, run.answer))
    else:
        out(run.answer + "\n")


def progress_claude(run: Run, k: int, n: int) -> None:
    if run.fmt == "stream-json":
        start_claude(run)
        line({"type": "stream_event", "session_id": run.session_id,
              "event": {"type": "content_block_delta", "index": 0,
                        "delta": {"type": "thinking_delta", "thinking": f"progress {k}/{n}"}}})
    else:
        err(f"progress {k}/{n}")  # text/json print nothing on stdout until the end


def auth_claude(run: Run) -> int:
    text = "Not logged in · Please run /login"
    if run.fmt == "json":
        line(_claude_result(run, text, is_error=True))
    elif run.fmt == "stream-json":
        start_claude(run)
        line(_claude_assistant(run, text, error="authentication_failed",
                               is_api_error_message=True))
        line(_claude_result(run, text, is_error=True))
    else:
        out(text + "\n")
    return 1


def answer_codex(run: Run) -> None:
    if run.fmt != "json":
        out(run.answer + "\n")
        return
    tokens_in, tokens_out = run.usage()
    start_codex(run)
    line({"type": "item.completed",
          "item": {"id": "item_0", "type": "agent_message", "text": run.answer}})
    line({"type": "turn.completed", "usage": {"input_tokens": tokens_in,
                                              "cached_input_tokens": 5,
                                              "output_tokens": tokens_out}})


def start_codex(run: Run) -> None:
    if not run.started:
        run.started = True
        line({"type": "thread.started", "thread_id": run.session_id})
        line({"type": "turn.started"})


def progress_codex(run: Run, k: int, n: int) -> None:
    if run.fmt != "json":
        err(f"progress {k}/{n}")
        return
    start_codex(run)
    line({"type": "item.completed",
          "item": {"id": f"item_p{k}", "type": "reasoning", "text": f"progress {k}/{n}"}})


def auth_codex(run: Run) -> int:
    message = ("unexpected status 401 Unauthorized: Missing bearer or basic authentication in "
               "header, url: https://api.openai.com/v1/responses")
    err(f"ERROR: {message}")
    if run.fmt == "json":
        start_codex(run)
        line({"type": "error", "message": f"Reconnecting... 1/5 ({message})"})
        line({"type": "turn.failed", "error": {"message": message}})
    return 1


def answer_agy(run: Run) -> None:
    if run.fmt == "json":
        tokens_in, tokens_out = run.usage()
        line({"conversation_id": run.session_id, "status": "SUCCESS", "response": run.answer,
              "usage": {"input_tokens": tokens_in, "output_tokens": tokens_out,
                        "total_tokens": tokens_in + tokens_out}, "duration_seconds": 0.01})
    else:
        out(run.answer + "\n")


def auth_agy(run: Run) -> int:
    err("Error: not signed in. Run `agy` once interactively to sign in.")
    return 1


def answer_gemini(run: Run) -> None:
    tokens_in, tokens_out = run.usage()
    if run.fmt == "json":
        out(json.dumps({"session_id": run.session_id, "response": run.answer,
                        "stats": {"models": {"gemini-2.5-pro": {"tokens": {
                            "prompt": tokens_in, "candidates": tokens_out, "cached": 2,
                            "total": tokens_in + tokens_out}}}}}, indent=2) + "\n")
    elif run.fmt == "stream-json":
        line({"type": "init", "session_id": run.session_id, "model": "gemini-2.5-pro"})
        line({"type": "message", "role": "assistant", "content": run.answer})
        line({"type": "result", "status": "success"})
    else:
        out(run.answer + "\n")


def auth_gemini(run: Run) -> int:
    home = os.path.expanduser("~")
    message = (f"Please set an Auth method in your {home}/.gemini/settings.json or specify one "
               "of the following environment variables before running: GEMINI_API_KEY, "
               "GOOGLE_GENAI_USE_VERTEXAI, GOOGLE_GENAI_USE_GCA")
    if run.fmt == "json":
        err(json.dumps({"session_id": run.session_id,
                        "error": {"type": "Error", "message": message, "code": 41}}, indent=2))
    else:
        err(message)
    return 41


def answer_grok(run: Run) -> None:
    tokens_in, tokens_out = run.usage()
    usage = {"input_tokens": tokens_in, "cache_read_input_tokens": 4,
             "output_tokens": tokens_out, "total_tokens": tokens_in + tokens_out}
    if run.fmt == "json":
        out(json.dumps({"text": run.answer, "stopReason": "EndTurn",
                        "sessionId": run.session_id, "requestId": "req-fake",
                        "thought": "thinking", "usage": usage, "num_turns": 1}, indent=2) + "\n")
    elif run.fmt == "streaming-json":
        words = run.answer.split(" ")
        for i, word in enumerate(words):
            line({"type": "text", "data": word if i == 0 else " " + word})
        line({"type": "end", "stopReason": "EndTurn", "sessionId": run.session_id,
              "requestId": "req-fake", "usage": usage, "num_turns": 1,
              "modelUsage": {"grok-4.5": {"inputTokens": tokens_in,
                                          "outputTokens": tokens_out}}})
    else:
        out(run.answer + "\n")


def progress_grok(run: Run, k: int, n: int) -> None:
    if run.fmt == "streaming-json":
        line({"type": "thought", "data": f"progress {k}/{n} "})
    else:
        err(f"progress {k}/{n}")


def auth_grok(run: Run) -> int:
    err("Error: not authenticated. Run `grok login` or set XAI_API_KEY.")
    return 1


def _vibe_entry(role: str, text: str, number: int) -> dict[str, Any]:
    return {"id": f"entry-{number}", "type": "message", "role": role,
            "generationStatus": "completed", "content": [{"type": "text", "text": text}]}


def answer_vibe(run: Run) -> None:
    entries = [_vibe_entry("user", run.prompt, 1), _vibe_entry("assistant", run.answer, 2)]
    if run.fmt == "json":
        out(json.dumps(entries, indent=2) + "\n")
    elif run.fmt == "streaming":
        for entry in entries:
            line(entry)
    else:
        out(run.answer + "\n")


def auth_vibe(run: Run) -> int:
    err("Error: Missing MISTRAL_API_KEY environment variable for mistral provider. Set the "
        "environment variable (e.g. in ~/.vibe/.env or your shell), or run `vibe --setup` "
        "once interactively.")
    return 1


def answer_plain(run: Run) -> None:
    out(run.answer + "\n")


def progress_plain(run: Run, k: int, n: int) -> None:
    out(f"fake-{run.provider} progress {k}/{n}\n")


def auth_devin(run: Run) -> int:
    err("Error: Not logged in. Run `devin auth login` to authenticate.")
    return 1


def answer_cursor(run: Run) -> None:
    if run.fmt == "json":
        line({"type": "result", "subtype": "success", "is_error": False, "duration_ms": 11,
              "duration_api_ms": 11, "result": run.answer, "session_id": run.session_id,
              "request_id": "req-fake"})
    elif run.fmt == "stream-json":
        line({"type": "system", "subtype": "init", "session_id": run.session_id,
              "model": "fake-cursor-model", "cwd": os.getcwd()})
        line({"type": "user", "session_id": run.session_id,
              "message": {"role": "user", "content": [{"type": "text", "text": run.prompt}]}})
        line({"type": "assistant", "session_id": run.session_id,
              "message": {"role": "assistant", "content": [{"type": "text", "text": run.answer}]}})
        line({"type": "result", "subtype": "success", "is_error": False, "duration_ms": 11,
              "result": run.answer, "session_id": run.session_id, "request_id": "req-fake"})
    else:
        out(run.answer + "\n")


def progress_cursor(run: Run, k: int, n: int) -> None:
    if run.fmt == "stream-json":
        line({"type": "thinking", "subtype": "delta", "session_id": run.session_id,
              "text": f"progress {k}/{n}"})
    elif run.fmt == "json":
        err(f"progress {k}/{n}")
    else:
        progress_plain(run, k, n)


def auth_cursor(run: Run) -> int:
    err("Error: Authentication required. Please run 'cursor-agent login' first, or set "
        "CURSOR_API_KEY environment variable.")
    return 1


def progress_json_at_exit(run: Run, k: int, n: int) -> None:
    """CLIs whose JSON is one document at exit: progress goes to plain lines (text) or
    stderr (json), so the document stays parseable."""
    if run.fmt == "text":
        progress_plain(run, k, n)
    else:
        err(f"progress {k}/{n}")


ANSWER = {"claude": answer_claude, "codex": answer_codex, "agy": answer_agy,
          "gemini": answer_gemini, "grok": answer_grok, "vibe": answer_vibe,
          "devin": answer_plain, "cursor-agent": answer_cursor}
PROGRESS = {"claude": progress_claude, "codex": progress_codex, "agy": progress_json_at_exit,
            "gemini": progress_json_at_exit, "grok": progress_grok,
            "vibe": progress_json_at_exit, "devin": progress_plain,
            "cursor-agent": progress_cursor}
AUTH = {"claude": auth_claude, "codex": auth_codex, "agy": auth_agy, "gemini": auth_gemini,
        "grok": auth_grok, "vibe": auth_vibe, "devin": auth_devin, "cursor-agent": auth_cursor}
