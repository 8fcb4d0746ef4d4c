"""The dashboard's parts without a server (the fast tier): the token and its sessions, what
a page makes of job data, the diff split per file, the SVG charts, the SSE framing, and the
Host/Origin rule every HTTP listener shares."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gateway.dashboard import charts, live, views
from gateway.dashboard.auth import MAX_SESSIONS, Sessions
from gateway.model import JobRow, JobStatus
from neutral.host_origin import HostOriginRule


def test_a_one_time_token_opens_one_session_and_is_spent() -> None:
    sessions = Sessions("secret-token", one_time=True)
    assert sessions.exchange("wrong") is None
    session = sessions.exchange("secret-token")
    assert session is not None and sessions.csrf_of(session) is not None
    assert sessions.exchange("secret-token") is None  # spent
    assert sessions.exchange("") is None
    assert sessions.open_without_token() is None


def test_a_bearer_token_stays_valid_and_each_session_has_its_own_csrf_token() -> None:
    sessions = Sessions("bearer", one_time=False)
    first, second = sessions.exchange("bearer"), sessions.exchange("bearer")
    assert first and second and first != second
    csrf = sessions.csrf_of(first)
    assert csrf is not None and csrf != sessions.csrf_of(second)
    assert sessions.csrf_matches(first, csrf)
    assert not sessions.csrf_matches(second, csrf)
    assert not sessions.csrf_matches(first, "")
    assert not sessions.csrf_matches(None, csrf)
    assert sessions.csrf_of("not-a-session") is None


def test_sessions_are_capped_the_oldest_going_first() -> None:
    sessions = Sessions("t", one_time=False)
    opened = [sessions.exchange("t") for _ in range(MAX_SESSIONS + 1)]
    assert sessions.csrf_of(opened[0]) is None
    assert sessions.csrf_of(opened[-1]) is not None


def test_no_token_opens_a_session_for_anyone() -> None:
    assert Sessions(None, one_time=False).open_without_token() is not None


def test_job_data_loses_its_escape_sequences_and_shows_other_controls() -> None:
    text = "\x1b[31mred\x1b[0m \x1b]0;title\x07\x1b]52;c;Zm9v\x07 bell\x07 \u202eevil <b>"
    assert views.shown(text) == "red  bell^G <U+202E>evil <b>"  # HTML: the templates' job
    assert views.shown(None) == ""


def test_a_patch_is_split_per_file_with_each_lines_kind() -> None:
    patch = ("diff --git a/a.txt b/a.txt\nindex 1..2 100644\n--- a/a.txt\n+++ b/a.txt\n"
             "@@ -1 +1,2 @@\n keep\n+added\n-removed\n"
             "diff --git a/dir/b.py b/dir/b.py\nnew file mode 100644\n+\x1b[31mx\n")
    files = views.diff_files(patch)
    assert [f.name for f in files] == ["a.txt", "dir/b.py"]
    assert [kind for kind, _ in files[0].lines] == ["meta", "meta", "meta", "meta", "hunk",
                                                    "ctx", "add", "del"]
    assert files[1].lines[-1] == ("add", "+x")


def test_a_bar_chart_scales_to_its_largest_value() -> None:
    chart = charts.bar_chart("cost", [("a", 1.0), ("b", 4.0), ("c", 0.0)], "$")
    heights = [bar.height for bar in chart.bars]
    assert heights[1] == max(heights) and heights[0] == heights[1] / 4 and heights[2] == 0
    assert chart.bars[1].value == "$4.0000"
    assert all(bar.y + bar.height == chart.baseline for bar in chart.bars)
    assert charts.bar_chart("empty", []).bars == []


def test_an_event_with_several_lines_sends_each_as_data() -> None:
    assert live.event("rows", "<tr>\n</tr>") == "event: rows\ndata: <tr>\ndata: </tr>\n\n"


def test_the_host_origin_rule_accepts_only_the_listeners_own_names() -> None:
    rule = HostOriginRule.of("127.0.0.1", ["https://allowed.example"])
    server = ("127.0.0.1", 8080)
    assert rule.refusal(server, "127.0.0.1:8080", None) is None
    assert rule.refusal(server, "localhost:8080", "http://localhost:8080") is None
    assert rule.refusal(server, "evil.example:8080", None) == "host"
    assert rule.refusal(server, "127.0.0.1:8080", "http://evil.example") == "origin"
    assert rule.refusal(server, "127.0.0.1:8080", "https://allowed.example/") is None
    assert rule.refusal(server, "127.0.0.1:8080", "null") == "origin"
    wildcard = HostOriginRule.of("0.0.0.0")
    assert wildcard.refusal(("10.0.0.5", 80), "anything", "http://10.0.0.5") is None


def _row(**times: object) -> JobRow:
    return JobRow(id="j1", provider="claude", status=JobStatus.RUNNING, request_key="k",
                  owner_instance="0123456789abcdef", created_at=_AT, **times)  # type: ignore[arg-type]


_AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_the_timeline_shows_an_adoption_in_order_and_names_the_adopter() -> None:
    row = _row(started_at=_AT + timedelta(seconds=1), adopted_at=_AT + timedelta(seconds=2))
    assert [step.label for step in views.timeline(row)] == [
        "admitted", "started", "adopted (by 01234567)"]
    assert views.timeline(row)[2].at == "2026-01-02 03:04:07"


def test_the_timeline_has_no_adoption_when_none_happened() -> None:
    row = _row(started_at=_AT + timedelta(seconds=1))
    assert [step.label for step in views.timeline(row)] == ["admitted", "started"]


def test_the_timeline_names_no_adopter_once_a_later_requeue_moved_the_job_on() -> None:
    row = _row(adopted_at=_AT + timedelta(seconds=1), requeued_at=_AT + timedelta(seconds=2),
               requeue_count=1)
    assert [step.label for step in views.timeline(row)] == [
        "admitted", "adopted", "re-queued (1x)"]
