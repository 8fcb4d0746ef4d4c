"""The run machinery: how one provider run is launched, supervised, watched and read back.

Below admission (gateway/jobs/manager.py) and above the platform facts (gateway/proc.py over
gateway/platform/): the runner (runner.py, `ProcessRun`; a run's spec and identity in
spec.py, a supervisor just forked in spawned.py) hands a run to a supervisor (supervisor.py)
that its gateway's zygote forks (zygote.py; the gateway's end of it, which also reports each
supervisor's exit: forks.py), reads the spool files (spool.py) and turns the supervisor's
end record into a run outcome (record_to_outcome.py).
"""
