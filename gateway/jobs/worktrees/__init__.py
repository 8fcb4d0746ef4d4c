"""A git worktree per job (issue #27): made before the CLI starts, committed when it ends,
diffed, applied or discarded on request, and removed when nothing needs it any more.

`create` makes and verifies one; `finish` commits and reports at the end of a run; `changes`
answers `llm_job_changes`; `records` is what the host knows of the worktrees it made; `gc`
applies the retention. All git goes through `git.git` (hooks off, no prompt).
"""
