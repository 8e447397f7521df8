"""Isolation of local servers: each user's own Unix account and each server's own cgroup.

Mixed into :class:`~gpulab.spawners.local.spawner.GpuLocalSpawner`. Everything here keeps a user's
server from reaching other users or the hub, and makes a stop end every process of the server
before its cards go back to the pool; :mod:`.sandbox` says how the processes are found.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

from traitlets import Bool, HasTraits, Unicode, default, validate

from gpulab.spawners.activity import Observation
from gpulab.spawners.local import accounts
from gpulab.spawners.local.cgroup import CgroupError, Cgroups, Limits, parse_memory
from gpulab.spawners.local.sandbox import Sandbox
from gpulab.spawners.mixin import SpawnError
from gpulab.spawners.node.inventory import nvml_compute_pids
from gpulab.spawners.node.pool import GpuPool


class LocalIsolationMixin(HasTraits):
    """Accounts, cgroups, observation and the complete stop of a local server."""

    user_accounts = Bool(
        config=True,
        help="""Run each user's server as that user's own Unix account (`account_prefix` + name,
        The Littlest JupyterHub's convention), created on the user's first spawn, with a home of
        its own (mode 0700). Needs the hub to run as root, and is the default then; without it
        every server runs as the hub's own user and users are not isolated from each other.""",
    )

    account_prefix = Unicode(
        accounts.PREFIX,
        config=True,
        help="Prefix of the Unix account names made for users (jupyter-alice).",
    )

    use_cgroups = Bool(
        True,
        config=True,
        help="""Put each server in its own cgroup when the hub may (root, a writable cgroup
        tree): pids and memory limits from the catalog, the node's other GPUs denied through the
        devices controller (cgroup v1, real GPUs), and a stop that ends every process of the
        server, however it detached, before its cards go back to the pool.""",
    )

    @default("user_accounts")
    def _default_user_accounts(self) -> bool:
        return os.geteuid() == 0

    @validate("user_accounts")
    def _check_user_accounts(self, proposal: dict) -> bool:
        if proposal["value"] and os.geteuid() != 0:
            raise ValueError("user_accounts: needs the hub to run as root")
        return proposal["value"]

    # ---- the sandbox (own account and cgroup) ------------------------------------------------

    @property
    def account_name(self) -> str:
        return accounts.account_name(self.user.name, self.account_prefix)

    @classmethod
    def node_cgroups(cls) -> Cgroups | None:
        if not hasattr(cls, "_cgroups"):
            cls._cgroups = Cgroups.detect()
        return cls._cgroups

    def _cgroup_name(self, alloc_id: str) -> str:
        return f"{self.pool.hub_id}-{alloc_id}"

    @property
    def sandbox(self) -> Sandbox:
        """Where this server runs (rebuilt from the allocation id after a hub restart)."""
        alloc_id = self.allocation.alloc_id if self.allocation is not None else ""
        tree = self.node_cgroups() if self.use_cgroups else None
        return Sandbox(
            alloc_id=alloc_id,
            account=accounts.lookup(self.account_name) if self.user_accounts else None,
            cgroup=tree.group(self._cgroup_name(alloc_id)) if tree and alloc_id else None,
        )

    def _make_sandbox(self, home: Path) -> Sandbox:
        """Create the account (first spawn only) and the cgroup; blocking."""
        account = None
        if self.user_accounts:
            try:
                account = accounts.ensure_account(self.account_name, home)
            except accounts.AccountError as e:
                raise SpawnError(500, f"Could not create your Unix account: {e}") from None
            # Homes live under the data dir (0711): its users folder must be passable too.
            home.parent.mkdir(parents=True, exist_ok=True)
            home.parent.chmod(0o711)
            changeable = accounts.changeable_at(home, account)
            if changeable is not None:
                raise SpawnError(
                    500,
                    f"{account.name}'s home {home} is below {changeable}, which that account "
                    "can change (it could put a link in the home's place, and the hub acts on "
                    "the home as root). Homes belong in a folder only root can change "
                    "(GpuLocalSpawner.home_dir_template).",
                )
            for needed in (home, Path(sys.executable)):
                blocked = accounts.blocked_at(needed, account)
                if blocked is not None:
                    raise SpawnError(
                        500,
                        f"{account.name} cannot reach {needed}: {blocked} is closed to other "
                        f"users (mode {blocked.stat().st_mode & 0o777:o}). Put gpulab's data dir "
                        "and Python environment under folders others may pass through "
                        "(e.g. /srv/gpulab), or `chmod o+x` that folder.",
                    )
            self._ensure_home(home, account)  # mounted before it is prepared (issue 23)
            accounts.prepare_home(home, account)
        else:
            self._ensure_home(home, None)
        tree = self.node_cgroups() if self.use_cgroups else None
        cgroup = None
        if tree is not None and self.allocation is not None:
            _, mem = self.resource_limits(self.allocation)
            mine = set(self.allocation.uuids)
            deny = tuple(
                d.minor
                for d in self.pool.inventory.devices
                if d.minor is not None and not d.simulated and d.uuid not in mine
            )
            cgroup = tree.group(self._cgroup_name(self.allocation.alloc_id))
            try:
                cgroup.create(
                    Limits(
                        pids=self.pool.catalog.limits.pids,
                        memory_bytes=parse_memory(mem),
                        deny_gpu_minors=deny,
                    )
                )
            except (CgroupError, OSError) as e:
                raise SpawnError(500, f"Could not create the server's cgroup: {e}") from None
        alloc_id = self.allocation.alloc_id if self.allocation is not None else ""
        return Sandbox(alloc_id=alloc_id, account=account, cgroup=cgroup)

    def _ensure_home(self, home: Path, account: accounts.Account | None) -> None:
        """The user's home is ready at ``home`` (the spawner's home store); blocking."""

    async def end_processes(self) -> int:
        """End every process of this server (its cgroup, its account, or its process tree),
        then remove what its processes left in the node's temp folder."""
        if self.allocation is None:
            return 0
        sandbox = self.sandbox
        n = await asyncio.to_thread(sandbox.kill_all, self.pid or None)
        if n:
            self.log.info("Ended %d process(es) of %s", n, self.owner)
        await asyncio.to_thread(self._remove_temp_dirs, sandbox)
        return n

    async def gpulab_end_launch(self) -> None:
        """After a failed start, before its cards go back: the server process (it may not have
        joined its cgroup yet), then everything in its cgroup, then the cgroup itself."""
        pid = self.pid or None
        sandbox = self.sandbox

        def end() -> int:
            if pid is not None:
                # The server's own pid, ours until JupyterHub's stop reaps it (as that stop
                # would signal it too).
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            return sandbox.kill_all(pid)

        n = await asyncio.to_thread(end)
        if sandbox.cgroup is not None and await asyncio.to_thread(sandbox.cgroup.exists):
            raise CgroupError(f"the cgroup of {self.owner} is still there")
        self.log.info("Failed start of %s: ended %d process(es)", self.owner, n)
        await asyncio.to_thread(self._remove_temp_dirs, sandbox)

    def _remove_temp_dirs(self, sandbox: Sandbox) -> None:
        try:
            removed = sandbox.remove_temp_dirs()
        except OSError as e:
            self.log.warning("Could not remove the temp folders of %s: %s", self.owner, e)
            return
        if removed:
            self.log.info("Removed %s's temp folders: %s", self.owner, ", ".join(removed))

    def _observed(self) -> tuple[Sandbox, list[str]]:
        """The sandbox and real cards the observer samples, built once per allocation and set
        of cards, not at every sample (every 2 s per server: the account's lookup alone reads
        /etc/passwd, ~0.1 ms per 300 accounts). The account is made before the server starts
        and outlives it, so a session's lookup stays true while it runs."""
        alloc = self.allocation
        key = (alloc.alloc_id, tuple(alloc.uuids))
        kept = getattr(self, "_observed_kept", None)
        if kept is not None and kept[0] == key:
            return kept[1], kept[2]
        sandbox = self.sandbox
        uuids = [
            u
            for u in alloc.uuids
            if (d := self.pool.inventory.by_uuid(u)) is not None and not d.simulated
        ]
        self._observed_kept = (key, sandbox, uuids)
        return sandbox, uuids

    async def observe_activity(self) -> Observation | None:
        if self.allocation is None or not self.pid:
            return None
        sandbox, uuids = self._observed()

        def look() -> Observation:
            t = time.time()
            # Each process's /proc stat read once: its start, its name, its CPU counter.
            procs, counters = sandbox.sample(self.pid)
            # The CPU everything of the server consumed, itself included: its cgroup's counter
            # where the kernel keeps one, else each live process's own (pids from the sandbox).
            total = sandbox.cgroup.cpu_seconds() if sandbox.cgroup is not None else None
            cpu = (("cgroup", total),) if total is not None else tuple(counters)
            gpu_pids = tuple(nvml_compute_pids(uuids)) if uuids else ()
            return Observation(t=t, procs=tuple(procs), gpu_pids=gpu_pids, cpu=cpu)

        return await asyncio.to_thread(look)

    def move_certs(self, paths: dict[str, str]) -> dict[str, str]:
        return paths

    async def stop(self, now: bool = False) -> None:
        await super().stop(now=now)
        # The server is gone; what it started may not be (a kernel busy in a C call, a
        # detached process). Everything ends before the cards go back (clear_state).
        await self.end_processes()

    def clear_state(self) -> None:
        if self.allocation is not None:
            # Every stop path ends here before the cards are released: a last, synchronous
            # sweep (quick: stop() and poll() have normally emptied the sandbox already).
            try:
                n = self.sandbox.kill_all(self.pid or None)
                if n:
                    self.log.warning("Ended %d leftover process(es) of %s", n, self.owner)
            except Exception:
                self.log.exception("Could not end the processes of %s", self.owner)
        super().clear_state()

    @classmethod
    async def sweep_node(cls, pool: GpuPool) -> None:
        """Kill and remove cgroups of this hub whose allocation no server holds any more."""
        tree = cls.node_cgroups()
        if tree is None:
            return
        allocator = pool.allocator
        live = {a.alloc_id for a in allocator.allocations} - {
            o.alloc_id for o in allocator.orphans()
        }
        prefix = f"{pool.hub_id}-"
        for name in tree.groups():
            if not name.startswith(prefix) or name[len(prefix) :] in live:
                continue
            group = tree.group(name)
            try:
                n = await asyncio.to_thread(group.kill_all)
                await asyncio.to_thread(group.remove)
            except (CgroupError, OSError) as e:
                pool.log.warning("Could not empty orphaned cgroup %s: %s", name, e)
                continue
            pool.log.warning("Removed orphaned cgroup %s (%d process(es) ended)", name, n)
