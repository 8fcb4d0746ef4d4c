"""A throwaway PgBouncer in transaction pooling mode in front of the throwaway PostgreSQL
(issue #29): the PostgreSQL store contract and a chaos run go through it, so the store is
proven to keep no session state (startup parameters, SET, named prepared statements).

Debian's package (`apt-get install pgbouncer`, 1.18 on Debian 12) is what `.ci/run` installs;
1.18 supports no protocol-level prepared statements, which is the case the gateway meets.
PgBouncer refuses to run as root, so as root it runs as the postgres system user, like the
server (tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

PGBOUNCER_START_TIMEOUT_S = 30.0
PGBOUNCER_SYSTEM_USER = "postgres"
SBIN_PATH = "/usr/sbin:/sbin"
DIR_PREFIX = "acg-pgb-"


class PgBouncerUnavailable(Exception):
    """PgBouncer could not be started; the message says why."""


def find_pgbouncer() -> str | None:
    return shutil.which("pgbouncer", path=f"{os.environ.get('PATH', '')}:{SBIN_PATH}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PgBouncer:
    """pgbouncer -d on 127.0.0.1:<free port>, trust auth, pool_mode = transaction."""

    def __init__(self, server_port: int, superuser: str) -> None:
        self.server_port = server_port
        self.superuser = superuser
        self.base_dir = Path(tempfile.mkdtemp(prefix=DIR_PREFIX))
        self.port = 0
        self.as_root = os.geteuid() == 0

    def dsn_for(self, dbname: str) -> str:
        return (f"postgresql://{self.superuser}@127.0.0.1:{self.port}/{dbname}"
                f"?sslmode=disable")

    def _argv(self, argv: list[str]) -> list[str]:
        if not self.as_root:
            return argv
        runuser = shutil.which("runuser", path=f"{os.environ.get('PATH', '')}:{SBIN_PATH}")
        if runuser is None:
            raise PgBouncerUnavailable("running as root and no runuser to drop to postgres")
        return [runuser, "-u", PGBOUNCER_SYSTEM_USER, "--", *argv]

    def start(self) -> None:
        binary = find_pgbouncer()
        if binary is None:
            raise PgBouncerUnavailable("no pgbouncer binary on PATH or in /usr/sbin; install "
                                       "the pgbouncer package (`.ci/run` does)")
        self.port = _free_port()
        (self.base_dir / "userlist.txt").write_text(f'"{self.superuser}" ""\n')
        ini = self.base_dir / "pgbouncer.ini"
        ini.write_text("\n".join([
            "[databases]",
            f"* = host=127.0.0.1 port={self.server_port}",
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {self.port}",
            "unix_socket_dir =",
            "auth_type = trust",
            f"auth_file = {self.base_dir / 'userlist.txt'}",
            "pool_mode = transaction",
            "max_client_conn = 1000",
            "default_pool_size = 20",
            f"logfile = {self.base_dir / 'pgbouncer.log'}",
            f"pidfile = {self.base_dir / 'pgbouncer.pid'}",
            "",
        ]))
        if self.as_root:
            import pwd

            entry = pwd.getpwnam(PGBOUNCER_SYSTEM_USER)
            for path in (self.base_dir, *self.base_dir.iterdir()):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        self.base_dir.chmod(0o755)
        result = subprocess.run(self._argv([binary, "-d", str(ini)]), capture_output=True,
                                text=True, timeout=PGBOUNCER_START_TIMEOUT_S, check=False,
                                stdin=subprocess.DEVNULL, cwd=self.base_dir)
        if result.returncode != 0:
            raise PgBouncerUnavailable(f"pgbouncer -d failed: {result.stderr or result.stdout}"
                                       f"{self._log_tail()}")
        deadline = time.monotonic() + PGBOUNCER_START_TIMEOUT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(
                    ("127.0.0.1", self.port), timeout=1):
                return
            time.sleep(0.05)
        raise PgBouncerUnavailable(f"pgbouncer did not listen on {self.port}{self._log_tail()}")

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return "\n" + "\n".join(
                (self.base_dir / "pgbouncer.log").read_text().splitlines()[-10:])
        return ""

    def log_text(self) -> str:
        with contextlib.suppress(OSError):
            return (self.base_dir / "pgbouncer.log").read_text()
        return ""

    def stop(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            pid = int((self.base_dir / "pgbouncer.pid").read_text().strip())
            os.kill(pid, signal.SIGTERM)  # 1.18: immediate shutdown
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                os.kill(pid, 0)
                time.sleep(0.05)
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.base_dir, ignore_errors=True)
