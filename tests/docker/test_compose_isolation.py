"""docker-compose.yml keeps tenants away from the platform's insides, checked without starting
it: one database role per service (initdb.sql, also run in a real PostgreSQL), servers reach
billing through the proxy, the internal network holds what servers must not reach, nothing runs
as root but what must, and proxied apps listen on loopback only."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import urlparse

import pytest
from compose_helpers import (
    REQUIRED,
    command_options,
    compose_config,
    internal_network,
    service_networks,
    user_network,
)
from conftest import require
from harness import REPO, free_port
from traitlets.config import Config

INITDB = REPO / "images" / "compose" / "initdb.sql"


@pytest.fixture(scope="module")
def cfg() -> dict:
    return compose_config()


def db_urls(cfg: dict) -> dict[str, str]:
    return {
        "hub": cfg["services"]["hub"]["environment"]["GPULAB_DB_URL"],
        "billing": cfg["services"]["billing"]["environment"]["GPULAB_BILLING_DB_URL"],
    }


def sql(text: str) -> str:
    """initdb.sql's psql meta-commands, then its statements, one a line; comments dropped."""
    lines = [line.split("--", 1)[0].strip() for line in text.splitlines()]
    meta = [line for line in lines if line.startswith("\\")]
    body = " ".join(line for line in lines if line and not line.startswith("\\"))
    statements = [re.sub(r"\s+", " ", s).strip() + ";" for s in body.split(";") if s.strip()]
    return "\n".join(meta + statements)


def test_no_service_uses_the_database_superuser(cfg: dict) -> None:
    pg = cfg["services"]["postgres"]["environment"]
    superuser = pg.get("POSTGRES_USER", "postgres")
    super_pw = REQUIRED["POSTGRES_SUPERUSER_PASSWORD"]
    assert pg["POSTGRES_PASSWORD"] == super_pw
    urls = {name: urlparse(url) for name, url in db_urls(cfg).items()}
    # Each its own role, password and database.
    assert urls["hub"].username != urls["billing"].username
    assert (urls["hub"].password, urls["billing"].password) == (
        REQUIRED["GPULAB_HUB_DB_PASSWORD"],
        REQUIRED["GPULAB_BILLING_DB_PASSWORD"],
    )
    assert (urls["hub"].path, urls["billing"].path) == ("/jupyterhub", "/billing")
    for url in urls.values():
        assert url.username != superuser and url.password != super_pw
        assert url.hostname == "postgres"
    # The superuser's password is in no service but PostgreSQL itself.
    for name, svc in cfg["services"].items():
        if name != "postgres":
            assert super_pw not in str(svc), name


def test_initdb_gives_each_role_its_own_database_only(cfg: dict) -> None:
    text = sql(INITDB.read_text())
    users = {name: urlparse(url).username for name, url in db_urls(cfg).items()}
    pg_env = cfg["services"]["postgres"]["environment"]
    for service, db in (("hub", "jupyterhub"), ("billing", "billing")):
        role = users[service]
        # A login role with a password from PostgreSQL's environment (which compose sets from
        # the same .env variable as the service's URL), and no power beyond its database.
        m = re.search(rf"^CREATE ROLE {role} LOGIN ([^;]*)PASSWORD :'(\w+)';$", text, re.M)
        assert m, (role, text)
        attrs = m[1].split()
        assert not {"SUPERUSER", "CREATEDB", "CREATEROLE", "REPLICATION", "BYPASSRLS"} & set(
            attrs
        ), attrs
        var = re.search(rf"\\getenv {m[2]} (\w+)", text)[1]
        assert pg_env[var] == urlparse(db_urls(cfg)[service]).password
        assert re.search(rf"^CREATE DATABASE {db} OWNER {role};$", text, re.M), (db, text)
        # The owner keeps CONNECT; everyone else (the other service) loses it.
        assert re.search(rf"^REVOKE CONNECT[^;]* ON DATABASE {db} FROM PUBLIC;$", text, re.M)
    # Nothing is granted back.
    assert "GRANT" not in text.upper().replace("REVOKE", "")
    # The image's own POSTGRES_DB would be owned by the superuser: the databases come from here.
    assert "POSTGRES_DB" not in pg_env


def _pg_bin() -> Path | None:
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name)
    )
    # \getenv, which initdb.sql reads the passwords with, is psql 15's.
    if found and int(found[-1].parent.parent.name) >= 15:
        return found[-1].parent
    return None


