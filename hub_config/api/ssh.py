"""The hub's side of SSH: users' public keys, and the two questions the SSH gateway asks.

The gateway (``gpulab.ssh_service``, a JupyterHub managed service named ``gpulab-ssh``) holds no
list of keys or users of its own and believes nothing a user's server says: for every log-in it
asks the hub who the offered key or token belongs to, and for every session where that user's
server runs. Routes (under ``/hub/api``):

- ``GET|POST /gpulab/users/NAME/ssh-keys`` and ``DELETE /gpulab/users/NAME/ssh-keys/FINGERPRINT``:
  NAME's own keys (:mod:`gpulab.hub_config.ssh_keys`), managed by NAME only: the log-in session
  (with JupyterHub's XSRF check) or a token of NAME's holding ``custom:gpulab:ssh-keys!user``.
  Another user, course staff, admins and every server's own token get 403/404 (staff who reach a
  student's server could read its token and add a key of their own). GET also says how to
  connect (``port``, ``host``, ``command``).
- ``POST /gpulab/ssh/authorize`` ``{user, fingerprint | token, peer}`` (gateway only): 200
  ``{user}`` when the key is ``user``'s, or the token is a live token OF that very user (never a
  service's, never another user's) holding ``access:servers!user=NAME`` (a server's own token,
  filtered to one server, does not), and never for a sign-up the admin has not approved (or
  approved and then withdrew); else 403. Failures are counted per (user, peer) and per
  peer: 429 after :attr:`SshGateway.max_failures` in :attr:`SshGateway.failure_window` seconds.
  With ``recheck: true`` (an open connection's log-in, checked again every
  :attr:`SshGateway.recheck_seconds`) the same rules, never counted nor rate-limited.
- ``POST /gpulab/ssh/session`` ``{user, server, fingerprint | token}`` (gateway only; the key
  or token the connection logged in with, re-checked as authorize does, uncounted: 403 with
  ``field: credential`` once it no longer logs in as the user): where the user's server runs
  (local: the launcher's pid, its cgroup.procs, the account; docker: the container) with the
  server's environment, or, when none runs, the home (mounted by the hub if needed) and a plain
  message saying how to start one: files stay reachable with no server and nothing billed. Those
  transfers are confined as a server is: the user's transfer cgroup (``gpulab-ssh/HUBID-ACCOUNT``,
  made here with :attr:`SshGateway.transfer_cpu`, ``transfer_pids``, ``transfer_memory``; its
  ``cgroups``), the scratch the local spawner would give, with small sizes (``scratch``: the
  gateway's helper mounts it with the launcher's own code), and at most
  ``max_transfers`` sessions at once.

:func:`configure_ssh` registers the service, its token and its role at config time.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import re
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

from jupyterhub import orm
from jupyterhub.scopes import get_scopes_for, has_scope, needs_scope
from tornado import web
from traitlets import Float, Integer, Unicode
from traitlets.config import SingletonConfigurable

from gpulab.catalog import settings
from gpulab.hub_config.api.base import GpulabAPIHandler
from gpulab.hub_config.api.uploads import home_owner
from gpulab.hub_config.data_dir import secret_file
from gpulab.hub_config.scopes import SSH_GATEWAY_SCOPE, SSH_KEYS_SCOPE, SSH_SERVICE
from gpulab.hub_config.ssh_keys import KeyRefused, SshKeyStore
from gpulab.spawners.local import accounts
from gpulab.spawners.local.cgroup import CgroupError, Cgroups, Limits, parse_memory
from gpulab.spawners.mixin import SpawnError
from gpulab.spawners.storage.homes import StorageError, home_name

_SERVER_NAME = re.compile(r"[A-Za-z0-9._~-]{0,255}")
_FINGERPRINT = re.compile(r"SHA256:[A-Za-z0-9+/]{43}")


class SshGateway(SingletonConfigurable):
    """What the hub's SSH routes need to know (set by :func:`configure_ssh`)."""

    port = Integer(
        0,
        config=True,
        help="""The port the SSH gateway listens on (GPULAB_SSH_PORT; 0: SSH is off, and the
        home page says so). Shown to users in the `ssh -p PORT NAME@HOST` command.""",
    )

    host = Unicode(
        "",
        config=True,
        help="""The host name users connect to over SSH, as shown on the home page. Empty: the
        host name the user's browser reached the hub at.""",
    )

    max_keys = Integer(10, config=True, help="Most SSH public keys one user may register.")

    max_failures = Integer(
        10,
        config=True,
        help="""Failed SSH log-ins (unknown key or bad token) allowed per user and source
        address within `failure_window` seconds; beyond that the hub answers 429 to the gateway,
        the right key or token included, until the window has passed.""",
    )

    max_failures_per_peer = Integer(
        60,
        config=True,
        help="""Failed SSH log-ins allowed from one source address, whatever the user name,
        within `failure_window` seconds (a guesser trying many names).""",
    )

    failure_window = Float(60.0, config=True, help="Seconds over which failures are counted.")

    recheck_seconds = Float(
        30.0,
        config=True,
        help="""Seconds between the gateway's re-checks of each open SSH connection's log-in
        (its key still the user's, its token still live with its scope), with +-20% jitter; a
        connection whose key was removed or whose token was revoked is then closed, its running
        sessions with it. (Every new channel is re-checked as well, at once.) Sent to the
        gateway with each log-in's answer.""",
    )

    max_transfers = Integer(
        4,
        config=True,
        help="""File transfer sessions (SFTP, scp, rsync) one user may hold at once while no
        server of theirs runs; the next is refused with a message saying so (0: no limit).""",
    )

    transfer_cpu = Float(
        0.5,
        config=True,
        help="""Cores' worth of CPU all of a user's transfers with no server running may use
        together (their cgroup's CPU quota; 0: no quota).""",
    )

    transfer_pids = Integer(
        64, config=True, help="Most processes all of a user's no-server transfers hold at once."
    )

    transfer_memory = Unicode(
        "512M",
        config=True,
        help="""Memory all of a user's no-server transfers may use together (``512M``, ``1G``;
        empty: no limit).""",
    )

    transfer_scratch = Unicode(
        "64M",
        config=True,
        help="""Size of each of the private /tmp and /dev/shm a no-server transfer sees (tmpfs
        in its own mount namespace, gone when it ends; /var/tmp and /run/lock live in that
        /tmp): the host's shared folders are never written.""",
    )


