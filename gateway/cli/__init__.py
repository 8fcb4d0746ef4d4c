"""The operator command line: serve, init, doctor, jobs."""
