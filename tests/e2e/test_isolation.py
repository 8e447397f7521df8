"""Isolation of the embedded default (a root hub, local servers): what code in a user's own
notebook can no longer do. Each test is an attack from the isolation issue; the attacker now loses
and the legitimate path still works."""

from __future__ import annotations

import json
import os
import pwd
import stat
import time

import pytest
from harness import Hub, KernelError, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="isolation needs a root hub")


def account(user: str) -> pwd.struct_passwd:
    from gpulab.spawners.local.accounts import account_name

    return pwd.getpwnam(account_name(user))


def hub_pid(hub: Hub) -> int:
    return int((hub.data_dir / "jupyterhub.pid").read_text())


def test_a_kernel_runs_as_its_users_own_account_in_a_private_home(hub: Hub, user: str) -> None:
    hub.spawn_ready(user, {"gpu": "none"})
    acct = account(user)
    with hub.kernel(user) as k:
        ids = k.execute("import os; print(os.getuid(), os.geteuid(), os.getgid())").split()
        home = k.execute("print(os.path.expanduser('~'))").strip()
        k.execute("open('mine.txt', 'w').write('x')")
    assert ids == [str(acct.pw_uid)] * 2 + [str(acct.pw_gid)]
    st = os.stat(home)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (acct.pw_uid, 0o700)
    assert os.stat(os.path.join(home, "mine.txt")).st_uid == acct.pw_uid


def test_a_kernel_cannot_read_the_hubs_secrets_or_environment(hub: Hub, user: str) -> None:
    hub.spawn_ready(user, {"gpu": "none"})
    secrets = [
        hub.data_dir / name
        for name in ("billing-api-token", "spot-market-token", "jupyterhub_cookie_secret")
        if (hub.data_dir / name).exists()
    ]
    assert any(p.name == "spot-market-token" for p in secrets)
    with hub.kernel(user) as k:
        for path in [*secrets, hub.data_dir / "jupyterhub.sqlite"]:
            with pytest.raises(KernelError, match="Permission denied"):
                k.execute(f"open({str(path)!r}, 'rb').read()")
        # The hub's process is not even there for a server (a /proc of its own, hidepid).
        with pytest.raises(KernelError, match=r"(Permission denied|No such file)"):
            k.execute(f"open('/proc/{hub_pid(hub)}/environ', 'rb').read()")
        # Nor list the data dir to find them.
        with pytest.raises(KernelError, match="Permission denied"):
            k.execute(f"import os; os.listdir({str(hub.data_dir)!r})")
        env = json.loads(k.execute("import json, os; print(json.dumps(dict(os.environ)))"))
    assert not [
        k for k in env if "ADMIN_TOKEN" in k or "MARKET" in k or k == "CONFIGPROXY_AUTH_TOKEN"
    ]


def test_one_user_cannot_touch_anothers_home_or_kernels(hub: Hub, user: str) -> None:
    other = hub.create_user()
    hub.spawn_ready(user, {"gpu": "none"})
    hub.spawn_ready(other, {"gpu": "none"})
    try:
        with hub.kernel(other) as victim:
            victim.execute("open('secret.txt', 'w').write('mine')")
            victim_home = victim.execute("import os; print(os.getcwd())").strip()
            victim_pid = int(victim.execute("print(os.getpid())"))
            with hub.kernel(user) as k:
                with pytest.raises(KernelError, match="Permission denied"):
                    k.execute(f"open({victim_home + '/secret.txt'!r}).read()")
                with pytest.raises(KernelError, match=r"(Operation not permitted|PermissionError)"):
                    k.execute(f"import os, signal; os.kill({victim_pid}, signal.SIGKILL)")
            assert victim.execute("print('still here')").strip() == "still here"
    finally:
        hub.stop_server(other)


