"""The dashboard in a real headless browser (issue #41's "Done when"): the system's Chromium,
driven by Playwright, against the `dashboard` command serving a store that real gateways
share, running the fake CLIs."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import anyio
import pytest
from playwright.async_api import Browser, Page, expect

from gateway.jobs.requests import SubmitRequest
from gateway.runtime import Gateway
from tests.dashboard.groups import checkout as attempts_checkout
from tests.dashboard.groups import finished_group
from tests.dashboard.site import Site
from tests.mcp.conftest import TOKEN, free_port, start_http_server
from tests.waiting import wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

LIVE_S = 10_000  # ms a page is given to show a change by itself (the promise is 1 s; a loaded box)
GIT_ID = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
          "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}


async def submit(gateway: Gateway, prompt: str, provider: str = "claude",
                 **more: object) -> str:
    manager = await gateway.manager()
    done = await manager.submit(provider, SubmitRequest(prompt=prompt, force_refresh=True,
                                                        **more))  # type: ignore[arg-type]
    return done.job.id


async def ended(gateway: Gateway, job_id: str) -> None:
    manager = await gateway.manager()

    async def terminal() -> bool:
        return (await manager.reads.get(job_id)).status.is_terminal

    await wait_for(terminal, timeout=60)


async def opened(browser: Browser, address: str) -> Page:
    page = await browser.new_page()
    await page.goto(address)
    assert "token=" not in page.url  # traded for the cookie, dropped from the address bar
    return page


async def test_jobs_of_two_gateways_show_and_a_new_job_turns_completed_without_a_reload(
        shared_site: Site, browser: Browser, tmp_path: Path) -> None:
    dashboard_site = shared_site
    first, second = (await dashboard_site.start_gateway(), await dashboard_site.start_gateway())
    one = await submit(first, "from the first gateway")
    two = await submit(second, "from the second gateway", provider="codex")
    await ended(first, one)
    await ended(second, two)
    page = await opened(browser, await dashboard_site.dashboard())
    await expect(page.locator(f"#job-{one}")).to_contain_text("from the first gateway")
    await expect(page.locator(f"#job-{two}")).to_contain_text("from the second gateway")
    await expect(page.locator(f"#job-{two}")).to_contain_text("codex")
    await page.evaluate("window.stillTheSamePage = true")

    release = tmp_path / "release"
    late = await submit(second, f"started after the page opened @until={release}")
    row = page.locator(f"#job-{late}")
    await expect(row).to_contain_text("running", timeout=LIVE_S)
    release.touch()
    await expect(row.locator(".badge")).to_have_text("completed", timeout=LIVE_S)
    assert await page.evaluate("window.stillTheSamePage") is True  # no reload happened


async def test_the_job_page_tail_grows_while_the_cli_prints(
        dashboard_site: Site, browser: Browser) -> None:
    gateway = await dashboard_site.start_gateway()
    # A line each 50 ms for a minute, the page opened while it goes on.
    job = await submit(gateway, "print slowly @stream=1200:0.05", provider="devin")
    page = await opened(browser, await dashboard_site.dashboard())
    await page.goto(f"{page.url}jobs/{job}")
    tail = page.locator("#tail")
    await expect(tail).to_contain_text("progress 1/", timeout=LIVE_S)
    seen = last_progress(await tail.inner_text())
    await expect(tail).to_contain_text(f"progress {seen + 10}/", timeout=LIVE_S)
    await expect(page.locator("#job-state")).to_have_text("running")
    assert (await (await gateway.manager()).cancel(job)).outcome == "cancelled"


async def test_a_worktree_jobs_diff_shows_and_applying_it_changes_the_checkout(
        dashboard_site: Site, browser: Browser, tmp_path: Path) -> None:
    repo = checkout(tmp_path / "checkout")
    gateway = await dashboard_site.start_gateway()
    job = await submit(gateway, "edit notes @write=notes.txt", working_dir=str(repo),
                       isolation="worktree")
    await ended(gateway, job)
    base = await dashboard_site.dashboard("--allow-actions")
    page = await opened(browser, base)
    await page.goto(f"{page.url}jobs/{job}")
    await expect(page.locator(".diff-file h3")).to_have_text("notes.txt")
    await expect(page.locator(".diff .add").last).to_contain_text("written by fake-claude")
    assert not (repo / "notes.txt").exists()
    page.on("dialog", lambda dialog: dialog.accept())
    await page.locator("#apply").click()
    await expect(page.locator(".notice")).to_contain_text("applied")
    assert "written by fake-claude" in (repo / "notes.txt").read_text()


async def test_cancel_from_the_page_stops_a_running_job_and_a_stale_csrf_token_is_refused(
        dashboard_site: Site, browser: Browser) -> None:
    gateway = await dashboard_site.start_gateway()
    job = await submit(gateway, "a long one @sleep=300")
    page = await opened(browser, await dashboard_site.dashboard("--allow-actions"))
    root = page.url
    await page.goto(f"{root}jobs/{job}")
    await expect(page.locator("#job-state")).to_have_text("running")
    forged = await page.request.post(f"{root}jobs/{job}/cancel", form={"csrf": "forged"})
    assert forged.status == 403
    assert (await (await gateway.manager()).reads.get(job)).status.is_active
    page.on("dialog", lambda dialog: dialog.accept())
    await page.locator("#cancel").click()
    await expect(page.locator(".notice")).to_contain_text("Cancel requested")
    # The owning gateway's cancel poller stops it; the open page shows it by itself.
    await expect(page.locator("#job-state")).to_have_text("cancelled", timeout=LIVE_S)
    await ended(gateway, job)


async def test_read_only_has_no_action_button_and_refuses_the_post(
        dashboard_site: Site, browser: Browser, tmp_path: Path) -> None:
    repo = checkout(tmp_path / "checkout")
    gateway = await dashboard_site.start_gateway()
    job = await submit(gateway, "edit notes @write=notes.txt", working_dir=str(repo),
                       isolation="worktree")
    await ended(gateway, job)
    page = await opened(browser, await dashboard_site.dashboard())
    root = page.url
    await page.goto(f"{root}jobs/{job}")
    await expect(page.locator(".diff-file h3")).to_have_text("notes.txt")
    assert await page.locator("#apply").count() == 0
    assert await page.locator("form[method=post]").count() == 0
    refused = await page.request.post(f"{root}jobs/{job}/apply", form={"csrf": "x"})
    assert refused.status == 403
    assert not (repo / "notes.txt").exists()


async def test_no_token_is_401_and_a_foreign_origin_is_403(
        dashboard_site: Site, browser: Browser) -> None:
    await dashboard_site.start_gateway()  # the store exists once a gateway has started
    address = await dashboard_site.dashboard()
    root = address.split("?")[0]
    stranger = await browser.new_context()
    try:
        assert (await stranger.request.get(root)).status == 401
        assert (await stranger.request.get(root + "?token=wrong")).status == 401
    finally:
        await stranger.close()
    page = await opened(browser, address)
    foreign = await page.request.get(root, headers={"Origin": "http://evil.example"})
    assert foreign.status == 403
    own = await page.request.get(root, headers={"Origin": root.rstrip("/")})
    assert own.status == 200
    # The printed address opened again where the session is: the page, not a refusal.
    await page.goto(address)
    assert page.url == root
    await expect(page.locator("h1")).to_have_text("Jobs")
    # The one-time token is spent: a second browser cannot use the printed address again.
    again = await browser.new_context()
    try:
        assert (await again.request.get(address)).status == 401
    finally:
        await again.close()


async def test_a_prompt_with_a_script_and_terminal_escapes_shows_as_text(
        dashboard_site: Site, browser: Browser) -> None:
    gateway = await dashboard_site.start_gateway()
    prompt = ("<script>window.pwned = 1</script> \x1b[31mRED\x1b[0m "
              "\x1b]0;TITLE\x07\x1b]52;c;Zm9v\x07 <img src=x onerror=\"window.pwned=2\">")
    job = await submit(gateway, prompt)
    await ended(gateway, job)
    page = await opened(browser, await dashboard_site.dashboard())
    row = page.locator(f"#job-{job} .prompt")
    await expect(row).to_contain_text("<script>window.pwned = 1</script> RED")
    await page.goto(f"{page.url}jobs/{job}")
    shown = await page.locator("#prompt").inner_text()
    assert "<script>window.pwned = 1</script> RED" in shown
    assert '<img src=x onerror="window.pwned=2">' in shown
    assert "\x1b" not in shown and "TITLE" not in shown and "Zm9v" not in shown
    assert await page.evaluate("typeof window.pwned") == "undefined"
    assert await page.title() == f"Job {job[:8]} · agent-cli-gateway"


def last_progress(text: str) -> int:
    return max(int(n) for n in re.findall(r"progress (\d+)/", text))


def checkout(path: Path) -> Path:
    """A caller's repository: one tracked file, one commit."""
    path.mkdir()
    for args in (["init", "-q", "-b", "main"], ["add", "."], ["commit", "-q", "-m", "init"]):
        if args[0] == "add":
            (path / "README.md").write_text("hello\n")
        subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True,
                       env={"PATH": "/usr/bin:/bin", "HOME": str(path.parent), **GIT_ID})
    return path


