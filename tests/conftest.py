"""Fixtures shared by every test area.

- `anyio_backend`: the anyio pytest plugin runs `pytest.mark.anyio` tests on asyncio.
- `children`: the child processes a test starts, reaped at its end (tests/children.py).
- A throwaway PostgreSQL server for the whole session (`postgres_server`) and a fresh
  database per test (`postgres_dsn`). Real PostgreSQL, never a mock: the lease invariants
  rely on its row locks and its clock.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import pytest
import structlog

from gateway import platform
from gateway.jobs.run import forks
from tests import zygote_coverage
from tests.children import Children
from tests.waiting import scaled

# The tiers: which tests are `slow` by where they are, and the guard that fails a test of the
# fast tier that starts a process or a server.
pytest_plugins = ["tests.tiers"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def children() -> Iterator[Children]:
    """Track each child process the test starts: all are waited for and their pipes closed
    at its end, pass or fail (warnings are errors: an unreaped Popen is one)."""
    started = Children()
    try:
        yield started
    finally:
        started.reap_all()


@pytest.fixture(scope="session", autouse=True)
def zygotes_measured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Under pytest-cov, the zygotes this process starts and their supervisors are measured
    too (tests/zygote_coverage.py); otherwise nothing changes."""
    boot = zygote_coverage.measured_boot(tmp_path_factory.mktemp("zygote-coverage"))
    if boot is None:
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(forks, "ZYGOTE_BOOT", boot)
        yield
    zygote_coverage.close_zygote()  # it saves its data as it exits: before pytest-cov combines


# -- throwaway PostgreSQL -----------------------------------------------------------------

PG_START_TIMEOUT_S = 60  # first start after initdb on a busy 2-core CI box can be slow
PG_STOP_TIMEOUT_S = 30  # immediate stop is near-instant; the bound only guards a hang
PG_ADMIN_TIMEOUT_S = 30  # CREATE/DROP DATABASE copies template1; generous on slow disks
PG_PORT_ATTEMPTS = 3  # a free port can be taken between probing it and the server binding
PG_SUPERUSER = "postgres"  # initdb -U: the same name whether or not we run as root
PG_SYSTEM_USER = "postgres"  # who runs initdb/pg_ctl when the tests run as root
SBIN_PATH = "/usr/sbin:/sbin"  # where runuser lives on Debian; not always on a CI PATH
PG_DIR_PREFIX = "acg-pg-"  # temp dirs of throwaway servers (reaped when their owner died)
OWNER_FILE = "owner.pid"  # the pytest process that started the server

# Fast and disposable: nothing here survives the session, so durability against an OS crash
# or power loss (fsync, full_page_writes) is wasted time. synchronous_commit stays ON: with
# it off, a `stop()` in immediate mode (the crash the chaos tests simulate) loses the last
# commits, which a real server never does; with fsync off, on costs one write() per commit.
PG_SERVER_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "fsync": "off",
    "synchronous_commit": "on",
    "full_page_writes": "off",
    "max_connections": "200",
    "shared_buffers": "32MB",
    "log_min_messages": "warning",
    "log_timezone": "'UTC'",
}

T = TypeVar("T")


class PostgresUnavailable(Exception):
    """The throwaway server could not be set up; the message says why."""


def clean_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HOME in tmp (made) and no AGENT_GATEWAY_* from the developer's shell: what every test
    of the configuration starts from."""
    for name in list(os.environ):
        if name.upper().startswith("AGENT_GATEWAY_"):
            monkeypatch.delenv(name)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def ci_or_quick(ci: T, quick: T) -> T:
    """The size of one of the longest runs (chaos, upgrade): the full one in CI (`CI=true`,
    which .ci/run sets), a quick one by default, so `uv run pytest` on a laptop stays short
    while CI keeps the counts that make a rare fault likely to show."""
    return ci if in_ci() else quick


def find_pg_bindir() -> Path | None:
    """Where initdb/pg_ctl live: `pg_config --bindir`, Debian's versioned dirs, or PATH."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=scaled(10), check=True
            ).stdout.strip()
            if out:
                candidates.append(Path(out))

    def version_of(path: Path) -> float:
        try:
            return float(path.parent.name)
        except ValueError:
            return 0.0

    debian = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=version_of, reverse=True)
    candidates.extend(debian)
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(initdb).resolve().parent)
    for bindir in candidates:
        if (bindir / "initdb").is_file() and (bindir / "pg_ctl").is_file():
            return bindir
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run_in_fresh_loop(make: Callable[[], Awaitable[T]], timeout: float) -> T:
    """Run a coroutine on its own event loop in a helper thread.

    Sync fixtures must not touch the event loop the anyio plugin drives in the main thread.
    """

    async def runner() -> T:
        return await make()

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, runner()).result(timeout=timeout)


