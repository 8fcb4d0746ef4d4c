"""The run machinery: how one provider run is launched, supervised, watched and read back.

Below admission (gateway/jobs/manager.py) and above the platform facts (gateway/proc.py over
gateway/platform/): the runner (runner.py, `ProcessRun`; a run's spec and identity in
spec.py, a supervisor just spawned in spawned.py) hands a run to a supervisor (supervisor.py,
started ahead of need by spare.py), learns the run's end (child_exit.py), reads the spool
files (spool.py) and turns the supervisor's end record into a run outcome
(record_to_outcome.py).
"""