class FailureCounter:
    """Failed log-ins per (user, peer) and per peer in a sliding window (in memory: a hub
    restart forgets them, which costs a guesser nothing worth having)."""

    def __init__(self) -> None:
        self._fails: dict[tuple[str, str], deque[float]] = {}

    def _recent(self, key: tuple[str, str], window: float, now: float) -> deque[float]:
        q = self._fails.setdefault(key, deque())
        while q and q[0] <= now - window:
            q.popleft()
        return q

    def retry_after(self, gw: SshGateway, user: str, peer: str) -> float:
        """Seconds until ``user`` from ``peer`` may try again (0: now)."""
        now = time.monotonic()
        waits = []
        for key, limit in (((user, peer), gw.max_failures), (("", peer), gw.max_failures_per_peer)):
            q = self._recent(key, gw.failure_window, now)
            if len(q) >= limit:
                waits.append(q[len(q) - limit] + gw.failure_window - now)
        return max(waits, default=0.0)

    def fail(self, gw: SshGateway, user: str, peer: str) -> None:
        now = time.monotonic()
        for key in ((user, peer), ("", peer)):
            self._recent(key, gw.failure_window, now).append(now)
        if len(self._fails) > 10_000:  # forget entries with no failure left in the window
            stale = [k for k, q in self._fails.items() if not q or q[-1] <= now - gw.failure_window]
            for key in stale:
                del self._fails[key]


