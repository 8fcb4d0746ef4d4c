"""The judge of an attempt group: one more CLI job that reads the qualifying attempts and names
one, and the gateway's validation of its answer.

Why a judge at all: the deterministic ranking (ranking.py) can only tell qualifying attempts
apart by proxies (fewer changed lines, cost, duration); a model that reads the diffs can tell
which fix is right. Why the gateway validates it: a judge is an agent like the others, so its
answer is a claim: it must parse as JSON `{"job_id": ..., "reason": ...}` and name an attempt
that qualifies (class 1, or class 2 when the group has no check). Anything else (garbage, a
failed attempt, a failed or timed-out judge job) keeps the deterministic order and says why
in `judge.error`; the group never waits on a judge longer than its job's own timeout.

The judge runs in the caller's checkout without a worktree (isolation "none") and is told it
must not change anything: it only reads the diffs this prompt carries. Exactly one judge per
group, across gateways: the coordinator claims it with a compare-and-set on the group row
(judge_job_id is set once; see sqlite/attempts.py END_GROUP), and the judge's prompt is built
from stored evidence only, so two gateways racing submit the identical request and the job
dedup answers both with one job.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.jobs.requests import SubmitRequest
from gateway.model import JobRow, JobStatus
from gateway.store.attempts import AttemptGroupRow

DEFAULT_JUDGE_TIMEOUT_S = 600.0
CHECK_TAIL_CHARS = 2000
ANSWER_CHARS = 64 * 1024
REASON_CHARS = 500


@dataclass(frozen=True, slots=True)
class Candidate:
    """One qualifying attempt as the judge reads it."""

    job_id: str
    provider: str
    model: str | None
    diff: str  # the patch against base_sha, possibly cut (the prompt says so)
    diff_cut: bool
    check_tail: str | None


def judge_prompt(group: AttemptGroupRow, candidates: Sequence[Candidate]) -> str:
    """What the judge is asked: the task, each candidate's diff and check tail, the format."""
    parts = [
        "You are judging several attempts at one coding task. Do not change any file: only "
        "read what follows and choose the attempt whose change best does the task.",
        "", "## The task", group.prompt, "",
    ]
    if group.check_argv:
        parts += [f"Every attempt below passed the check `{' '.join(group.check_argv)}`.", ""]
    for candidate in candidates:
        model = f" ({candidate.model})" if candidate.model else ""
        parts += [f"## Attempt {candidate.job_id}: {candidate.provider}{model}", "",
                  "```diff", candidate.diff.rstrip("\n"), "```"]
        if candidate.diff_cut:
            parts.append("(diff cut at the size limit)")
        if candidate.check_tail:
            parts += ["Check output (tail):", "```", candidate.check_tail.rstrip("\n"), "```"]
        parts.append("")
    ids = ", ".join(c.job_id for c in candidates)
    parts += ["## Your answer",
              "Answer with one JSON object and nothing else, naming one of these attempts "
              f"({ids}): {{\"job_id\": \"<the attempt's id>\", \"reason\": \"<one line>\"}}"]
    return "\n".join(parts)


def judge_request(group: AttemptGroupRow, prompt: str, timeout_s: float) -> SubmitRequest:
    """The judge's job: read-only in the caller's checkout, the group's principal's."""
    judge = group.judge or {}
    return SubmitRequest(prompt=prompt, model=judge.get("model"), working_dir=group.working_dir,
                         timeout_s=timeout_s, isolation="none", principal=group.principal,
                         correlation_id=f"{group.group_id}:judge")


class InvalidVerdict(Exception):
    """The judge's answer cannot be used; the message says why (it becomes judge.error)."""


def _json_object(answer: str) -> dict[str, Any]:
    text = answer.strip()
    fenced = re.search(r"```(?:json)?\s*(\{.*?\})\s*```", text, re.DOTALL)
    candidates = [text] + ([fenced.group(1)] if fenced else [])
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        candidates.append(text[start:end + 1])
    for candidate in candidates:
        try:
            parsed = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(parsed, dict):
            return parsed
    raise InvalidVerdict("the judge's answer is not a JSON object {\"job_id\", \"reason\"}")


def verdict(answer: str, qualifying: Sequence[str]) -> tuple[str, str]:
    """The judged attempt and the judge's reason; InvalidVerdict when the answer does not
    name a qualifying attempt."""
    parsed = _json_object(answer[:ANSWER_CHARS])
    pick = parsed.get("job_id")
    if not isinstance(pick, str) or not pick:
        raise InvalidVerdict("the judge's answer has no job_id")
    if pick not in qualifying:
        raise InvalidVerdict(f"the judge named {pick[:64]!r}, which is not a qualifying "
                             f"attempt ({', '.join(qualifying)})")
    reason = parsed.get("reason")
    return pick, (str(reason) if reason is not None else "")[:REASON_CHARS]


def judge_failure(job: JobRow | None) -> str | None:
    """Why an ended judge job gives no verdict (None: it completed, read its answer)."""
    if job is None:
        return "the judge's job is gone"
    if job.status is JobStatus.COMPLETED:
        return None
    detail = f": {job.error[:200]}" if job.error else ""
    return f"the judge's job ended {job.status}{detail}"
