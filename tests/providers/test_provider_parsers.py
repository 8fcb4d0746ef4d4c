"""Output parsers: each adapter reads its CLI's real output formats, and bad output (banners,
junk, a stream cut mid-line, missing usage, nothing at all, broken UTF-8) still gives the best
ProviderResult, never an exception. Auth detection recognises each CLI's not-logged-in output
(the claude, codex and gemini samples are verbatim from the real CLIs) and nothing else."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import pytest

from providers import parsing
from providers.base import ProviderResult
from providers.parsing import Stdout, decode, json_document, plain_text, strip_ansi, tail
from providers.registry import CLI_PROVIDERS

claude = CLI_PROVIDERS["claude"]
codex = CLI_PROVIDERS["codex"]
gemini = CLI_PROVIDERS["gemini"]
grok = CLI_PROVIDERS["grok"]
mistral = CLI_PROVIDERS["mistral"]
devin = CLI_PROVIDERS["devin"]
cursor = CLI_PROVIDERS["cursor"]


def jl(*events: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\n" for e in events)


# -- claude ---------------------------------------------------------------------------------

SID = "2c562a6d-6bc7-4ecd-88eb-526b71b10c32"
CLAUDE_RESULT: dict[str, Any] = {
    "type": "result", "subtype": "success", "is_error": False, "duration_ms": 2100,
    "duration_api_ms": 1900, "num_turns": 2, "result": "The answer is 42.",
    "stop_reason": "end_turn", "session_id": SID, "total_cost_usd": 0.0123,
    "usage": {"input_tokens": 12, "cache_creation_input_tokens": 30,
              "cache_read_input_tokens": 400, "output_tokens": 7},
    "modelUsage": {"claude-opus-5": {"inputTokens": 12}},
}
CLAUDE_INIT: dict[str, Any] = {"type": "system", "subtype": "init", "cwd": "/tmp", "session_id": SID,
               "model": "claude-opus-5[1m]", "tools": ["Bash"]}
CLAUDE_ASSISTANT: dict[str, Any] = {"type": "assistant", "session_id": SID, "message": {
    "role": "assistant", "content": [{"type": "text", "text": "Working on it."}]}}
CLAUDE_DELTA: dict[str, Any] = {"type": "stream_event", "session_id": SID, "event": {
    "type": "content_block_delta", "index": 0,
    "delta": {"type": "text_delta", "text": "The ans"}}}
# Verbatim from claude 2.1.229 without credentials (`--output-format json`, exit 1).
CLAUDE_AUTH_JSON = (
    b'{"is_error":true,"duration_api_ms":0,"num_turns":1,"stop_reason":"stop_sequence",'
    b'"session_id":"2c562a6d-6bc7-4ecd-88eb-526b71b10c32","total_cost_usd":0,"usage":'
    b'{"output_tokens_details":{"thinking_tokens":0},"input_tokens":0,'
    b'"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":0,'
    b'"server_tool_use":{"web_search_requests":0,"web_fetch_requests":0},"service_tier":'
    b'"standard","cache_creation":{"ephemeral_1h_input_tokens":0,"ephemeral_5m_input_tokens":0}'
    b',"inference_geo":"","iterations":[],"speed":"standard"},"modelUsage":{},'
    b'"permission_denials":[],"terminal_reason":"api_error","fast_mode_state":"off",'
    b'"fast_mode_disabled_reason":"sdk_opt_in_required","subtype":"success",'
    b'"api_error_status":null,"result":"Not logged in \xc2\xb7 Please run /login",'
    b'"type":"result","duration_ms":111,"uuid":"1a9c75dd-e5f3-4c2a-add9-7e027b1db41d"}\n'
)
CLAUDE_AUTH_ASSISTANT: dict[str, Any] = {
    "type": "assistant", "message": {
        "id": "ba3c6c69", "model": "<synthetic>", "role": "assistant",
        "stop_reason": "stop_sequence", "type": "message",
        "content": [{"type": "text", "text": "Not logged in \u00b7 Please run /login"}]},
    "parent_tool_use_id": None, "session_id": SID, "error": "authentication_failed",
    "is_api_error_message": True,
}


def test_claude_json_result_gives_text_session_usage_and_cost() -> None:
    result = claude.parse_output(jl(CLAUDE_RESULT), b"", 0)
    assert result.text == "The answer is 42."
    assert result.session_id == SID
    assert result.is_error is False
    assert result.usage is not None
    assert result.usage.as_dict() == {"input_tokens": 12, "output_tokens": 7,
                                      "cache_read_tokens": 400, "cache_creation_tokens": 30,
                                      "cost_usd": 0.0123}
    assert result.extra["num_turns"] == 2
    assert result.extra["stop_reason"] == "end_turn"
    assert result.extra["model"] == "claude-opus-5"


def test_claude_stream_json_with_banner_and_junk_uses_the_result_event() -> None:
    stdout = (b"\x1b[33mWarning: update available\x1b[0m\nnot json {\n"
              + jl(CLAUDE_INIT, CLAUDE_DELTA, CLAUDE_ASSISTANT, CLAUDE_RESULT))
    result = claude.parse_output(stdout, b"", 0)
    assert result.text == "The answer is 42."
    assert result.session_id == SID
    assert result.extra["model"] == "claude-opus-5[1m]"


def test_claude_pretty_printed_json_is_read() -> None:
    stdout = b"banner\n" + json.dumps(CLAUDE_RESULT, indent=2).encode()
    assert claude.parse_output(stdout, b"", 0).text == "The answer is 42."


def test_claude_truncated_stream_returns_what_was_said_and_the_session() -> None:
    cut = jl(CLAUDE_INIT, CLAUDE_ASSISTANT) + json.dumps(CLAUDE_RESULT).encode()[:60]
    result = claude.parse_output(cut, b"", None)
    assert result.text == "Working on it."
    assert result.session_id == SID
    assert result.is_error is True
    assert result.extra["incomplete"] is True


def test_claude_truncated_partial_messages_are_joined() -> None:
    second = json.loads(json.dumps(CLAUDE_DELTA))
    second["event"]["delta"]["text"] = "wer is"
    result = claude.parse_output(jl(CLAUDE_INIT, CLAUDE_DELTA, second), b"", None)
    assert result.text == "The answer is"


def test_claude_missing_usage_gives_none() -> None:
    bare = {k: v for k, v in CLAUDE_RESULT.items() if k not in ("usage", "total_cost_usd")}
    result = claude.parse_output(jl(bare), b"", 0)
    assert result.usage is None
    assert result.text == "The answer is 42."


def test_claude_error_result_without_text_explains_itself() -> None:
    event = {"type": "result", "subtype": "error_max_turns", "is_error": True,
             "session_id": SID, "num_turns": 5}
    result = claude.parse_output(jl(event), b"", 1)
    assert result.is_error is True
    assert "error_max_turns" in result.text


def test_claude_text_format_is_the_answer() -> None:
    result = claude.parse_output(b"Hello there\n\n", b"", 0)
    assert result == ProviderResult(text="Hello there")


@pytest.mark.parametrize(("exit_code", "is_error"), [(0, False), (1, True), (None, False)])
def test_claude_empty_output(exit_code: int | None, is_error: bool) -> None:
    result = claude.parse_output(b"", b"", exit_code)
    assert result.text == ""
    assert result.is_error is is_error


def test_claude_real_not_logged_in_json_is_an_auth_error() -> None:
    assert claude.is_auth_error(CLAUDE_AUTH_JSON, b"", 1)
    result = claude.parse_output(CLAUDE_AUTH_JSON, b"", 1)
    assert result.is_error is True
    assert result.text == "Not logged in \u00b7 Please run /login"


def test_claude_real_not_logged_in_stream_and_text_are_auth_errors() -> None:
    stream = jl(CLAUDE_INIT, CLAUDE_AUTH_ASSISTANT) + CLAUDE_AUTH_JSON
    assert claude.is_auth_error(stream, b"", 1)
    assert claude.is_auth_error("Not logged in · Please run /login\n".encode(), b"", 1)


def test_claude_answer_that_mentions_login_is_not_an_auth_error() -> None:
    ok = dict(CLAUDE_RESULT, result="Users who are Not logged in see /login")
    assert not claude.is_auth_error(jl(ok), b"", 0)
    assert not claude.is_auth_error(b"Not logged in \xc2\xb7 Please run /login", b"", 0)
    assert not claude.is_auth_error(b"", b"error: unknown option '--x'", 1)


# -- codex ----------------------------------------------------------------------------------

THREAD = "01a22c39-346d-7512-871e-a2beae96de62"
CODEX_OK: list[dict[str, Any]] = [
    {"type": "thread.started", "thread_id": THREAD},
    {"type": "turn.started"},
    {"type": "item.completed", "item": {"id": "item_0", "type": "reasoning", "text": "hmm"}},
    {"type": "item.completed", "item": {"id": "item_1", "type": "agent_message",
                                        "text": "Looking."}},
    {"type": "item.completed", "item": {"id": "item_2", "type": "command_execution",
                                        "command": "ls", "exit_code": 0}},
    {"type": "item.completed", "item": {"id": "item_3", "type": "agent_message",
                                        "text": "Done: 3 files."}},
    {"type": "turn.completed", "usage": {"input_tokens": 1000, "cached_input_tokens": 800,
                                         "output_tokens": 50}},
]
# Verbatim shape of codex 0.147.0 with no network (it keeps retrying until stopped).
CODEX_RECONNECTING = jl(
    {"type": "thread.started", "thread_id": THREAD}, {"type": "turn.started"},
    {"type": "error", "message": "Reconnecting... 2/5 (stream disconnected before completion: "
                                 "failed to lookup address information: Name does not resolve)"},
)
CODEX_401 = "unexpected status 401 Unauthorized: Missing bearer or basic authentication in header"


def test_codex_jsonl_gives_last_agent_message_thread_and_usage() -> None:
    result = codex.parse_output(jl(*CODEX_OK), b"", 0)
    assert result.text == "Done: 3 files."
    assert result.session_id == THREAD
    assert result.is_error is False
    assert result.usage is not None
    assert result.usage.as_dict() == {"input_tokens": 1000, "output_tokens": 50,
                                      "cache_read_tokens": 800}


def test_codex_transient_reconnects_before_success_are_not_an_error() -> None:
    events = [CODEX_OK[0], CODEX_OK[1],
              {"type": "error", "message": "Reconnecting... 1/5"}, *CODEX_OK[2:]]
    assert codex.parse_output(jl(*events), b"WARNING: banner\n", 0).is_error is False


def test_codex_turn_failed_is_an_error_with_its_message() -> None:
    stdout = jl(CODEX_OK[0], {"type": "turn.failed", "error": {"message": "model overloaded"}})
    result = codex.parse_output(stdout, b"", 1)
    assert result.is_error is True
    assert result.text == "model overloaded"
    assert result.extra["error"] == "model overloaded"
    assert result.session_id == THREAD


def test_codex_stopped_while_reconnecting_is_incomplete_not_a_crash() -> None:
    result = codex.parse_output(CODEX_RECONNECTING + b'{"type":"err', b"", None)
    assert result.session_id == THREAD
    assert result.is_error is True
    assert result.extra["incomplete"] is True
    assert "Reconnecting" in result.text


def test_codex_missing_usage_and_plain_text_output() -> None:
    no_usage = [e for e in CODEX_OK if e["type"] != "turn.completed"] + [
        {"type": "turn.completed"}]
    assert codex.parse_output(jl(*no_usage), b"", 0).usage is None
    plain = codex.parse_output(b"just text\n", b"", 0)
    assert plain.text == "just text"


def test_codex_auth_failure_is_recognised_and_a_network_retry_is_not() -> None:
    failed = CODEX_RECONNECTING + jl({"type": "error", "message": f"Reconnecting... 1/5 "
                                                                  f"({CODEX_401})"},
                                     {"type": "turn.failed", "error": {"message": CODEX_401}})
    assert codex.is_auth_error(failed, b"", 1)
    assert codex.is_auth_error(b"", f"ERROR: {CODEX_401}\n".encode(), 1)
    assert not codex.is_auth_error(CODEX_RECONNECTING, b"", None)
    assert not codex.is_auth_error(jl(*CODEX_OK), b"", 0)
    overloaded = jl({"type": "turn.failed", "error": {"message": "503 Service Unavailable"}})
    assert not codex.is_auth_error(overloaded, b"", 1)


# -- gemini / agy ---------------------------------------------------------------------------

GEMINI_JSON: dict[str, Any] = {"session_id": "9b3c", "response": "Paris.", "stats": {"models": {
    "gemini-2.5-pro": {"tokens": {"prompt": 100, "candidates": 5, "cached": 40}},
    "gemini-2.5-flash": {"tokens": {"prompt": 10, "candidates": 1, "cached": 0}}}}}
AGY_JSON: dict[str, Any] = {"conversation_id": "conv-7", "status": "SUCCESS", "response": "Done.",
            "usage": {"input_tokens": 9, "output_tokens": 3, "total_tokens": 12}}
# Verbatim from gemini 0.61.0 without credentials (exit 41; stderr).
GEMINI_AUTH = (b"Please set an Auth method in your /tmp/h/.gemini/settings.json or specify one "
               b"of the following environment variables before running: GEMINI_API_KEY, "
               b"GOOGLE_GENAI_USE_VERTEXAI, GOOGLE_GENAI_USE_GCA\n")


def test_gemini_json_envelope_gives_response_session_and_summed_usage() -> None:
    result = gemini.parse_output(json.dumps(GEMINI_JSON, indent=2).encode(), b"", 0)
    assert result.text == "Paris."
    assert result.session_id == "9b3c"
    assert result.usage is not None
    assert result.usage.as_dict() == {"input_tokens": 110, "output_tokens": 6,
                                      "cache_read_tokens": 40}


def test_agy_json_envelope_gives_response_and_conversation() -> None:
    result = gemini.parse_output(b"Loaded cached credentials.\n" + jl(AGY_JSON), b"", 0)
    assert (result.text, result.session_id, result.is_error) == ("Done.", "conv-7", False)
    assert result.usage is not None and result.usage.output_tokens == 3


def test_gemini_error_envelope_and_failed_status_are_errors() -> None:
    envelope = {"session_id": "s", "error": {"type": "Error", "message": "quota exceeded",
                                             "code": 1}}
    result = gemini.parse_output(jl(envelope), b"", 1)
    assert (result.text, result.is_error) == ("quota exceeded", True)
    failed = dict(AGY_JSON, status="FAILED", response="")
    assert gemini.parse_output(jl(failed), b"", 0).is_error is True


def test_gemini_text_answer_that_is_json_stays_the_answer() -> None:
    answer = b'{"name": "x", "response_code": 3}\n'
    assert gemini.parse_output(answer, b"", 0).text == answer.decode().strip()


def test_gemini_auth_exit_41_and_sign_in_messages_are_auth_errors() -> None:
    assert gemini.is_auth_error(b"", GEMINI_AUTH, 41)
    assert gemini.is_auth_error(b"", b"Error: not signed in. Run `agy` to sign in.", 1)
    assert not gemini.is_auth_error(b"", b"Error resuming session: none found", 42)
    assert not gemini.is_auth_error(b"please set an auth method", b"", 0)


# -- grok -----------------------------------------------------------------------------------

GROK_STREAM = jl(
    {"type": "thought", "data": "The"}, {"type": "thought", "data": " user"},
    {"type": "text", "data": "hello"}, {"type": "text", "data": "-from"},
    {"type": "text", "data": "-tool"},
    {"type": "end", "stopReason": "EndTurn", "sessionId": "sess-2", "requestId": "req-2",
     "usage": {"input_tokens": 21550, "cache_read_input_tokens": 33408, "output_tokens": 71,
               "reasoning_tokens": 59, "total_tokens": 55029}, "num_turns": 2,
     "modelUsage": {"grok-4.5": {"inputTokens": 21550}}},
)
GROK_JSON: dict[str, Any] = {"text": "ok", "stopReason": "EndTurn", "sessionId": "sess-3",
             "requestId": "req-3", "thought": "Short.",
             "usage": {"input_tokens": 21414, "cache_read_input_tokens": 6016,
                       "output_tokens": 19}, "num_turns": 1}


def test_grok_streaming_json_concatenates_text_deltas() -> None:
    result = grok.parse_output(GROK_STREAM, b"", 0)
    assert result.text == "hello-from-tool"
    assert result.session_id == "sess-2"
    assert result.is_error is False
    assert result.usage is not None
    assert result.usage.as_dict() == {"input_tokens": 21550, "output_tokens": 71,
                                      "cache_read_tokens": 33408}
    assert result.extra["stop_reason"] == "EndTurn"
    assert result.extra["model"] == "grok-4.5"


def test_grok_truncated_stream_keeps_partial_text() -> None:
    cut = GROK_STREAM.split(b'{"type": "end"')[0]
    result = grok.parse_output(cut, b"", None)
    assert result.text == "hello-from-tool"
    assert result.is_error is True
    assert result.extra["incomplete"] is True


def test_grok_pretty_json_object_with_junk_around_it() -> None:
    stdout = b"update available\n" + json.dumps(GROK_JSON, indent=2).encode() + b"\n>"
    result = grok.parse_output(stdout, b"", 0)
    assert (result.text, result.session_id) == ("ok", "sess-3")
    assert result.usage is not None and result.usage.cache_read_tokens == 6016


def test_grok_error_event_is_an_error() -> None:
    result = grok.parse_output(jl({"type": "error", "message": "rate limited"}), b"", 1)
    assert (result.text, result.is_error) == ("rate limited", True)


def test_grok_plain_and_auth() -> None:
    assert grok.parse_output(b"plain answer\n", b"", 0).text == "plain answer"
    assert grok.is_auth_error(b"", b"Error: not authenticated. Run `grok login`", 1)
    assert not grok.is_auth_error(b"", b"Error: model not found", 1)


# -- mistral (vibe) --------------------------------------------------------------------------

VIBE_HISTORY: list[dict[str, Any]] = [
    {"id": "1", "type": "message", "role": "user", "content": [{"type": "text", "text": "q"}]},
    {"id": "2", "type": "reasoning", "text": "thinking"},
    {"id": "3", "type": "message", "role": "assistant",
     "content": [{"type": "text", "text": "Answer."}]},
]


def test_vibe_text_json_streaming_and_history_forms() -> None:
    assert mistral.parse_output(b"Answer.\n", b"", 0).text == "Answer."
    assert mistral.parse_output(json.dumps(VIBE_HISTORY, indent=2).encode(), b"", 0).text \
        == "Answer."
    assert mistral.parse_output(jl(*VIBE_HISTORY), b"", 0).text == "Answer."
    wrapped = json.dumps({"history": VIBE_HISTORY, "teleportUrl": "u"}).encode()
    assert mistral.parse_output(wrapped, b"", 0).text == "Answer."


def test_vibe_missing_api_key_is_an_auth_error() -> None:
    stderr = (b"Error: Missing MISTRAL_API_KEY environment variable for mistral provider. Set "
              b"the environment variable (e.g. in ~/.vibe/.env or your shell), or run "
              b"`vibe --setup` once interactively.\n")
    assert mistral.is_auth_error(b"", stderr, 1)
    assert not mistral.is_auth_error(b"", b"Error: tool failed", 1)


# -- devin, cursor --------------------------------------------------------------------------

CURSOR_RESULT: dict[str, Any] = {"type": "result", "subtype": "success", "is_error": False,
                 "duration_ms": 1234, "result": "Fixed.", "session_id": "chat-9",
                 "request_id": "r"}


def test_devin_plain_text_and_auth() -> None:
    result = devin.parse_output(b"\x1b[1mAll done\x1b[0m\n", b"", 0)
    assert result == ProviderResult(text="All done")
    assert devin.is_auth_error(b"", b"Error: Not logged in. Run `devin auth login`", 1)
    assert not devin.is_auth_error(b"", b"Error: Not logged in", 0)


def test_cursor_json_stream_json_and_text() -> None:
    assert cursor.parse_output(jl(CURSOR_RESULT), b"", 0).session_id == "chat-9"
    stream = jl({"type": "system", "subtype": "init", "session_id": "chat-9"},
                {"type": "assistant", "session_id": "chat-9", "message": {
                    "role": "assistant", "content": [{"type": "text", "text": "Fixed."}]}},
                dict(CURSOR_RESULT, usage={"inputTokens": 5, "outputTokens": 2}))
    result = cursor.parse_output(stream, b"", 0)
    assert (result.text, result.session_id) == ("Fixed.", "chat-9")
    assert result.usage is not None and result.usage.input_tokens == 5
    assert cursor.parse_output(b"Fixed.\n", b"", 0).text == "Fixed."


def test_cursor_auth() -> None:
    stderr = b"Error: Authentication required. Please run 'cursor-agent login' first.\n"
    assert cursor.is_auth_error(b"", stderr, 1)
    assert not cursor.is_auth_error(b"", b"Workspace Trust Required", 1)


# -- never an exception ---------------------------------------------------------------------

SAMPLES: dict[str, list[bytes]] = {
    "claude": [jl(CLAUDE_INIT, CLAUDE_DELTA, CLAUDE_ASSISTANT, CLAUDE_RESULT), CLAUDE_AUTH_JSON],
    "codex": [jl(*CODEX_OK), CODEX_RECONNECTING],
    "gemini": [json.dumps(GEMINI_JSON, indent=2).encode(), jl(AGY_JSON), b"text answer"],
    "grok": [GROK_STREAM, json.dumps(GROK_JSON, indent=2).encode()],
    "mistral": [json.dumps(VIBE_HISTORY).encode(), jl(*VIBE_HISTORY)],
    "devin": [b"plain answer\n"],
    "cursor": [jl(CURSOR_RESULT)],
}
ODD_OUTPUTS = [b"", b"\n\n", b"\xff\xfe\x00garbage\x80", b"{", b"[1, 2", b"null\n", b"42\n",
               b'{"type": 5}\n', b'{"type": "result", "result": 7, "usage": "lots"}\n',
               b'{"type": "item.completed", "item": null}\n', b'[{"role": 3}]',
               b'{"response": {"a": 1}, "session_id": 9}\n', b'{"type":"text","data":null}\n',
               b'{"type": "end", "usage": [1]}\n', b'{"stats": {"models": {"m": 1}}, "response": "r"}']


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_parsers_never_raise_on_truncated_corrupted_or_odd_output(name: str) -> None:
    adapter = CLI_PROVIDERS[name]
    rng = random.Random(f"parsers-{name}")
    inputs = list(ODD_OUTPUTS)
    for sample in SAMPLES[name]:
        inputs += [sample[:cut] for cut in range(0, len(sample), max(1, len(sample) // 40))]
        for _ in range(20):
            corrupted = bytearray(sample)
            for _ in range(5):
                corrupted[rng.randrange(len(corrupted))] = rng.randrange(256)
            inputs.append(bytes(corrupted))
    for stdout in inputs:
        for exit_code in (0, 1, None):
            result = adapter.parse_output(stdout, stdout[:50], exit_code)
            assert isinstance(result, ProviderResult)
            assert isinstance(result.text, str)
            assert result.session_id is None or isinstance(result.session_id, str)
            assert isinstance(adapter.is_auth_error(stdout, stdout, exit_code), bool)


# -- stdout of any size: the same readers in bounded passes ---------------------------------

CHUNK_SIZES = (1, 2, 3, 7, 64, 4096)  # reads that cut lines, characters and ANSI codes anywhere


def every_input(name: str) -> list[bytes]:
    """The samples, cut at many points and corrupted, plus the odd outputs (as above)."""
    rng = random.Random(f"stream-{name}")
    inputs = list(ODD_OUTPUTS)
    for sample in SAMPLES[name]:
        inputs += [sample[:cut] for cut in range(0, len(sample), max(1, len(sample) // 12))]
        # No final newline; ANSI codes and blanks before a line, cut by small reads.
        inputs += [sample.rstrip(b"\n"), b"\x1b[2K\x1b[0m  " + sample, b"\r\n  \t" + sample]
        for _ in range(6):
            corrupted = bytearray(sample)
            for _ in range(5):
                corrupted[rng.randrange(len(corrupted))] = rng.randrange(256)
            inputs.append(bytes(corrupted))
    return inputs


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_a_stdout_read_in_chunks_parses_exactly_as_the_whole_bytes(name: str) -> None:
    adapter = CLI_PROVIDERS[name]
    for stdout in every_input(name):
        for exit_code in (0, 1, None):
            whole = adapter.parse_output(stdout, b"", exit_code)
            auth = adapter.is_auth_error(stdout, b"", exit_code)
            for size in CHUNK_SIZES:
                streamed = adapter.parse_stream(Stdout(stdout, size), b"", exit_code)
                if streamed.answer_is_stdout:  # left for the caller: the bytes' plain text
                    streamed.text, streamed.answer_is_stdout = plain_text(stdout), False
                assert streamed == whole, (name, stdout, size)
                assert adapter.is_auth_error(Stdout(stdout, size), b"", exit_code) is auth


def objects_in(text: str) -> list[dict[str, Any]]:
    """The JSON-object lines of a whole text, the simple way: what json_objects must find."""
    found = []
    for raw in re.split(r"[\r\n]", text):
        line = strip_ansi(raw).strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                found.append(value)
    return found


def test_json_objects_read_in_chunks_are_the_object_lines_of_the_whole_text() -> None:
    for data in [s for name in sorted(SAMPLES) for s in every_input(name)]:
        expected = objects_in(decode(data))
        for size in CHUNK_SIZES:
            assert list(Stdout(data, size).json_objects()) == expected, (data, size)


def test_a_plain_text_answer_is_left_to_the_caller_who_holds_stdout() -> None:
    # Only parse_output (bytes in hand) fills it in; a spooled stdout is stored once.
    streamed = devin.parse_stream(Stdout(b"\n\nAll done\n  \n"), b"", 0)
    assert (streamed.text, streamed.answer_is_stdout) == ("", True)
    assert devin.parse_output(b"\n\nAll done\n  \n", b"", 0) == ProviderResult(text="All done")


def test_a_stream_cut_mid_line_in_a_spool_file_keeps_every_whole_event(tmp_path: Path) -> None:
    filler = b"x" * 300_000 + b"\n"  # a line of non-JSON output longer than a read
    stream = filler + jl(CLAUDE_INIT, CLAUDE_DELTA, CLAUDE_ASSISTANT) + filler
    spool = tmp_path / "stdout"
    spool.write_bytes(stream + json.dumps(CLAUDE_RESULT).encode()[:70])  # killed mid-line
    result = claude.parse_stream(Stdout(spool, 4096), b"", None)
    assert result.text == "Working on it."
    assert result.session_id == SID
    assert result.is_error is True and result.extra["incomplete"] is True
    assert result.extra["model"] == "claude-opus-5[1m]"
    assert not claude.is_auth_error(Stdout(spool), b"", None)


def test_json_lines_end_at_a_newline_or_return_not_at_a_unicode_line_separator() -> None:
    # Node's JSON.stringify leaves U+2028 unescaped inside strings; a line is still whole.
    event = {**CLAUDE_RESULT, "result": "line\u2028separated"}
    raw = json.dumps(event, ensure_ascii=False).encode()
    result = claude.parse_output(b"spinner...\r" + raw + b"\r\n", b"", 0)
    assert result.text == "line\u2028separated"


def test_a_large_json_document_is_found_as_in_the_whole_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Past WHOLE_DOCUMENT_BYTES the document is looked for by offsets: every input must give
    # the object or array the whole-text reader finds (scalars are of no use to adapters).
    monkeypatch.setattr(parsing, "WHOLE_DOCUMENT_BYTES", 0)
    big = {"response": "r" * 5000, "session_id": "s", "stats": {"n": 1}}
    extra = [json.dumps(big, indent=2).encode(), b"banner\n" + json.dumps(big).encode() + b"\n>",
             b"code { x } and [1] then\n" + json.dumps(big).encode(), b"{ not json }\n[1, 2]\n",
             b"[1, 2] {\"a\": 1}", b"  \n{\"a\": [1, {\"b\": 2}]}\n  ", b"[{\"role\": 3}] ]"]
    inputs = [s for name in sorted(SAMPLES) for s in every_input(name)] + extra
    for data in inputs:
        expected = json_document(decode(data))
        for size in (3, 64, 4096):
            found = Stdout(data, size).json_document()
            if b"\x1b" in data:  # ANSI codes: read whole, exactly as the whole-text reader
                assert found == expected, data
            else:
                assert container(found) == container(expected), data


def container(value: Any) -> Any:
    return value if isinstance(value, (dict, list)) else None


def test_the_tail_of_a_stdout_is_the_end_of_its_text() -> None:
    ansi = ("é" * 3000 + "\x1b[31mNot logged in\x1b[0m\n").encode()
    cut_char = ("é" * 10_000 + "!").encode()  # the 16 kB window starts inside an "é"
    for data in (ansi, b"x" * 50_000 + ansi, cut_char, b"", b"\xff\xfe tail", b"\x80abc"):
        for size in (7, 1000, 1 << 20):
            assert Stdout(data, size).tail() == tail(strip_ansi(decode(data))), data[-40:]