FAILURES = FailureCounter()


def key_store(handler: GpulabAPIHandler) -> SshKeyStore:
    """The hub's one key store (kept on its pool)."""
    pool = handler.pool
    store = getattr(pool, "_gpulab_ssh_keys", None)
    if store is None:
        gw = SshGateway.instance(config=handler.settings["config"])
        store = SshKeyStore(pool.data_dir, max_keys=gw.max_keys)
        pool._gpulab_ssh_keys = store
    return store


def user_created(user: Any) -> str:
    """The user's creation time in the hub: with the name, what tells one account from a later
    one of the same name."""
    created = getattr(user, "created", None)
    return created.isoformat() if created is not None else ""


class _SshBase(GpulabAPIHandler):
    @property
    def gateway(self) -> SshGateway:
        return SshGateway.instance(config=self.settings["config"])

    def refuse(self, status: int, message: str, field: str | None = None, **extra: Any) -> None:
        self.set_status(status)
        body: dict[str, Any] = {"status": status, "message": message, **extra}
        if field:
            body["field"] = field
        self.finish(json.dumps(body))

    async def credential_holds(self, name: str, fingerprint: str | None, token: str | None) -> bool:
        """Whether the key ``fingerprint`` (or ``token``) logs in as ``name`` now: the user
        exists, is not blocked, is approved, and the key is theirs (this very account), or the
        token is a live one of theirs holding ``access:servers!user=NAME``. The one rule for a
        log-in, an open connection's re-check and every new channel."""
        user = self.find_user(name)
        blocked = getattr(self.authenticator, "blocked_users", None) or set()
        if user is None or name in blocked or not self._approved(name):
            return False
        if fingerprint is not None:
            owner = await asyncio.to_thread(key_store(self).owner, fingerprint)
            return owner == (user.name, user_created(user))
        return token is not None and self._token_of(user, token)

    def _approved(self, name: str) -> bool:
        """False for a sign-up whose approval the admin withdrew (or never gave): the log-in
        form refuses them, and so does SSH. Users made by the admin or an LMS have no sign-up
        record and are approved."""
        get_user = getattr(self.authenticator, "get_user", None)
        info = get_user(name) if get_user is not None else None
        return info is None or bool(getattr(info, "is_authorized", True))

    def _token_of(self, user: Any, token: str) -> bool:
        """Whether ``token`` is a live token of ``user`` itself that may act on their servers."""
        found = orm.APIToken.find(self.db, token)
        if found is None or found.service is not None or found.user is None:
            return False
        if found.user.id != user.orm_user.id:
            return False
        if found.expires_in is not None and found.expires_in <= 0:
            return False
        return has_scope(f"access:servers!user={user.name}", get_scopes_for(found), db=self.db)

    def own_user(self, user_name: str) -> Any:
        """The user NAME, when the caller is NAME themself (else 403)."""
        me = self.current_user
        if getattr(me, "kind", "") != "user" or me.name != user_name:
            raise web.HTTPError(403, "Only the user themself manages their SSH keys")
        return me


class SshKeysAPIHandler(_SshBase):
    """``/api/gpulab/users/NAME/ssh-keys``: list (GET) and add (POST) NAME's keys."""

    @needs_scope(SSH_KEYS_SCOPE)
    async def get(self, user_name: str) -> None:
        user = self.own_user(user_name)
        keys = await asyncio.to_thread(key_store(self).list, user.name, user_created(user))
        gw = self.gateway
        host = gw.host or (self.request.host_name or "localhost")
        port = gw.port or None
        self.finish(
            json.dumps(
                {
                    "keys": keys,
                    "max_keys": gw.max_keys,
                    "enabled": bool(port),
                    "port": port,
                    "host": host,
                    "command": f"ssh -p {port} {user.name}@{host}" if port else "",
                }
            )
        )

    @needs_scope(SSH_KEYS_SCOPE)
    async def post(self, user_name: str) -> None:
        user = self.own_user(user_name)
        body = self.json_object_body()
        unknown = sorted(set(body) - {"key", "title"})
        if unknown:
            return self.refuse(400, f"{unknown[0]}: unknown field; allowed: key, title", unknown[0])
        try:
            added = await asyncio.to_thread(
                key_store(self).add,
                user.name,
                user_created(user),
                body.get("key"),
                body.get("title"),
            )
        except KeyRefused as e:
            return self.refuse(e.status, str(e), e.field)
        self.log.info(
            "SSH key %s (%s) added for %s", added["fingerprint"], added["type"], user.name
        )
        self.set_status(201)
        self.finish(json.dumps(added))


