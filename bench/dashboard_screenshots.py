"""Screenshots of the dashboard's pages for docs/ (issue #41), taken by the same headless
Chromium the browser tests drive, from test data made the way the tests make it: two
gateways on one store running the fake CLIs. Run from the repository's root:

    uv run python bench/dashboard_screenshots.py     # writes docs/images/dashboard-*.png

Needs Debian's `chromium` (or $CHROMIUM).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import anyio
from playwright.async_api import ViewportSize

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gateway.jobs.requests import SubmitRequest  # noqa: E402
from gateway.runtime import Gateway  # noqa: E402
from tests.dashboard.groups import checkout as attempts_checkout  # noqa: E402
from tests.dashboard.groups import finished_group  # noqa: E402
from tests.dashboard.site import chromium, site  # noqa: E402

IMAGES = ROOT / "docs" / "images"
VIEWPORT: ViewportSize = {"width": 1280, "height": 760}
GIT_ID = {"GIT_AUTHOR_NAME": "docs", "GIT_AUTHOR_EMAIL": "docs@example.invalid",
          "GIT_COMMITTER_NAME": "docs", "GIT_COMMITTER_EMAIL": "docs@example.invalid"}


async def submit(gateway: Gateway, provider: str, prompt: str, **more: object) -> str:
    manager = await gateway.manager()
    done = await manager.submit(provider, SubmitRequest(prompt=prompt, force_refresh=True,
                                                        **more))  # type: ignore[arg-type]
    return done.job.id


async def settle(gateway: Gateway, job_id: str) -> None:
    manager = await gateway.manager()
    with anyio.fail_after(120):
        while not (await manager.reads.get(job_id)).status.is_terminal:
            await anyio.sleep(0.1)


def checkout(path: Path) -> Path:
    path.mkdir()
    (path / "src").mkdir()
    (path / "src" / "app.py").write_text("print('app')\n")
    (path / "README.md").write_text("# demo\n")
    for args in (["init", "-q", "-b", "main"], ["add", "."], ["commit", "-q", "-m", "init"]):
        subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True,
                       env={"PATH": "/usr/bin:/bin", "HOME": str(path.parent), **GIT_ID})
    return path


async def main_async() -> None:
    IMAGES.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dashboard-shots-") as tmp:
        async with site(Path(tmp)) as made, chromium() as browser:
            first, second = await made.start_gateway(), await made.start_gateway()
            repo = checkout(Path(tmp) / "checkout")
            finished = [
                (first, await submit(first, "claude", "Explain the lease design in detail "
                                     "@tokens=1200:340 @cost=0.0123")),
                (second, await submit(second, "codex", "Write tests for the reaper's "
                                      "compare-and-set @tokens=2400:610")),
                (second, await submit(second, "gemini", "Summarize CHANGELOG.md @exit=1")),
                (first, await submit(first, "claude", "Add a greeting to the app "
                                     "@write=src/app.py,NOTES.md @cost=0.031",
                                     working_dir=str(repo), isolation="worktree")),
            ]
            for gateway, job in finished:
                await settle(gateway, job)
            group_id, _ = await finished_group(  # python3 from PATH: no host path on the page
                second, attempts_checkout(Path(tmp) / "attempts"), interpreter="python3")
            running = await submit(first, "devin", "Port the build to the new toolchain "
                                   "@stream=4000:0.05")
            page = await browser.new_page(viewport=VIEWPORT)
            address = await made.dashboard()
            await page.goto(address)
            root = page.url
            await page.wait_for_selector(f"#job-{running} .badge.running")
            await page.screenshot(path=str(IMAGES / "dashboard-jobs.png"))
            await page.goto(f"{root}jobs/{finished[3][1]}")
            await page.screenshot(path=str(IMAGES / "dashboard-job-diff.png"), full_page=True)
            await page.goto(f"{root}jobs/{running}")
            await page.wait_for_function(
                "document.getElementById('tail').textContent.split('\\n').length > 25")
            await page.screenshot(path=str(IMAGES / "dashboard-job-tail.png"))
            await page.goto(f"{root}attempts/{group_id}")
            await page.screenshot(path=str(IMAGES / "dashboard-attempts.png"), full_page=True)
            await page.goto(f"{root}usage")
            await page.screenshot(path=str(IMAGES / "dashboard-usage.png"), full_page=True)
            await page.goto(f"{root}gateways")
            await page.screenshot(path=str(IMAGES / "dashboard-gateways.png"))
            await (await first.manager()).cancel(running)


if __name__ == "__main__":
    anyio.run(main_async)
