"""A throw-away PostgreSQL cluster for the tests: Debian's ``postgresql`` binaries, a temporary data folder,
127.0.0.1 and a free port, trust authentication, stopped when the test session ends.

``start()`` returns a :class:`Server` or raises :class:`Unavailable` with the reason (no binaries, no driver,
``initdb`` refused); the fixtures in ``conftest.py`` turn that into a skip that says why. PostgreSQL refuses to
run as root, so as root the cluster belongs to the ``postgres`` system user (created by the Debian package) and is
started through ``runuser``.
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import create_engine, text

USER = "lab"


class Unavailable(RuntimeError):
    """No PostgreSQL server can be started here; the message says why."""


@dataclass
class Server:
    folder: Path
    port: int
    run_as: list[str]

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{USER}@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new empty database; its URL."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        self._admin(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def drop_database(self, url: str) -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)')

    def _admin(self, statement: str) -> None:
        """One statement on the maintenance database, outside a transaction (CREATE/DROP DATABASE need that)."""
        admin = create_engine(self.url(), isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                conn.execute(text(statement))
        finally:
            admin.dispose()

    def stop(self) -> None:
        subprocess.run([*self.run_as, self._bin("pg_ctl"), "-D", str(self.folder / "data"), "-m", "immediate", "stop"],
                       capture_output=True, check=False)
        shutil.rmtree(self.folder, ignore_errors=True)

    @staticmethod
    def _bin(name: str) -> str:
        return _binary(name)


def _binary(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or ([shutil.which(name)] if shutil.which(name) else [])
    if not found:
        raise Unavailable(f"no PostgreSQL {name} (install Debian's postgresql)")
    return found[-1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start() -> Server:
    """Start a cluster in a temporary folder; :class:`Unavailable` with the reason when that cannot be done."""
    try:
        import psycopg  # noqa: F401  (the driver SQLAlchemy's postgresql+psycopg URLs load)
    except ImportError:
        raise Unavailable("the psycopg driver is not installed (pip install -e .[postgresql])") from None
    initdb, pg_ctl = _binary("initdb"), _binary("pg_ctl")
    folder = Path(tempfile.mkdtemp(prefix="compatlab-pg-"))
    run_as: list[str] = []
    if os.geteuid() == 0:
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            raise Unavailable("running as root and no 'postgres' system user to own the cluster") from None
        os.chown(folder, owner.pw_uid, owner.pw_gid)
        run_as = ["runuser", "-u", "postgres", "--"]
    data, port = folder / "data", _free_port()
    steps = (
        [*run_as, initdb, "-D", str(data), "-U", USER, "-A", "trust", "-E", "UTF8", "--no-sync"],
        [*run_as, pg_ctl, "-D", str(data), "-l", str(folder / "log"), "-w", "-t", "120", "start",
         "-o", f"-h 127.0.0.1 -p {port} -k {folder} -F -c max_connections=200"],
    )
    for argv in steps:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            log = (folder / "log").read_text(errors="replace") if (folder / "log").exists() else ""
            shutil.rmtree(folder, ignore_errors=True)
            reason = (proc.stderr.strip() or log.strip() or proc.stdout.strip()).splitlines() or ["no output"]
            raise Unavailable(f"{Path(argv[len(run_as)]).name} failed: {reason[-1]}")
    return Server(folder, port, run_as)