class SshKeyAPIHandler(_SshBase):
    """``/api/gpulab/users/NAME/ssh-keys/FINGERPRINT``: remove one of NAME's keys."""

    @needs_scope(SSH_KEYS_SCOPE)
    async def delete(self, user_name: str, fingerprint: str) -> None:
        user = self.own_user(user_name)
        # The URL-safe spelling of the fingerprint's base64 is accepted too.
        fingerprint = fingerprint.replace("-", "+").replace("_", "/")
        if not _FINGERPRINT.fullmatch(fingerprint):
            return self.refuse(
                400, "fingerprint: expected SHA256: and 43 base64 characters", "fingerprint"
            )
        if not await asyncio.to_thread(key_store(self).remove, user.name, fingerprint):
            return self.refuse(404, f"fingerprint: you have no key {fingerprint}", "fingerprint")
        self.log.info("SSH key %s removed by %s", fingerprint, user.name)
        self.set_status(204)
        self.finish()


def _text(body: dict, name: str, limit: int = 4096) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > limit or "\x00" in value:
        raise web.HTTPError(400, f"{name}: must be text of at most {limit} characters")
    return value


class SshAuthorizeAPIHandler(_SshBase):
    """``/api/gpulab/ssh/authorize``: may this key or token log in as this user?"""

    @needs_scope(SSH_GATEWAY_SCOPE)
    async def post(self) -> None:
        body = self.json_object_body()
        unknown = sorted(set(body) - {"user", "fingerprint", "token", "peer", "recheck"})
        if unknown:
            return self.refuse(400, f"{unknown[0]}: unknown field", unknown[0])
        name = _text(body, "user", 255) or ""
        fingerprint = _text(body, "fingerprint", 100)
        token = _text(body, "token", 4096)
        peer = _text(body, "peer", 255) or ""
        recheck = body.get("recheck", False)
        if not isinstance(recheck, bool):
            return self.refuse(400, "recheck: must be true or false", "recheck")
        if not name:
            return self.refuse(400, "user: required", "user")
        if (fingerprint is None) == (token is None):
            return self.refuse(400, "fingerprint or token: exactly one is required", "fingerprint")
        gw = self.gateway
        how = "key" if fingerprint is not None else "token"
        if recheck:
            # An open connection's log-in, checked again: not a guess, so never counted nor
            # rate-limited; the same rules as a log-in's.
            if not await self.credential_holds(name, fingerprint, token):
                self.log.info("SSH %s of %s's open connection no longer holds", how, name)
                return self.refuse(403, f"This {how} no longer logs in as {name}")
            return self.finish(json.dumps({"user": name, "recheck_seconds": gw.recheck_seconds}))
        wait = FAILURES.retry_after(gw, name, peer)
        if wait > 0:
            self.set_header("Retry-After", str(int(wait) + 1))
            return self.refuse(
                429,
                f"Too many failed log-ins for {name} from {peer or 'this address'}; try again "
                f"in {int(wait) + 1} s",
                retry_after=int(wait) + 1,
            )
        if not await self.credential_holds(name, fingerprint, token):
            FAILURES.fail(gw, name, peer)
            self.log.warning("SSH log-in refused: %s for %s from %s", how, name, peer or "?")
            return self.refuse(403, f"This {how} does not log in as {name}")
        if fingerprint is not None:
            await asyncio.to_thread(key_store(self).touch, fingerprint)
        self.log.info("SSH log-in: %s by %s from %s", name, how, peer or "?")
        self.finish(json.dumps({"user": name, "recheck_seconds": gw.recheck_seconds}))


