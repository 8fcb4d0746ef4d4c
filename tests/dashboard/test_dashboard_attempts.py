"""The Attempts pages in this process (as test_dashboard_app.py): the groups list, a group's
comparison, diffs side by side and winner, and the pick through llm_attempts_pick's code,
over a real SQLite store that a real gateway writes, a real git checkout and a real check."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway.store.attempts import GroupStatus
from tests.dashboard.groups import checkout, finished_group
from tests.dashboard.test_dashboard_app import CSRF, Served, served, signed_in

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

__all__ = ["served"]  # the fixture, shared with the other app tests


def rank_of(page: str, job_id: str) -> str:
    row = re.search(rf'id="attempt-{job_id}".*?<td class="rank">(\d+)', page, re.S)
    assert row is not None, page
    return row.group(1)


async def test_the_group_page_shows_ranks_checks_winner_and_diffs_side_by_side(
        served: Served, tmp_path: Path) -> None:
    repo = checkout(tmp_path / "checkout")
    group_id, jobs = await finished_group(served.gateway, repo)
    async with served.client() as client:
        await signed_in(client)
        listed = await client.get("/attempts")
        assert f'id="group-{group_id}"' in listed.text and ">done<" in listed.text
        assert 'href="/attempts" class="current"' in listed.text
        page = await client.get(f"/attempts/{group_id}")
        assert page.status_code == 200
        text = page.text
        assert rank_of(text, jobs["claude"]) == "1"
        assert int(rank_of(text, jobs["codex"])) > 1  # a rank is a class: failed check
        assert "passed" in text and "failed (exit 1)" in text
        assert "+1/-0 in 1 files" in text
        assert re.search(r'id="winner">Winner: <a href="/jobs/' + jobs["claude"], text)
        assert text.count('<div class="side">') == 2  # notes.txt, one column per attempt
        assert "written by fake-claude" in text and "written by fake-codex" in text
        assert "<form" not in text.split("<main>")[1]  # read-only: no pick offered
        assert (await client.get("/attempts/no-such-group")).status_code == 404
        refused = await client.post(f"/attempts/{group_id}/pick",
                                    data={"csrf": "x", "action": "discard"})
        assert refused.status_code == 403
    group = await served.store.get_attempt_group(group_id)
    assert group is not None and group.status is GroupStatus.DONE


async def test_pick_needs_the_csrf_token_and_goes_through_llm_attempts_pick(
        served: Served, tmp_path: Path) -> None:
    repo = checkout(tmp_path / "checkout")
    group_id, jobs = await finished_group(served.gateway, repo)
    async with served.client(allow_actions=True) as client:
        await signed_in(client)
        page = await client.get(f"/attempts/{group_id}")
        csrf = CSRF.search(page.text)
        assert csrf is not None and f'id="apply-{jobs["codex"]}"' in page.text
        assert "data-confirm=" in page.text
        forged = await client.post(f"/attempts/{group_id}/pick",
                                   data={"csrf": "forged", "action": "apply",
                                         "job_id": jobs["codex"]})
        assert forged.status_code == 403
        stranger = await client.post(f"/attempts/{group_id}/pick",
                                     data={"csrf": csrf.group(1), "action": "apply",
                                           "job_id": "not-an-attempt"})
        assert stranger.status_code == 409 and "is not an attempt of group" in stranger.text
        bad = await client.post(f"/attempts/{group_id}/pick",
                                data={"csrf": csrf.group(1), "action": "explode"})
        assert bad.status_code == 409 and "action must be one of" in bad.text
        assert not (repo / "notes.txt").exists()  # nothing changed by the refusals
        kept = await client.post(f"/attempts/{group_id}/pick",
                                 data={"csrf": csrf.group(1), "action": "keep",
                                       "job_id": jobs["codex"]})
        assert kept.status_code == 303
        assert kept.headers["location"] == f"/attempts/{group_id}?done=keep"
        after = await client.get(kept.headers["location"])
        assert "branch was kept" in after.text and "<form" not in after.text.split("<main>")[1]
        again = await client.post(f"/attempts/{group_id}/pick",
                                  data={"csrf": csrf.group(1), "action": "discard"})
        assert again.status_code == 409 and "already picked" in again.text
    group = await served.store.get_attempt_group(group_id)
    assert group is not None and group.status is GroupStatus.PICKED
    assert group.winner_job_id == jobs["codex"]
    assert not (repo / "notes.txt").exists()  # keep applies nothing
