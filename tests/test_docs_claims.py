"""Numbers and pictures in the docs that follow from the code: the schema version they
name, and the four Mermaid diagrams a reader asked for (#25), whose timings are the config's
defaults. A changed default or a new schema version that the docs do not follow fails here."""

from __future__ import annotations

import math
import re
from pathlib import Path

from gateway.config import Settings
from gateway.store.base import SCHEMA_VERSION

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
CLIENT_TOOL_TIMEOUT_S = 60  # the common MCP client tool timeout the deferral is sized for


def read(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def mermaid_blocks(text: str) -> list[str]:
    return re.findall(r"^```mermaid\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def block_after(text: str, heading: str) -> str:
    """The first Mermaid block after `heading`."""
    return mermaid_blocks(text[text.index(heading):])[0]


def test_every_schema_version_the_docs_call_current_is_the_codes() -> None:
    claims = []
    for path in [*DOCS.glob("*.md"), REPO / "README.md"]:
        text = path.read_text(encoding="utf-8")
        claims += [(path.name, int(n)) for n in re.findall(r"current version (\d+)", text)]
        claims += [(path.name, int(n)) for n in re.findall(r"store \.\.\. schema version (\d+)", text)]
    assert claims, "no schema version claim found: the test reads the wrong text"
    assert all(version == SCHEMA_VERSION for _, version in claims), claims


def test_the_lease_timeline_uses_the_default_heartbeat_ttl_and_sweep() -> None:
    lease = Settings().lease
    heartbeat, ttl, sweep = lease.heartbeat_s, lease.ttl_s, lease.sweep_interval_s
    diagram = block_after(read("architecture.md"), "### When a dead gateway's job is orphaned")
    deadline = heartbeat + ttl
    first_sweep_past = math.ceil(deadline / sweep) * sweep
    assert diagram.startswith("sequenceDiagram")
    assert f"lease_deadline = now + {ttl:g} s" in diagram
    assert f"t={heartbeat:g} s heartbeat: lease_deadline = {deadline:g} s" in diagram
    assert f"t={first_sweep_past:g} s sweep: deadline passed, job becomes orphaned" in diagram
    # The bound the text gives is the design's: ttl + sweep after the last heartbeat.
    assert f"({ttl + sweep:g} s)" in read("architecture.md")
    assert f"{ttl + sweep:g} s with the defaults" in read("operations.md")  # its pointer


def test_the_detach_then_adopt_timeline_shows_both_gateways_and_the_supervisor() -> None:
    diagram = block_after(read("architecture.md"),
                          "### Detach then adopt across a client restart")
    for step in ("participant A as Gateway A", "participant B as Gateway B", "Supervisor",
                 "detach:", "adoption sweep", "owner = B", "finalize"):
        assert step in diagram, step


def test_the_sync_deferral_timeline_uses_the_default_deferral() -> None:
    defer = Settings().limits.sync_defer_after_s
    diagram = block_after(read("tools.md"), "### Sync deferral")
    assert f"t={defer:g} s: sync_defer_after_s" in diagram
    assert f"answered {CLIENT_TOOL_TIMEOUT_S - defer:g} s inside the client's timeout" in diagram
    assert "llm_job_wait" in diagram and "llm_job_result" in diagram


def test_the_deployment_shapes_picture_has_the_three_shapes() -> None:
    diagram = block_after(read("operations.md"), "## Deployment shapes")
    assert diagram.startswith("flowchart")
    assert len(re.findall(r"^\s*subgraph ", diagram, re.MULTILINE)) == 3
    for shape in ("stdio", "HTTP", "PostgreSQL"):
        assert shape in diagram, shape