def _public_origin(settings_: dict) -> str:
    pub = settings_.get("public_url")
    if pub:
        return f"{pub.scheme}://{pub.netloc}"
    return settings_.get("subdomain_host", "") or ""


def start_message(user_name: str, origin: str, base_url: str, kind: str, server: str = "") -> str:
    """What ``ssh NAME@hub`` prints when NAME's server (``server``: "" for the default one) is
    not running. Files move with no server only where the gateway reaches the home on the node as
    the user's own account (local servers); a container server's files move only through the
    running container, as every container runs as the same uid on the node."""
    hub = f"{origin}{base_url}" if origin else base_url
    which = f"Your server {server!r} is" if server else "Your server is"
    api = (
        f"{hub}api/users/{user_name}/servers/{server}"
        if server
        else f"{hub}api/users/{user_name}/server"
    )
    files = (
        "Your files are reachable without a server (nothing is billed for it): "
        "sftp, scp and rsync work now.\n"
        if kind == "local"
        else "Your files move over SSH (sftp, scp, rsync) only while your server runs; "
        f"with none running, upload them on the upload page: {hub}upload\n"
    )
    return (
        f"{which} not running, so there is no shell to open here.\n"
        f"Start it on your home page: {hub}home\n"
        f"or from a terminal with a token of yours (Token page: {hub}token):\n"
        f"  curl -X POST -H 'Authorization: token YOUR_TOKEN' -d '{{\"gpu\": \"none\"}}' "
        f"{api}\n"
        f"{files}"
    )


