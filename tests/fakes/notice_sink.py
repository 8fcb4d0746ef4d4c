"""A `[notify] command` for the notice tests: appends one JSON line per call to the file
named by its first argument: the other arguments and the notice it read on stdin."""

from __future__ import annotations

import json
import sys

if __name__ == "__main__":
    notice = json.loads(sys.stdin.read())
    with open(sys.argv[1], "a", encoding="utf-8") as out:
        out.write(json.dumps({"argv": sys.argv[2:], "notice": notice}) + "\n")