class PostgresServer:
    """A PostgreSQL cluster in a temp dir, listening on 127.0.0.1:<free port>, trust auth.

    Chaos tests may `stop()` and `start()` it; `postgres_dsn` makes sure it runs again
    before it drops its database.
    """

    def __init__(self, bindir: Path, base_dir: Path | None = None,
                 settings: dict[str, str] | None = None) -> None:
        self.bindir = bindir
        self.extra_settings = dict(settings or {})  # over PG_SERVER_SETTINGS (max_connections...)
        self.as_root = os.geteuid() == 0
        if base_dir is None:
            base_dir = Path(tempfile.mkdtemp(prefix=PG_DIR_PREFIX))
            # Which test session owns this server, so a later session can reap it if this
            # one is killed before its teardown (e.g. `timeout` sends SIGTERM).
            (base_dir / OWNER_FILE).write_text(str(os.getpid()))
        self.base_dir = base_dir
        self.data_dir = self.base_dir / "data"
        self.socket_dir = self.base_dir / "sock"
        self.log_file = self.base_dir / "server.log"
        self.port = 0
        self._running = False
        self._version_num = 0

    # -- DSNs -------------------------------------------------------------------------------
    def dsn_for(self, dbname: str, *, password: str | None = None,
                user: str = PG_SUPERUSER) -> str:
        """A DSN to `dbname`; trust auth ignores `password`, so tests can check redaction.

        `sslmode=disable`: this server has no TLS, and asyncpg's default (prefer) first
        negotiates it on every new connection. A connect cancelled by a gateway's stop in
        that exchange leaves a future whose ConnectionError nobody retrieves, which the
        test runner reports as the test's error (seen once in CI)."""
        secret = f":{password}" if password else ""
        return (f"postgresql://{user}{secret}@127.0.0.1:{self.port}/{dbname}"
                f"?sslmode=disable")

    @property
    def admin_dsn(self) -> str:
        return self.dsn_for("postgres")

    # -- lifecycle --------------------------------------------------------------------------
    def _run(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        """Run a server binary; as root, as the postgres system user (initdb refuses root).

        `runuser` (often only in /usr/sbin, which a CI PATH may lack) when it exists, else
        Python's own setuid switch; cwd is our temp dir, which that user can enter.
        """
        switch: dict[str, Any] = {}
        if self.as_root:
            runuser = shutil.which("runuser", path=f"{os.environ.get('PATH', '')}:{SBIN_PATH}")
            if runuser:
                argv = [runuser, "-u", PG_SYSTEM_USER, "--", *argv]
            else:
                switch = {"user": PG_SYSTEM_USER, "group": PG_SYSTEM_USER, "extra_groups": []}
        return subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
            cwd=self.base_dir,
            **switch,
        )

    def _log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def init(self) -> None:
        """initdb into a temp dir the server user owns."""
        self.socket_dir.mkdir()
        if self.as_root:
            try:
                entry = pwd.getpwnam(PG_SYSTEM_USER)
            except KeyError:
                raise PostgresUnavailable(
                    f"running as root but there is no '{PG_SYSTEM_USER}' system user to run "
                    "initdb (install the postgresql package)"
                ) from None
            for path in (self.base_dir, self.socket_dir):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        self.base_dir.chmod(0o755)
        result = self._run(
            [
                str(self.bindir / "initdb"),
                "-D", str(self.data_dir),
                "-U", PG_SUPERUSER,
                "-A", "trust",
                "-E", "UTF8",
                "--locale=C",
                "--no-sync",
            ],
            timeout=PG_START_TIMEOUT_S,
        )
        if result.returncode != 0:
            raise PostgresUnavailable(f"initdb failed: {(result.stderr or result.stdout).strip()}")
        version = (self.data_dir / "PG_VERSION").read_text().strip()
        self._version_num = int(version.split(".")[0]) * 10000

    def _write_settings(self) -> None:
        settings = {**PG_SERVER_SETTINGS, **self.extra_settings}
        settings["port"] = str(self.port)
        settings["unix_socket_directories"] = f"'{self.socket_dir}'"
        # postgresql.auto.conf is read last, so it overrides postgresql.conf. Rewriting the
        # existing file in place keeps its owner (the server user) even when we are root.
        conf = self.data_dir / "postgresql.auto.conf"
        with conf.open("w") as fh:
            fh.write("# written by tests/conftest.py\n")
            for key, value in settings.items():
                fh.write(f"{key} = {value}\n")

    def start(self) -> None:
        """Start (or restart after `stop`) the server; blocks until it accepts connections."""
        if self._running:
            return
        # A restart keeps its port (DSNs handed out stay valid); a first start may retry.
        first_start = not self.port
        reason = ""
        for _ in range(PG_PORT_ATTEMPTS if first_start else 1):
            if first_start:
                self.port = _free_port()
                self._write_settings()
            result = self._run(
                [
                    str(self.bindir / "pg_ctl"),
                    "-D", str(self.data_dir),
                    "-l", str(self.log_file),
                    "-w", "-t", str(PG_START_TIMEOUT_S),
                    "start",
                ],
                timeout=PG_START_TIMEOUT_S + 10,
            )
            if result.returncode == 0:
                self._running = True
                return
            reason = f"{(result.stderr or result.stdout).strip()}\n{self._log_tail()}"
        raise PostgresUnavailable(f"pg_ctl start failed: {reason}")

    def stop(self, mode: str = "immediate") -> None:
        """Stop the server (`immediate`: like a crash; the next start runs recovery)."""
        if not self.data_dir.exists():
            return
        result = self._run(
            [str(self.bindir / "pg_ctl"), "-D", str(self.data_dir), "-m", mode, "-w", "stop"],
            timeout=PG_STOP_TIMEOUT_S,
        )
        self._running = False
        if result.returncode != 0 and "not running" not in (result.stderr + result.stdout):
            raise PostgresUnavailable(f"pg_ctl stop failed: {result.stderr.strip()}")

    def is_running(self) -> bool:
        return self._running

    def ensure_running(self) -> None:
        if not self._running:
            self.start()

    def destroy(self) -> None:
        """Stop the server and delete its files; safe to call twice."""
        with contextlib.suppress(Exception):
            self.stop()
        shutil.rmtree(self.base_dir, ignore_errors=True)

    # -- databases --------------------------------------------------------------------------
    def _admin(self, statements: list[str]) -> None:
        async def run() -> None:
            conn = await asyncpg.connect(self.admin_dsn, timeout=PG_ADMIN_TIMEOUT_S)
            try:
                for statement in statements:
                    await conn.execute(statement)
            finally:
                await conn.close()

        _run_in_fresh_loop(run, timeout=PG_ADMIN_TIMEOUT_S * (len(statements) + 1))

    def admin(self, statements: list[str]) -> None:
        """Run statements as the superuser (roles, databases: what a test sets up)."""
        self._admin(statements)

    def create_database(self, name: str) -> None:
        self._admin([f'CREATE DATABASE "{name}"'])

    def drop_database(self, name: str) -> None:
        """Drop even while a test's pool still holds connections to it."""
        if self._version_num >= 130000:
            self._admin([f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'])
            return
        self._admin(
            [
                (
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    f"WHERE datname = '{name}' AND pid <> pg_backend_pid()"
                ),
                f'DROP DATABASE IF EXISTS "{name}"',
            ]
        )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_abandoned_servers(bindir: Path) -> None:
    """Stop and delete throwaway servers whose test session died without its teardown."""
    for base_dir in Path(tempfile.gettempdir()).glob(f"{PG_DIR_PREFIX}*"):
        try:
            owner = int((base_dir / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue  # not ours, or still being created
        if _pid_alive(owner):
            continue
        PostgresServer(bindir, base_dir).destroy()


def _start_or_give_up(settings: dict[str, str] | None = None) -> PostgresServer:
    bindir = find_pg_bindir()
    if bindir is None:
        raise PostgresUnavailable(
            "no PostgreSQL server binaries (initdb, pg_ctl) found via pg_config, "
            "/usr/lib/postgresql/*/bin or PATH; install the postgresql package"
        )
    reap_abandoned_servers(bindir)
    server = PostgresServer(bindir, settings=settings)
    try:
        server.init()
        server.start()
    except BaseException:
        server.destroy()
        raise
    return server


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One throwaway PostgreSQL server for the session, stopped and deleted at the end.

    Skips PostgreSQL tests when the server cannot be started locally; in CI (CI=true) that
    is a failure, never a skip.
    """
    try:
        server = _start_or_give_up()
    except (PostgresUnavailable, OSError, subprocess.SubprocessError) as exc:
        message = f"throwaway PostgreSQL could not be started: {exc}"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    # Belt and braces: an interrupted session must not leave a server running.
    atexit.register(server.destroy)
    try:
        yield server
    finally:
        server.destroy()
        atexit.unregister(server.destroy)


@pytest.fixture
def make_postgres_server() -> Iterator[Callable[[dict[str, str]], PostgresServer]]:
    """Start a throwaway server of the test's own with these server settings (for example a
    low `max_connections`); every one is stopped and deleted after the test. Like
    `postgres_server`, a skip locally and a failure in CI when none can be started."""
    servers: list[PostgresServer] = []

    def make(settings: dict[str, str]) -> PostgresServer:
        try:
            server = _start_or_give_up(settings)
        except (PostgresUnavailable, OSError, subprocess.SubprocessError) as exc:
            message = f"throwaway PostgreSQL could not be started: {exc}"
            if in_ci():
                pytest.fail(message, pytrace=False)
            pytest.skip(message)
        servers.append(server)
        return server

    try:
        yield make
    finally:
        for server in servers:
            server.destroy()


@pytest.fixture
def postgres_dsn(postgres_server: PostgresServer) -> Iterator[str]:
    """A DSN to a fresh, empty database (`t_<hex>`), dropped after the test."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    postgres_server.ensure_running()
    postgres_server.create_database(name)
    try:
        yield postgres_server.dsn_for(name)
    finally:
        # A chaos test that failed half-way may have left the server stopped.
        postgres_server.ensure_running()
        postgres_server.drop_database(name)


@pytest.fixture(scope="session")
def pgbouncer(postgres_server: PostgresServer) -> Iterator[Any]:
    """A throwaway PgBouncer (transaction pooling) in front of the session's server
    (tests/pgbouncer.py). A skip locally without the binary; a failure in CI."""
    from tests.pgbouncer import PgBouncer, PgBouncerUnavailable

    bouncer = PgBouncer(postgres_server.port, PG_SUPERUSER)
    try:
        bouncer.start()
    except (PgBouncerUnavailable, OSError, subprocess.SubprocessError, KeyError) as exc:
        bouncer.stop()
        message = f"throwaway PgBouncer could not be started: {exc}"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    atexit.register(bouncer.stop)
    try:
        yield bouncer
    finally:
        bouncer.stop()
        atexit.unregister(bouncer.stop)


@pytest.fixture
def pgbouncer_dsn(pgbouncer: Any, postgres_dsn: str) -> str:
    """The test's fresh database (postgres_dsn), reached through the PgBouncer."""
    return str(pgbouncer.dsn_for(postgres_dsn.rsplit("/", 1)[1].split("?", 1)[0]))


_POSTGRES_FIXTURES = frozenset({"postgres_server", "postgres_dsn", "make_postgres_server",
                                "pgbouncer", "pgbouncer_dsn"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that needs the server `postgres` (so `-m "not postgres"` works) and
    `slow` (so `-m "not slow"`, the fast tier of the edit-test loop, leaves it out).

    Covers tests that request the fixtures directly and parametrized matrices whose
    parameter id names postgres (e.g. a `store` fixture over memory/sqlite/postgres).
    The tests slow by where they are are marked by tests/tiers.py; a slow test elsewhere
    carries `pytest.mark.slow` itself.
    """
    for item in items:
        names: Any = getattr(item, "fixturenames", ())
        callspec = getattr(item, "callspec", None)
        param_ids = callspec.id.split("-") if callspec is not None else []
        if _POSTGRES_FIXTURES & set(names) or {"postgres", "pgbouncer"} & set(param_ids):
            item.add_marker(pytest.mark.postgres)
            item.add_marker(pytest.mark.slow)


@pytest.fixture(params=list(platform.IMPLEMENTATIONS))
def platform_impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs the test once per platform implementation (gateway/platform), forced through
    AGENT_GATEWAY_PLATFORM for this process and every gateway and supervisor it starts: so
    CI on Linux runs every line of the run lifecycle that a Mac runs (`portable`), except
    the kqueue call itself (tests/platform/). Use it on the lifecycle modules with
    `pytestmark = [..., pytest.mark.usefixtures("platform_impl")]`, not on the whole suite."""
    name = str(request.param)
    try:
        platform.choose(name)
    except platform.UnknownPlatform as exc:  # `linux` where this is not Linux
        pytest.skip(str(exc))
    monkeypatch.setenv(platform.ENV_VAR, name)
    return name


@pytest.fixture(autouse=True)
def _logging_restored() -> Iterator[None]:
    """A test that runs the CLI in this process (`main([...])`) points structlog and the
    root logger at the stream it had then: pytest's capture of that test, closed after it.
    Each test gets back the logging it started with, so a later in-process gateway never
    writes to a closed file (it did: 'I/O operation on closed file' in the next tests)."""
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.configure(**saved)
    root.handlers[:] = handlers
    root.setLevel(level)