def test_initdb_roles_in_a_real_postgresql(cfg: dict) -> None:
    """initdb.sql as the postgres image runs it (psql, as the superuser, with the passwords in
    the environment), then each role from outside with its password, as its service would."""
    import psycopg

    pg_bin = _pg_bin()
    require(pg_bin is not None, "PostgreSQL 15+ server binaries (Debian's postgresql)")
    base = Path(tempfile.mkdtemp(prefix="gpulab-initdb-"))
    run_as: list[str] = []
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        pw = pwd.getpwnam("postgres")
        os.chown(base, pw.pw_uid, pw.pw_gid)
        run_as = ["runuser", "-u", "postgres", "--"]
    port = free_port()
    data = base / "data"
    super_pw = REQUIRED["POSTGRES_SUPERUSER_PASSWORD"]

    def run(*cmd: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run([*run_as, *cmd], capture_output=True, text=True, timeout=60, **kw)

    pwfile = base / "pw"
    pwfile.write_text(super_pw + "\n")
    if run_as:
        shutil.chown(pwfile, "postgres")
    # What the image sets up: superuser `postgres`, password logins over TCP, trust on the socket.
    out = run(
        str(pg_bin / "initdb"), "-D", str(data), "-U", "postgres", f"--pwfile={pwfile}",
        "--auth-local=trust", "--auth-host=scram-sha-256", "--no-sync",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    opts = f"-p {port} -k {base} -c listen_addresses=127.0.0.1"
    out = run(str(pg_bin / "pg_ctl"), "-D", str(data), "-l", str(base / "log"), "-o", opts, "-w", "start")  # fmt: skip
    assert out.returncode == 0, out.stderr
    try:
        env = {
            "PATH": os.environ["PATH"],
            **{k: v for k, v in cfg["services"]["postgres"]["environment"].items()},
        }
        out = run(
            "env", *(f"{k}={v}" for k, v in env.items()),
            str(pg_bin / "psql"), "-v", "ON_ERROR_STOP=1", "--no-psqlrc", "-h", str(base),
            "-p", str(port), "-U", "postgres", "-d", "postgres", "-f", "-",
            input=INITDB.read_text(),
        )  # fmt: skip
        assert out.returncode == 0, out.stderr

        def connect(url: str, db: str | None = None):
            u = urlparse(url)
            return psycopg.connect(
                host="127.0.0.1", port=port, user=u.username, password=u.password,
                dbname=db or u.path.lstrip("/"), connect_timeout=10, autocommit=True,
            )  # fmt: skip

        urls = db_urls(cfg)
        for service, other in (("hub", "billing"), ("billing", "hub")):
            own_db = urlparse(urls[service]).path.lstrip("/")
            other_db = urlparse(urls[other]).path.lstrip("/")
            with connect(urls[service]) as conn:
                # Its own database is its to build in (migrations create tables).
                conn.execute("CREATE TABLE isolation_probe (x int)")
                conn.execute("DROP TABLE isolation_probe")
                row = conn.execute(
                    "SELECT rolsuper, rolcreatedb, rolcreaterole FROM pg_roles"
                    " WHERE rolname = current_user"
                ).fetchone()
                assert row == (False, False, False), (service, row)
                assert conn.execute("SELECT current_database()").fetchone()[0] == own_db
            for db in (other_db, "postgres"):
                with pytest.raises(psycopg.OperationalError, match="permission denied"):
                    connect(urls[service], db).close()
        # The passwords are the roles' own: the hub's password does not open billing's role.
        crossed = urls["billing"].replace(
            REQUIRED["GPULAB_BILLING_DB_PASSWORD"], REQUIRED["GPULAB_HUB_DB_PASSWORD"]
        )
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            connect(crossed).close()
    finally:
        run(str(pg_bin / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(base, ignore_errors=True)


def test_servers_reach_billing_through_the_proxy(cfg: dict, monkeypatch) -> None:
    from gpulab.hub_config.billing.hooks import configure_billing

    henv = cfg["services"]["hub"]["environment"]
    proxy = command_options(cfg["services"]["proxy"]["command"])
    users = user_network(cfg)
    # The proxy's public port, on the users' network, at billing's route.
    assert henv["GPULAB_BILLING_SERVER_URL"] == (f"http://proxy:{proxy['port']}/services/billing/")
    assert users in service_networks(cfg["services"]["proxy"])
    assert users not in service_networks(cfg["services"]["billing"])
    # What the hub makes of it: servers get the proxy's route, its own hooks billing's address.
    for key in ("GPULAB_BILLING_EXTERNAL_URL", "GPULAB_BILLING_SERVER_URL"):
        monkeypatch.setenv(key, henv[key])
    monkeypatch.setenv("GPULAB_BILLING_API_TOKEN", REQUIRED["GPULAB_BILLING_API_TOKEN"])
    c = Config()
    configure_billing(c, "/nonexistent", "", [{"name": "user", "scopes": []}])
    assert c.Spawner.environment["GPULAB_BILLING_URL"] == henv["GPULAB_BILLING_SERVER_URL"]
    [service] = c.JupyterHub.services
    assert service["url"] == henv["GPULAB_BILLING_EXTERNAL_URL"]
    # Unset: today's behaviour, the service's own address.
    monkeypatch.delenv("GPULAB_BILLING_SERVER_URL")
    c = Config()
    configure_billing(c, "/nonexistent", "", [{"name": "user", "scopes": []}])
    assert c.Spawner.environment["GPULAB_BILLING_URL"] == (
        henv["GPULAB_BILLING_EXTERNAL_URL"] + "/services/billing/"
    )
    # A malformed one is refused before anything is registered.
    monkeypatch.setenv("GPULAB_BILLING_SERVER_URL", "proxy:8000/services/billing/")
    c = Config()
    with pytest.raises(ValueError, match="GPULAB_BILLING_SERVER_URL"):
        configure_billing(c, "/nonexistent", "", [{"name": "user", "scopes": []}])
    assert "services" not in c.JupyterHub and "environment" not in c.Spawner


def test_internal_network_holds_what_servers_must_not_reach(cfg: dict) -> None:
    users, internal = user_network(cfg), internal_network(cfg)
    assert internal != users
    nets = {name: service_networks(svc) for name, svc in cfg["services"].items()}
    # Only the hub and the proxy are on the users' network; PostgreSQL and billing only inside.
    assert {name for name, n in nets.items() if users in n} == {"hub", "proxy"}
    assert set(nets["postgres"]) == set(nets["billing"]) == {internal}
    assert set(nets["hub"]) == set(nets["proxy"]) == {users, internal}
    # The proxy's API listens on an alias that exists on the internal network only, and the
    # hub uses that name.
    proxy = command_options(cfg["services"]["proxy"]["command"])
    assert proxy["api-ip"] in nets["proxy"][internal]
    assert proxy["api-ip"] not in nets["proxy"][users] and proxy["api-ip"] != "proxy"
    assert not proxy.get("ip"), "the public port listens everywhere (published, and for servers)"
    api = urlparse(cfg["services"]["hub"]["environment"]["GPULAB_PROXY_API_URL"])
    assert (api.hostname, api.port) == (proxy["api-ip"], int(proxy["api-port"]))
    # Nothing but the proxy's public port is published on the host.
    for name, svc in cfg["services"].items():
        published = [p["target"] if isinstance(p, dict) else p for p in svc.get("ports", [])]
        assert published == ([int(proxy["port"])] if name == "proxy" else []), (name, published)


def dockerfile_user(path: Path) -> str:
    users = re.findall(r"^USER\s+(\S+)", path.read_text(), re.M)
    assert users, path
    return users[-1]


def test_nothing_runs_as_root_but_what_must(cfg: dict) -> None:
    hub, billing = cfg["services"]["hub"], cfg["services"]["billing"]
    dockerfile = REPO / "images" / "hub" / "Dockerfile"
    text = dockerfile.read_text()
    # The image runs as its hub user, billing as a user of its own; both exist in the image.
    image_user = dockerfile_user(dockerfile)
    hub_user = hub.get("user", image_user)
    billing_user = billing.get("user", image_user)
    assert hub_user == image_user and billing_user != hub_user
    for user in (hub_user, billing_user):
        assert user not in ("root", "0") and not user.startswith("0:")
        assert re.search(rf"useradd [^\n]*(\\\n[^\n]*)*\b{user}\b", text), user
    # The hub reaches the Docker socket through its group (root-equivalent: images/README.md);
    # only the hub has the socket and the group.
    assert hub["group_add"] == [REQUIRED["DOCKER_GID"]]
    for name, svc in cfg["services"].items():
        mounts = " ".join(str(v) for v in svc.get("volumes", []))
        assert ("docker.sock" in mounts) == (name == "hub"), name
        assert ("group_add" in svc) == (name == "hub"), name


USER_IMAGES = ("base", "pytorch", "sd-webui", "teaching")


def test_proxied_apps_listen_on_loopback_only() -> None:
    """An app behind jupyter-server-proxy is reachable through the hub's login only if it listens
    on loopback: on the container's address every tenant on the users' network could use it."""
    start = (REPO / "images" / "sd-webui" / "start-sd-webui").read_text()
    command = start[start.index("exec python launch.py") :]
    assert "--listen" not in command and "--share" not in command
    assert re.search(r"--server-name 127\.0\.0\.1\b", command), command
    for image in USER_IMAGES:
        for path in (REPO / "images" / image).rglob("*"):
            if path.is_file() and path.suffix not in (".whl", ".md"):
                text = path.read_text(errors="replace")
                code = "\n".join(
                    line for line in text.splitlines() if not line.lstrip().startswith("#")
                )
                assert "--listen" not in code and "0.0.0.0" not in code, path


def test_env_example_names_every_required_setting() -> None:
    text = (REPO / "images" / "compose" / "env.example").read_text()
    names = set(re.findall(r"^([A-Z_]+)=", text, re.M))
    assert set(REQUIRED) <= names, set(REQUIRED) - names
    # The old shared password is gone: nothing may still read it.
    assert "POSTGRES_PASSWORD" not in names
    assert "${POSTGRES_PASSWORD" not in (REPO / "docker-compose.yml").read_text()