def test_a_user_sees_no_other_accounts_processes(hub: Hub, user: str) -> None:
    """A tester listed every other user's processes and command lines (app sockets, paths,
    account names) from their own server: local servers share the host's process namespace."""
    other = hub.create_user()
    hub.spawn_ready(user, {"gpu": "none"})
    hub.spawn_ready(other, {"gpu": "none"})
    try:
        with hub.kernel(other) as victim:
            victim_pid = int(victim.execute("import os; print(os.getpid())"))
            with hub.kernel(user) as k:
                seen = json.loads(
                    k.execute(
                        "import os, json\n"
                        "pids = [int(p) for p in os.listdir('/proc') if p.isdigit()]\n"
                        "uids = set()\n"
                        "for p in pids:\n"
                        "    try: uids.add(os.stat(f'/proc/{p}').st_uid)\n"
                        "    except OSError: pass\n"
                        "print(json.dumps({'pids': pids, 'uids': sorted(uids), 'me': os.getuid(),"
                        " 'own': os.getpid()}))"
                    )
                )
                assert seen["own"] in seen["pids"]  # its own processes stay visible
                assert victim_pid not in seen["pids"]
                assert seen["uids"] == [seen["me"]], seen["uids"]
                assert (
                    not k.execute(f"import os; print(os.path.exists('/proc/{victim_pid}'))")
                    == "True"
                )
    finally:
        hub.stop_server(other)


DETACH = """
import os, subprocess, sys
code = "import os, time\\nfor k in list(os.environ): del os.environ[k]\\nwhile True: time.sleep(1)"
p = subprocess.Popen([sys.executable, "-c", code], start_new_session=True,
                     env={}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(p.pid)
"""


def alive(pid: int) -> bool:
    try:
        fields = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()
    except OSError:
        return False
    return fields[0] not in ("Z", "X")


def test_a_detached_process_without_gpulabs_variables_dies_with_the_server(
    hub: Hub, user: str
) -> None:
    hub.spawn_ready(user, {"gpu": "a100-80g"})
    uuids = hub.server(user)["state"]["allocation"]["uuids"]
    with hub.kernel(user) as k:
        pid = int(k.execute(DETACH).strip())
    env = open(f"/proc/{pid}/environ", "rb").read()
    assert b"GPULAB_ALLOCATION_ID" not in env and alive(pid)
    hub.stop_server(user)
    # Gone by the time the stop has returned, before the card could be handed to anyone else.
    assert not alive(pid)
    assert not any(g["held"] for g in hub.pool()["gpus"] if g["uuid"] in uuids)


def test_a_kernel_stuck_in_a_long_c_call_is_gone_when_the_stop_returns(hub: Hub, user: str) -> None:
    hub.spawn_ready(user, {"gpu": "rtx-4090"})
    k = hub.kernel(user)
    try:
        kernel_pid = int(k.execute("import os; print(os.getpid())"))
        # One C call that ignores SIGINT and SIGTERM for its whole length.
        k.send(
            "import ctypes, signal\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "ctypes.CDLL(None).sleep(600)"
        )
        wait_for(lambda: open(f"/proc/{kernel_pid}/wchan").read() != "0", what="kernel in sleep")
        t0 = time.monotonic()
        hub.stop_server(user)
        assert not alive(kernel_pid), f"kernel alive {time.monotonic() - t0:.1f}s after the stop"
    finally:
        k.close()


def test_the_hubs_files_are_private(hub: Hub, user: str) -> None:
    hub.spawn_ready(user, {"gpu": "none"})
    data = hub.data_dir
    assert stat.S_IMODE(data.stat().st_mode) == 0o711
    for name in ("jupyterhub.sqlite", "billing.sqlite", "spot-market-token", "admin-password"):
        path = data / name
        if path.exists():
            assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, f"{name} is readable by others"
    for folder in ("logs", "run", "spot"):
        if (data / folder).exists():
            assert stat.S_IMODE((data / folder).stat().st_mode) & 0o077 == 0, folder
    assert stat.S_IMODE((data / "users").stat().st_mode) == 0o711
