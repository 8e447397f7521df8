"""One SSH session channel: a shell, a command or SFTP, run as the user inside their server.

Each channel asks the hub where the user's server runs (:meth:`~.hub.HubClient.session`), then
starts one process through the helper (``enter.py``: the server's cgroup and namespaces, the
account, the home, the server's environment), or ``docker exec`` for a container server, and
relays bytes both ways with flow control. A PTY is made here (``openpty`` with the client's size;
window changes are ``TIOCSWINSZ`` on it); without one the process gets pipes and its stderr goes
to the channel's stderr. The exit status (or signal) goes back to the client.

With no server running, a shell or a command prints the hub's message (how to start one) and
exits 1; only SFTP and the transfer commands ``rsync --server`` and ``scp -t|-f`` run then, as
the account in the home, in a plain process (no GPU, nothing billed). Those run without a shell:
the command line is split and checked, so ``rsync --server ...; python train.py`` is no way
around the balance check. Such a transfer is confined as a local server is (the helper runs the
launcher's own ``private_scratch`` and ``hide_other_accounts_processes``; the hub's transfer
cgroup with its limits), at most ``max_transfers`` of a user's run at once, and it is killed
when its channel closes.

Each channel's question to the hub carries the connection's own log-in (the key's fingerprint or
the token): once the key is removed or the token revoked, the hub answers 403, the channel ends
with a message saying so, and the connection is closed.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import pty
import shlex
import shutil
import signal
import struct
import sys
import termios
from collections.abc import Callable
from pathlib import Path

import asyncssh

from gpulab.spawners.inside import launcher
from gpulab.ssh_service.hub import (
    CredentialGone,
    HubClient,
    HubUnavailable,
    NoSuchServer,
    Session,
)

log = logging.getLogger("gpulab.ssh")

HELPER = str(Path(__file__).with_name("enter.py"))
# The launcher's file: the helper (no site-packages) loads it by path for a transfer's scratch.
LAUNCHER = str(Path(launcher.__file__).resolve())
SFTP_SERVER = "/usr/lib/openssh/sftp-server"
SHELL = "/bin/bash"
PLAIN_PATH = "/usr/local/bin:/usr/bin:/bin"
READ_SIZE = 256 * 1024
PIPE_SIZE = 1024 * 1024
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
# How long the relay keeps reading a PTY after its shell exited (what the shell wrote last).
PTY_DRAIN_SECONDS = 0.5
# Options that would make `rsync --server` run commands of the user's choosing.
RSYNC_REFUSED = ("--daemon", "--config", "--dparam", "-M", "--rsync-path")
SIGNALS = {name[3:]: getattr(signal, name) for name in dir(signal) if name.startswith("SIG")}
# No-server transfer sessions running now, per user (the hub's ``max_transfers`` caps them).
TRANSFERS: dict[str, int] = {}
# Sessions being served now, per user (any kind): a transfer cgroup is removed only by the last.
SERVING: dict[str, int] = {}


def transfer_command(command: str) -> list[str] | None:
    """``command`` split, when it is a file transfer that may run with no server
    (``rsync --server ...``, ``scp -t|-f ...``); None for anything else."""
    try:
        argv = shlex.split(command)
    except ValueError:
        return None
    if len(argv) >= 2 and argv[0] == "rsync" and argv[1] == "--server":
        if any(a.startswith(RSYNC_REFUSED) for a in argv[2:]):
            return None
        return argv
    if argv and argv[0] == "scp":
        flags = [a for a in argv[1:] if a.startswith("-")]
        if any(f in ("-t", "-f") for f in flags) and all(
            f in ("-t", "-f", "-r", "-p", "-d", "-v", "-q", "--") for f in flags
        ):
            return argv
    return None


class GatewaySession(asyncssh.SSHServerSession):
    """One ``session`` channel of an authenticated user."""

    def __init__(
        self,
        hub: HubClient,
        user: str,
        conn_info: dict[str, str],
        server: str = "",
        credential: dict[str, str] | None = None,
        gone: Callable[[str], None] | None = None,
    ) -> None:
        self.hub = hub
        # The connection's log-in (its key's fingerprint, or its token), re-checked by the hub for
        # this channel; ``gone`` closes the connection once the hub says it no longer holds.
        self.credential = credential or {}
        self.gone = gone
        self.user = user
        self.server = server
        self.conn_info = conn_info
        self.chan: asyncssh.SSHServerChannel | None = None
        self.term_type = ""
        self.term_size = (80, 24, 0, 0)
        self.want_tty = False
        self.command: str | None = None
        self.subsystem: str | None = None
        self.proc: asyncio.subprocess.Process | None = None
        self.master: int | None = None
        self.stdin: asyncio.StreamWriter | None = None
        self.pending: list[bytes] = []
        self.pending_eof = False
        self.can_write = asyncio.Event()
        self.can_write.set()
        self.task: asyncio.Task | None = None
        self.read_transport: asyncio.ReadTransport | None = None
        self.closed = False
        self.transfer = False  # a no-server transfer: killed when the channel closes

    # ---- requests from the client ------------------------------------------------------------

    def connection_made(self, chan) -> None:
        self.chan = chan

    def pty_requested(self, term_type, term_size, term_modes) -> bool:
        self.want_tty = True
        self.term_type = term_type or "xterm"
        self.term_size = term_size
        return True

    def shell_requested(self) -> bool:
        return True

    def exec_requested(self, command: str) -> bool:
        self.command = command
        return True

    def subsystem_requested(self, subsystem: str) -> bool:
        if subsystem != "sftp":
            return False
        self.subsystem = subsystem
        return True

    def session_started(self) -> None:
        self.task = asyncio.ensure_future(self._run())

    def terminal_size_changed(self, width, height, pixwidth, pixheight) -> None:
        self.term_size = (width, height, pixwidth, pixheight)
        if self.master is not None:
            _set_size(self.master, self.term_size)

    def signal_received(self, signal_name: str) -> None:
        sig = SIGNALS.get(signal_name)
        if sig is not None and self.proc is not None and self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def break_received(self, msec: int) -> bool:
        self.signal_received("INT")
        return True

    def data_received(self, data, datatype) -> None:
        if self.stdin is None:
            self.pending.append(data)
            return
        self.stdin.write(data)
        self._watch_stdin()

    def eof_received(self) -> bool:
        if self.stdin is None:
            self.pending_eof = True
        elif not self.want_tty:
            self.stdin.close()
        return True  # half-close: the output keeps flowing

    def pause_writing(self) -> None:
        self.can_write.clear()

    def resume_writing(self) -> None:
        self.can_write.set()

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.can_write.set()
        proc = self.proc
        if proc is not None and proc.returncode is None and self.transfer:
            # A no-server transfer ends with its session: nothing of it runs on unobserved.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        elif proc is not None and proc.returncode is None:
            # What a dropped connection does in OpenSSH: a hang-up, no more. A tmux server (its own
            # session) survives it; the server's stop (its cgroup) ends everything.
            try:
                os.killpg(proc.pid, signal.SIGHUP)
            except (ProcessLookupError, PermissionError):
                pass
        if self.stdin is not None:
            self.stdin.close()

    # ---- the process ---------------------------------------------------------------------------

    async def _run(self) -> None:
        chan = self.chan
        gone = ""
        SERVING[self.user] = SERVING.get(self.user, 0) + 1
        try:
            status = await self._serve()
        except NoSuchServer as e:
            self._write_err(f"gpulab: {e}\n")
            status = 1
        except CredentialGone as e:
            log.info("Refused a channel of %s: %s", self.user, e)
            self._write_err(f"gpulab: {e} (removed or revoked); closing this connection.\n")
            status = 1
            gone = str(e)
        except HubUnavailable as e:
            log.warning("%s", e)
            self._write_err("gpulab: the hub is not answering; try again in a moment.\n")
            status = 1
        except Exception:
            log.exception("Session of %s failed", self.user)
            self._write_err("gpulab: the session could not start.\n")
            status = 1
        finally:
            SERVING[self.user] -= 1
            if not SERVING[self.user]:
                del SERVING[self.user]
        if not self.closed:
            if isinstance(status, str):
                chan.exit_with_signal(status)
            else:
                chan.exit(status)
        if gone and self.gone is not None:
            self.gone(gone)  # after the channel's message and exit status went out

    async def _serve(self) -> int | str:
        session = await self.hub.session(self.user, self.server, self.credential)
        argv, plain = self._argv(session)
        if argv is None:
            text = session.message or (
                f"{self.user}, you have no server running. Start one at "
                f"{self.hub.hub_url}/hub/home and connect again.\n"
            )
            self._write_err(text if text.endswith("\n") else text + "\n")
            return 1
        log.info(
            "%s: %s (%s server, %s)",
            self.user,
            "sftp" if self.subsystem else ("command" if self.command is not None else "shell"),
            session.kind if session.running else "no",
            "pty" if self.want_tty else "pipes",
        )
        if session.kind == "docker" and session.running and not plain:
            spawn, env = self._docker(session, argv)
        else:
            spawn, env = self._helper(session, argv, plain)
        if not plain:
            return await self._relay(spawn, env)
        held = TRANSFERS.get(self.user, 0)
        if session.max_transfers and held >= session.max_transfers:
            self._write_err(
                f"gpulab: {held} file transfers of yours already run with no server (at most "
                f"{session.max_transfers} at once); wait for one to end, or start your server.\n"
            )
            return 1
        TRANSFERS[self.user] = held + 1
        self.transfer = True
        try:
            return await self._relay(spawn, env)
        finally:
            TRANSFERS[self.user] -= 1
            if not TRANSFERS[self.user]:
                del TRANSFERS[self.user]
            if SERVING.get(self.user) == 1:
                # The user's last session: their transfer cgroup goes if empty (no other session
                # of theirs is between the hub's answer, which made it, and joining it).
                await asyncio.to_thread(_remove_empty_groups, session.cgroup)

    def _argv(self, session: Session) -> tuple[list[str] | None, bool]:
        """What to run and whether it runs as a plain process on the node (no server, or a
        container's files through their host folder); (None, _) when the request needs a server
        and none runs."""
        files = session.files_home  # the home on this node ("" for a container's volume)
        container = session.kind != "local"
        if self.subsystem == "sftp":
            if files and (container or not session.running):
                return [SFTP_SERVER, "-d", files], True
            if session.running:
                return [SFTP_SERVER, "-d", session.home], False
            return None, False
        transfer = None
        if self.command is not None and not self.want_tty:
            transfer = transfer_command(self.command)
        if transfer is not None and files and (container or not session.running):
            return transfer, True
        if session.running:
            if self.command is not None:
                return [SHELL, "-c", self.command], False
            return [SHELL, "-i"] if self.want_tty else [SHELL], False
        return None, False

    def _env(self, session: Session, plain: bool) -> dict[str, str]:
        env = {} if plain else dict(session.env)
        env.setdefault("PATH", PLAIN_PATH)
        env.update(
            {
                "HOME": session.files_home if plain else session.home,
                "USER": session.account or self.user,
                "LOGNAME": session.account or self.user,
                "SHELL": SHELL,
                **self.conn_info,
            }
        )
        if self.want_tty:
            env["TERM"] = self.term_type
        env.pop("SSH_AUTH_SOCK", None)
        return env

    def _helper(self, session: Session, argv: list[str], plain: bool):
        if session.uid is None or session.gid is None:
            raise HubUnavailable(f"the hub gave no account for {self.user}")
        spec = {
            "uid": session.uid,
            "gid": session.gid,
            "cwd": session.files_home if plain else session.home,
            "env": self._env(session, plain),
            "argv": argv,
            "tty": self.want_tty,
        }
        if not plain and session.kind == "local":
            spec["cgroup"] = list(session.cgroup)
            spec["ns_pid"] = session.pid
        elif plain and session.kind == "local":
            # No server: the user's transfer cgroup and a scratch of its own (the hub's).
            spec["cgroup"] = list(session.cgroup)
            if session.scratch:
                spec.update(scratch=session.scratch, launcher=LAUNCHER, account=session.account)
        cmd = [sys.executable, "-I", HELPER, json.dumps(spec)]
        return cmd, {"PATH": PLAIN_PATH}

    def _docker(self, session: Session, argv: list[str]):
        env = self._env(session, False)
        docker = shutil.which("docker", path=os.environ.get("PATH", PLAIN_PATH)) or "docker"
        cmd = [docker, "exec", "-i"]
        if self.want_tty:
            cmd.append("-t")
        if session.uid is not None:
            cmd += ["-u", f"{session.uid}:{session.gid if session.gid is not None else ''}"]
        cmd += ["-w", session.home]
        # Names only: the values come from this client's environment, never its command line.
        for key in env:
            cmd += ["-e", key]
        cmd += [session.container, *argv]
        spec = {"cwd": "/", "env": {**os.environ, **env}, "argv": cmd, "tty": self.want_tty}
        return [sys.executable, "-I", HELPER, json.dumps(spec)], {"PATH": PLAIN_PATH}

    async def _relay(self, cmd: list[str], env: dict[str, str]) -> int | str:
        loop = asyncio.get_running_loop()
        pumps = []
        if self.want_tty:
            master, slave = pty.openpty()
            self.master = master
            _set_size(master, self.term_size)
            try:
                self.proc = await asyncio.create_subprocess_exec(
                    *cmd, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True
                )
            finally:
                os.close(slave)
            reader = asyncio.StreamReader(limit=READ_SIZE)
            read_file = os.fdopen(os.dup(master), "rb", buffering=0)
            self.read_transport, _ = await loop.connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(reader), read_file
            )
            write_file = os.fdopen(os.dup(master), "wb", buffering=0)
            transport, protocol = await loop.connect_write_pipe(
                lambda: asyncio.streams.FlowControlMixin(), write_file
            )
            self.stdin = asyncio.StreamWriter(transport, protocol, None, loop)
            pumps.append(asyncio.ensure_future(self._pump(reader, None)))
        else:
            self.proc = await asyncio.create_subprocess_exec(
                *cmd,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                limit=READ_SIZE,
            )
            self.stdin = self.proc.stdin
            _widen_pipes(self.proc)
            pumps.append(asyncio.ensure_future(self._pump(self.proc.stdout, None)))
            pumps.append(
                asyncio.ensure_future(self._pump(self.proc.stderr, asyncssh.EXTENDED_DATA_STDERR))
            )
        for data in self.pending:
            self.stdin.write(data)
        self.pending = []
        if self.pending_eof and not self.want_tty:
            self.stdin.close()
        if self.closed:
            self.connection_lost(None)
        code = await self.proc.wait()
        if self.want_tty:
            # The shell is gone; what it wrote last is still in the PTY (a tmux server or a
            # background job may hold it open for good, so this wait is bounded).
            await asyncio.wait(pumps, timeout=PTY_DRAIN_SECONDS)
        else:
            await asyncio.wait(pumps)
        for pump in pumps:
            pump.cancel()
        self._close_pty()
        if code < 0:
            return signal.Signals(-code).name[3:]
        return code

    async def _pump(self, reader: asyncio.StreamReader, datatype) -> None:
        while not self.closed:
            try:
                data = await reader.read(READ_SIZE)
            except OSError:  # EIO: the PTY's last holder closed it
                return
            if not data:
                return
            await self.can_write.wait()
            if self.closed:
                return
            self.chan.write(data, datatype)

    def _watch_stdin(self) -> None:
        """Back-pressure: stop reading the channel while the process is slow to take input."""
        transport = self.stdin.transport
        if transport.get_write_buffer_size() > READ_SIZE and not getattr(self, "_draining", False):
            self._draining = True
            self.chan.pause_reading()

            async def drain() -> None:
                try:
                    await self.stdin.drain()
                except (ConnectionError, OSError):
                    pass
                finally:
                    self._draining = False
                    if not self.closed:
                        self.chan.resume_reading()

            self.drain_task = asyncio.ensure_future(drain())

    def _close_pty(self) -> None:
        if not self.want_tty:
            return
        if self.stdin is not None:
            self.stdin.close()
        if self.read_transport is not None:
            self.read_transport.close()
        if self.master is not None:
            os.close(self.master)
            self.master = None

    def _write_err(self, text: str) -> None:
        if not self.closed and self.chan is not None:
            if self.want_tty:
                self.chan.write(text.replace("\n", "\r\n").encode())
            else:
                self.chan.write_stderr(text.encode())


def _remove_empty_groups(procs_files: tuple[str, ...]) -> None:
    """Remove the cgroups of these ``cgroup.procs`` files where they are empty (a cgroup that
    still holds a process cannot be removed: EBUSY, left as is)."""
    for procs in procs_files:
        folder = os.path.dirname(os.path.normpath(procs))
        if folder.startswith("/sys/fs/cgroup/") and procs.endswith("/cgroup.procs"):
            try:
                os.rmdir(folder)
            except OSError:
                pass


def _widen_pipes(proc: asyncio.subprocess.Process) -> None:
    """The process's stdin and stdout pipes hold PIPE_SIZE (the kernel's default: 64 KiB), so a
    bulk transfer (SFTP, rsync) moves in fewer, larger reads and writes; best effort."""
    transport = getattr(proc, "_transport", None)
    for fd in (0, 1):
        pipe = transport.get_pipe_transport(fd) if transport is not None else None
        raw = pipe.get_extra_info("pipe") if pipe is not None else None
        if raw is None:
            continue
        try:
            fcntl.fcntl(raw.fileno(), F_SETPIPE_SZ, PIPE_SIZE)
        except OSError:
            pass


def _set_size(fd: int, size) -> None:
    width, height, pixwidth, pixheight = size
    try:
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, pixwidth, pixheight))
    except OSError:
        pass
