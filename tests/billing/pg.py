"""A real PostgreSQL cluster for tests: Debian's postgresql, started in a temp dir on a free port.

As root (CI), the cluster runs as the ``postgres`` system user in a directory it owns (PostgreSQL
refuses to run as root).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from harness import free_port


def _pg_bin() -> Path:
    if os.environ.get("GPULAB_PG_BIN"):
        return Path(os.environ["GPULAB_PG_BIN"])
    # Debian installs each major version side by side; take the newest (15 on Debian 12).
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name)
    )
    return found[-1].parent if found else Path("/usr/lib/postgresql/15/bin")


PG_BIN = _pg_bin()


def available() -> bool:
    return (PG_BIN / "initdb").exists() and (PG_BIN / "pg_ctl").exists()


class PgCluster:
    def __init__(self) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="gpulab-pg-"))
        self.port = free_port()
        self.user: str | None = None
        if os.geteuid() == 0:
            self.user = "postgres"
            pw = pwd.getpwnam(self.user)
            os.chown(self.base, pw.pw_uid, pw.pw_gid)
        self.data = self.base / "data"
        self.log = self.base / "pg.log"

    def _run(self, *args: str, **kw) -> subprocess.CompletedProcess:
        cmd = list(args)
        if self.user:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)

    def start(self) -> PgCluster:
        self._run(
            str(PG_BIN / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "billing",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        )
        opts = f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1 -c max_connections=100"
        self._run(
            str(PG_BIN / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-o",
            opts,
            "-w",
            "start",
        )
        self._run(
            str(PG_BIN / "createdb"),
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            "billing",
            "billing",
        )
        return self

    @property
    def url(self) -> str:
        return f"postgresql://billing@127.0.0.1:{self.port}/billing"

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(
            f"postgresql://billing@127.0.0.1:{self.port}/postgres", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql://billing@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        try:
            self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.base, ignore_errors=True)