class SshSessionAPIHandler(_SshBase):
    """``/api/gpulab/ssh/session``: where the user's server runs, or their home when none does."""

    @needs_scope(SSH_GATEWAY_SCOPE)
    async def post(self) -> None:
        body = self.json_object_body()
        unknown = sorted(set(body) - {"user", "server", "fingerprint", "token"})
        if unknown:
            return self.refuse(400, f"{unknown[0]}: unknown field", unknown[0])
        name = _text(body, "user", 255) or ""
        server = _text(body, "server", 255) or ""
        fingerprint = _text(body, "fingerprint", 100)
        token = _text(body, "token", 4096)
        if not _SERVER_NAME.fullmatch(server):
            return self.refuse(400, "server: a server name (letters, digits, ._~-)", "server")
        if fingerprint is not None and token is not None:
            return self.refuse(400, "fingerprint or token: at most one", "fingerprint")
        if (fingerprint is not None or token is not None) and not await self.credential_holds(
            name, fingerprint, token
        ):
            # The key was removed or the token revoked since the connection logged in with it:
            # no new channel (the gateway then closes the connection). Not counted as a failure.
            how = "key" if fingerprint is not None else "token"
            self.log.info("SSH channel refused: %s's %s no longer logs in", name, how)
            return self.refuse(403, f"This {how} no longer logs in as {name}", "credential")
        user = self.find_user(name)
        if user is None:
            return self.refuse(404, f"user: no such user {name!r}", "user")
        spawner = user.spawners.get(server)
        if spawner is None and server:
            return self.refuse(404, f"server: {name} has no server named {server!r}", "server")
        if spawner is None:
            spawner = user.spawner  # the default server's spawner, made if not yet
        running = bool(spawner.ready)
        try:
            facts = await self._facts(user, spawner, running)
        except (SpawnError, StorageError, accounts.AccountError) as e:
            message = getattr(e, "jupyterhub_message", None) or str(e)
            return self.refuse(500, f"home: {message}", "home")
        self.finish(json.dumps({"user": user.name, "server": server, **facts}))

    async def _facts(self, user: Any, spawner: Any, running: bool) -> dict[str, Any]:
        kind = _kind(spawner)
        out: dict[str, Any] = {
            "running": running,
            "kind": kind,
            "ports_allowed": "own",
            "message": "",
            "pid": None,
            "cgroup": None,
            "container": None,
            "env": {},
        }
        if running:
            env = dict(spawner.get_env())
            if getattr(spawner, "allocation", None) is not None:
                env.update(spawner.gpu_env(spawner.allocation))
            if kind == "local":
                venv_bin = os.path.dirname(sys.executable)
                env["PATH"] = os.pathsep.join([venv_bin, env.get("PATH", os.defpath)])
            out["env"] = env
        else:
            out["message"] = start_message(
                user.name, _public_origin(self.settings), self.hub.base_url, kind, spawner.name
            )
        if kind == "local":
            out.update(await asyncio.to_thread(self._local, user, spawner, running))
        else:
            out.update(await self._container(user, spawner, running))
        return out

    def _local(self, user: Any, spawner: Any, running: bool) -> dict[str, Any]:
        """A local server's facts (blocking: may create the account and mount the home)."""
        home = Path(spawner.home_dir)
        if running:
            sandbox = spawner.sandbox
            account = sandbox.account
            cgroup = sandbox.cgroup
            procs = cgroup.procs_files if cgroup is not None and cgroup.exists() else []
            uid, gid = (account.uid, account.gid) if account else (os.getuid(), os.getgid())
            return {
                "home": str(home),
                "host_home": str(home),
                "uid": uid,
                "gid": gid,
                "account": account.name if account else pwd.getpwuid(uid).pw_name,
                "pid": spawner.pid or None,
                "cgroup": procs[0] if procs else None,
                "cgroups": procs,
            }
        # No server: the home as uploads make it (account, old-name adoption, mounted image),
        # and the homes folder passable for the account, as a server's start makes it (0711:
        # the account may pass through to its own home, list nobody's).
        owner = home_owner(spawner, home)
        if getattr(spawner, "user_accounts", False):
            home.parent.mkdir(parents=True, exist_ok=True)
            home.parent.chmod(0o711)
        self.pool.homes.ensure(home.name, *(owner or (None, None)))
        if owner is not None:
            # The account passes through the homes folder to its home, as a server's start makes
            # it (GpuLocalSpawner._make_sandbox): SFTP with no server ever started needs it too.
            home.parent.chmod(0o711)
        uid, gid = owner or (os.getuid(), os.getgid())
        account = spawner.account_name if getattr(spawner, "user_accounts", False) else None
        account = account or pwd.getpwuid(uid).pw_name
        return {
            "home": str(home),
            "host_home": str(home),
            "uid": uid,
            "gid": gid,
            "account": account,
            "cgroups": self._transfer_cgroup(spawner, account) if owner is not None else [],
            "scratch": self._transfer_scratch(spawner) if owner is not None else None,
            "max_transfers": self.gateway.max_transfers,
        }

    def _transfer_cgroup(self, spawner: Any, account: str) -> list[str]:
        """The user's cgroup for transfers with no server (made, with its limits, if need be):
        its cgroup.procs files; [] where the hub may not make cgroups. Blocking."""
        if not getattr(spawner, "use_cgroups", False):
            return []
        tree = _transfer_tree()
        if tree is None:
            return []
        gw = self.gateway
        group = tree.group(f"{self.pool.hub_id}-{account}")
        try:
            group.create(
                Limits(
                    pids=gw.transfer_pids or None,
                    memory_bytes=parse_memory(gw.transfer_memory or None),
                    cpu=gw.transfer_cpu or None,
                )
            )
        except (CgroupError, OSError) as e:
            raise StorageError(f"could not make the transfer cgroup: {e}") from None
        return group.procs_files

    def _transfer_scratch(self, spawner: Any) -> dict[str, Any] | None:
        """The scratch the local spawner would give its server (:func:`private_scratch`), with
        :attr:`SshGateway.transfer_scratch` sizes; None where the hub may not make mount
        namespaces (then the host's shared folders are the account's, as for its servers)."""
        scratch_of = getattr(spawner, "_scratch", None)
        scratch = scratch_of() if scratch_of is not None else None
        if not scratch:
            return None
        size = parse_memory(self.gateway.transfer_scratch) or 64 * 2**20
        return {**scratch, "tmp": size, "shm": size}

    async def _container(self, user: Any, spawner: Any, running: bool) -> dict[str, Any]:
        """A Docker (or Swarm) server's facts: its container and the home's host folder."""
        uid, gid = spawner.container_ids()
        homes = self.pool.homes
        host_home = ""
        if homes.enforced:
            path = await asyncio.to_thread(homes.ensure, home_name(user.name), uid, gid)
            host_home = str(path)
        return {
            "home": spawner.server_home(),
            "host_home": host_home,
            "uid": uid,
            "gid": gid,
            "account": str(uid),
            "container": getattr(spawner, "container_id", None) if running else None,
            "cgroups": [],
        }