async def test_serve_over_http_shows_the_dashboard_at_ui_behind_its_bearer_token(
        dashboard_site: Site, browser: Browser) -> None:
    gateway = await dashboard_site.start_gateway()
    job = await submit(gateway, "seen through /ui")
    await ended(gateway, job)
    server = await anyio.to_thread.run_sync(start_http_server, dashboard_site.home,
                                            dashboard_site.config, free_port())
    try:
        stranger = await browser.new_context()
        try:
            assert (await stranger.request.get(f"{server.base}/ui/")).status == 401
            assert (await stranger.request.get(f"{server.base}/ui/?token=wrong")).status == 401
        finally:
            await stranger.close()
        page = await browser.new_page()
        await page.goto(f"{server.base}/ui/?token={TOKEN}")
        assert page.url == f"{server.base}/ui/"
        await expect(page.locator(f"#job-{job}")).to_contain_text("seen through /ui")
        await page.locator(f"#job-{job} a").click()
        await expect(page.locator("#prompt")).to_have_text("seen through /ui")
        foreign = await page.request.get(f"{server.base}/ui/",
                                         headers={"Origin": "http://evil.example"})
        assert foreign.status == 403
        refused = await page.request.post(f"{server.base}/ui/jobs/{job}/cancel",
                                          form={"csrf": "x"})
        assert refused.status == 403  # /ui is read-only
    finally:
        await anyio.to_thread.run_sync(server.stop)


async def test_an_attempt_groups_page_shows_ranks_and_winner_and_apply_changes_the_checkout(
        dashboard_site: Site, browser: Browser, tmp_path: Path) -> None:
    repo = attempts_checkout(tmp_path / "checkout")
    gateway = await dashboard_site.start_gateway()
    group_id, jobs = await finished_group(gateway, repo)
    page = await opened(browser, await dashboard_site.dashboard("--allow-actions"))
    await page.locator("nav a", has_text="Attempts").click()
    await page.locator(f"#group-{group_id} a").click()
    await expect(page.locator(f"#attempt-{jobs['claude']} .rank")).to_have_text("1 ★")
    await expect(page.locator(f"#attempt-{jobs['codex']} .rank")).not_to_have_text(
        re.compile("^1"))
    await expect(page.locator("#winner")).to_contain_text(jobs["claude"][:8])
    await expect(page.locator(".side-by-side .side")).to_have_count(2)
    assert not (repo / "notes.txt").exists()
    page.on("dialog", lambda dialog: dialog.accept())
    await page.locator(f"#apply-{jobs['claude']}").click()
    await expect(page.locator(".notice")).to_contain_text("applied")
    await expect(page.locator("#group-status")).to_have_text("picked")
    assert "written by fake-claude" in (repo / "notes.txt").read_text()