def _transfer_tree() -> Cgroups | None:
    """The node's cgroup tree for no-server transfers (``gpulab-ssh``, with the cpu controller),
    once; apart from the servers' (``gpulab``), whose orphan sweep would end them."""
    global _TRANSFER_TREE
    if _TRANSFER_TREE is False:
        _TRANSFER_TREE = Cgroups.detect(parent="gpulab-ssh", controllers=("cpu",))
    return _TRANSFER_TREE


_TRANSFER_TREE: Any = False


def _kind(spawner: Any) -> str:
    names = {cls.__name__ for cls in type(spawner).__mro__}
    if "GpuSwarmSpawner" in names:
        return "swarm"
    if "GpuDockerSpawner" in names:
        return "docker"
    return "local"


ROUTES = [
    (r"/api/gpulab/users/([^/]+)/ssh-keys", SshKeysAPIHandler),
    (r"/api/gpulab/users/([^/]+)/ssh-keys/([^/]+)", SshKeyAPIHandler),
    (r"/api/gpulab/ssh/authorize", SshAuthorizeAPIHandler),
    (r"/api/gpulab/ssh/session", SshSessionAPIHandler),
]


def configure_ssh(c: Any, data_dir: str, roles: list[dict[str, Any]]) -> None:
    """Register the SSH gateway (``python -m gpulab.ssh_service``, a managed service named
    ``gpulab-ssh``), its token and its role in a hub config ``c``, when ``GPULAB_SSH_PORT`` is
    not 0. The service listens at ``GPULAB_IP`` (the address browsers reach) on that port and
    reaches the hub's API with its token (JupyterHub hands it JUPYTERHUB_API_URL and
    JUPYTERHUB_API_TOKEN); the token's only right is ``custom:gpulab:ssh-gateway``."""
    port = settings.get("GPULAB_SSH_PORT")
    c.SshGateway.port = port
    if not port:
        return
    ip = c.JupyterHub.ip if "ip" in c.JupyterHub else ""
    env = {
        "GPULAB_SSH_PORT": str(port),
        "GPULAB_DATA_DIR": data_dir,
        "GPULAB_IP": ip or "0.0.0.0",
        "GPULAB_HUB_PID": str(os.getpid()),
    }
    service = {
        "name": SSH_SERVICE,
        "api_token": secret_file(Path(data_dir) / "ssh-api-token"),
        "command": [sys.executable, "-m", "gpulab.ssh_service"],
        "environment": env,
    }
    services = list(c.JupyterHub.services) if "services" in c.JupyterHub else []
    services.append(service)
    c.JupyterHub.services = services
    roles.append(
        {
            "name": SSH_SERVICE,
            "description": "The SSH gateway: checks keys and tokens with the hub and opens "
            "sessions in users' own servers",
            "scopes": [SSH_GATEWAY_SCOPE],
            "services": [SSH_SERVICE],
        }
    )
