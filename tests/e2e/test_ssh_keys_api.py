"""The hub's side of SSH (issue 25), against a real hub with its SSH gateway turned on: users
manage their own public keys; the gateway (and only it) asks who a key or token logs in as and
where the user's server runs.

Issue 25 points covered: "authenticated by the user's public keys (managed on their home page,
several per user) or a hub API token"; attacks "log in as another user with your token or key",
"a key added by someone else", "brute-force passwords (there are none: keys and tokens only,
rate-limited)", "SSH as a way around the balance check (a stopped user)": SFTP's home without a
server, nothing started.

Keys are made by Debian's ``ssh-keygen`` and their fingerprints compared with what it prints.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import requests
from course_helpers import make_course, roster, token_for
from harness import PASSWORD, Hub, WebSession, admin_web, approved_user

REFUSED = (403, 404)


@pytest.fixture(scope="module")
def hub(module_hub_factory) -> Hub:
    return module_hub_factory("ssh-keys", ssh_port=True)


def gateway_token(hub: Hub) -> str:
    """The gpulab-ssh service's hub token (kept in the data dir, like billing's)."""
    return (hub.data_dir / "ssh-api-token").read_text().strip()


def keygen(tmp: Path, kind: str = "ed25519", bits: int | None = None) -> tuple[str, str]:
    """(public key line, fingerprint as ssh-keygen prints it) of a new key pair."""
    path = tmp / f"id_{kind}_{uuid.uuid4().hex[:6]}"
    args = ["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", f"test@{kind}", "-f", str(path)]
    if bits:
        args += ["-b", str(bits)]
    subprocess.run(args, check=True, capture_output=True)
    out = subprocess.run(
        ["ssh-keygen", "-l", "-E", "sha256", "-f", f"{path}.pub"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return (Path(f"{path}.pub").read_text().strip(), out.split()[1])


def keys_of(hub: Hub, name: str, token: str) -> list[dict]:
    r = hub.api("GET", f"/gpulab/users/{name}/ssh-keys", token=token)
    assert r.status_code == 200, r.text
    return r.json()["keys"]


def authorize(hub: Hub, body: dict, token: str | None = None) -> requests.Response:
    return hub.api("POST", "/gpulab/ssh/authorize", token=token or gateway_token(hub), json=body)


def fp_path(fingerprint: str) -> str:
    return requests.utils.quote(fingerprint, safe="")


def test_a_user_adds_lists_and_removes_keys_and_the_gateway_finds_them(
    hub: Hub, tmp_path: Path
) -> None:
    """Several keys per user, added with the user's own token; the gateway's authorize answers
    with the key's owner; a removed key logs in no more (issue 25: keys managed by the user)."""
    alice = hub.create_user()
    token = token_for(hub, alice)
    (line1, fp1), (line2, fp2) = keygen(tmp_path), keygen(tmp_path, "rsa", 3072)
    r = hub.api(
        "POST",
        f"/gpulab/users/{alice}/ssh-keys",
        token=token,
        json={"key": line1, "title": "laptop"},
    )
    assert r.status_code == 201, r.text
    added = r.json()
    assert added["fingerprint"] == fp1 and added["type"] == "ssh-ed25519", added
    assert added["title"] == "laptop" and added["added"]
    r = hub.api("POST", f"/gpulab/users/{alice}/ssh-keys", token=token, json={"key": line2})
    assert r.status_code == 201 and r.json()["title"] == "test@rsa", r.text  # comment as title
    listing = hub.api("GET", f"/gpulab/users/{alice}/ssh-keys", token=token).json()
    assert [k["fingerprint"] for k in listing["keys"]] == [fp1, fp2]
    assert listing["command"] == f"ssh -p {hub.ssh_port} {alice}@localhost", listing
    assert listing["enabled"] is True and listing["port"] == hub.ssh_port

    assert authorize(hub, {"user": alice, "fingerprint": fp2, "peer": "127.0.0.1"}).json() == {
        "user": alice,
        "recheck_seconds": 30.0,  # SshGateway.recheck_seconds: the gateway's re-check interval
    }
    # The key file on disk: root's, 0600, in a 0700 folder.
    store = hub.data_dir / "ssh" / "keys.json"
    st = store.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (os.geteuid(), 0o600)
    assert (hub.data_dir / "ssh").stat().st_mode & 0o777 == 0o700

    r = hub.api("DELETE", f"/gpulab/users/{alice}/ssh-keys/{fp_path(fp2)}", token=token)
    assert r.status_code == 204, r.text
    assert [k["fingerprint"] for k in keys_of(hub, alice, token)] == [fp1]
    assert (
        authorize(hub, {"user": alice, "fingerprint": fp2, "peer": "10.9.0.1"}).status_code == 403
    )
    r = hub.api("DELETE", f"/gpulab/users/{alice}/ssh-keys/{fp_path(fp2)}", token=token)
    assert r.status_code == 404 and r.json()["field"] == "fingerprint", r.text


def test_bad_weak_and_duplicate_keys_are_400_naming_key_and_change_nothing(
    hub: Hub, tmp_path: Path
) -> None:
    """DSA, RSA below 2048 bits, a private key pasted by mistake, authorized_keys options, two
    keys at once, garbage, a key already registered (to the same or another account: one key,
    one account, so a key never names two users) and an eleventh key are refused, naming
    ``key`` and saying what is allowed; nothing is stored."""
    alice, bob = hub.create_user(), hub.create_user()
    token, bob_token = token_for(hub, alice), token_for(hub, bob)
    line, fp = keygen(tmp_path)
    weak, _ = keygen(tmp_path, "rsa", 1024)
    priv_path = tmp_path / "id_priv"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(priv_path)], check=True
    )
    url = f"/gpulab/users/{alice}/ssh-keys"
    bad = [
        "ssh-dss AAAAB3NzaC1kc3MAAACBAP" + "A" * 200 + " old@dsa",
        weak,
        priv_path.read_text(),
        f'command="/bin/true" {line}',
        f"{line}\n{keygen(tmp_path)[0]}",
        "ssh-ed25519 not-base64!!",
        "ssh-ed25519 " + line.split()[1][:-8] + "AAAAAAA=",
        "",
        12345,
    ]
    for key in bad:
        r = hub.api("POST", url, token=token, json={"key": key})
        assert r.status_code == 400, (key, r.text)
        body = r.json()
        assert body["field"] == "key" and "ed25519" in body["message"], (key, body)
    r = hub.api("POST", url, token=token, json={"key": line, "comment": "x"})
    assert r.status_code == 400 and r.json()["field"] == "comment", r.text
    r = hub.api("POST", url, token=token, json={"key": line, "title": "a\nb"})
    assert r.status_code == 400 and r.json()["field"] == "title", r.text
    assert keys_of(hub, alice, token) == []
    assert (
        not (hub.data_dir / "ssh" / "keys.json").exists()
        or fp not in (hub.data_dir / "ssh" / "keys.json").read_text()
    )

    assert hub.api("POST", url, token=token, json={"key": line}).status_code == 201
    for who, tok in ((alice, token), (bob, bob_token)):
        r = hub.api("POST", f"/gpulab/users/{who}/ssh-keys", token=tok, json={"key": line})
        assert r.status_code == 400 and r.json()["field"] == "key", r.text
        assert "already registered" in r.json()["message"]
    assert keys_of(hub, bob, bob_token) == []
    # At most ten keys.
    for _ in range(9):
        assert hub.api("POST", url, token=token, json={"key": keygen(tmp_path)[0]}).ok
    r = hub.api("POST", url, token=token, json={"key": keygen(tmp_path)[0]})
    assert r.status_code == 409 and r.json()["field"] == "key" and "10" in r.json()["message"]
    assert len(keys_of(hub, alice, token)) == 10


def test_only_the_user_manages_their_keys(hub: Hub, tmp_path: Path) -> None:
    """Another user, a teacher of the user's course, the admin's service token and the user's
    own server token cannot list, add or remove the user's keys (a key added by someone else
    would log them in as the user); nothing changes."""
    alice, bob = hub.create_user(), hub.create_user()
    teacher = f"t{uuid.uuid4().hex[:6]}"
    course = f"c{uuid.uuid4().hex[:6]}"
    make_course(hub, course, [teacher])
    assert roster(hub, course, f"{alice},student\n", hub.token).json()["added"] == [alice]
    token = token_for(hub, alice)
    mine, fp = keygen(tmp_path)
    url = f"/gpulab/users/{alice}/ssh-keys"
    assert hub.api("POST", url, token=token, json={"key": mine}).status_code == 201
    hub.spawn_ready(alice, {"gpu": "none"})
    try:
        with hub.kernel(alice) as k:
            server_token = k.execute("import os; print(os.environ['JUPYTERHUB_API_TOKEN'])").strip()
        callers = {
            "bob": token_for(hub, bob),
            "teacher": token_for(hub, teacher),
            "admin service": hub.token,
            "alice's server": server_token,
        }
        for who, tok in callers.items():
            theirs, their_fp = keygen(tmp_path)
            r = hub.api("POST", url, token=tok, json={"key": theirs})
            assert r.status_code in REFUSED, (who, r.status_code, r.text)
            assert hub.api("GET", url, token=tok).status_code in REFUSED, who
            r = hub.api("DELETE", f"{url}/{fp_path(fp)}", token=tok)
            assert r.status_code in REFUSED, (who, r.status_code, r.text)
            assert authorize(hub, {"user": alice, "fingerprint": their_fp}).status_code == 403
        assert [k["fingerprint"] for k in keys_of(hub, alice, token)] == [fp]
    finally:
        hub.stop_server(alice)


def test_a_cross_site_form_adds_no_key_but_the_users_page_session_does(
    hub: Hub, tmp_path: Path
) -> None:
    """With the log-in cookie alone (a page elsewhere posting to the hub) nothing is added; with
    the XSRF token, as the home page sends it, the key is added."""
    name = approved_user(hub)
    web = WebSession(hub)
    assert web.login(name, PASSWORD)
    line, fp = keygen(tmp_path)
    url = f"{hub.url}/hub/api/gpulab/users/{name}/ssh-keys"
    r = web.http.post(url, json={"key": line}, timeout=30)
    assert r.status_code == 403, r.text
    xsrf = web.http.cookies.get("_xsrf")
    r = web.http.post(url, json={"key": line}, headers={"X-XSRFToken": xsrf}, timeout=30)
    assert r.status_code == 201 and r.json()["fingerprint"] == fp, r.text


def test_authorize_and_session_answer_only_the_gateway(hub: Hub) -> None:
    """A user's full token, the admin's service token: 403 on both gateway routes (they would
    say whose a key is, and where a server's processes run)."""
    alice = hub.create_user()
    for tok in (token_for(hub, alice), hub.token):
        r = hub.api("POST", "/gpulab/ssh/authorize", token=tok, json={"user": alice, "token": tok})
        assert r.status_code == 403, r.text
        r = hub.api("POST", "/gpulab/ssh/session", token=tok, json={"user": alice, "server": ""})
        assert r.status_code == 403, r.text
    r = hub.api("POST", "/gpulab/ssh/session", token=gateway_token(hub), json={"user": alice})
    assert r.status_code == 200 and r.json()["user"] == alice, r.text


def test_a_token_logs_in_only_as_its_own_user_with_server_access(hub: Hub) -> None:
    """A token authorizes only as its very owner, and only if it may reach the owner's servers:
    not as another user (not even the admin's token, which reaches every server), not a
    read-only token, not a server's own token (filtered to one
    server, readable by staff inside it), not a service's token, not an expired one."""
    alice, bob = hub.create_user(), hub.create_user()
    full = token_for(hub, alice)
    assert authorize(hub, {"user": alice, "token": full, "peer": "t1"}).json() == {
        "user": alice,
        "recheck_seconds": 30.0,
    }
    assert authorize(hub, {"user": bob, "token": full, "peer": "t1"}).status_code == 403
    # The admin's own token reaches every server, yet logs in over SSH as the admin only.
    admin_token = hub.api("POST", "/users/admin/tokens", json={"expires_in": 600}).json()["token"]
    assert authorize(hub, {"user": alice, "token": admin_token, "peer": "t1"}).status_code == 403
    assert authorize(hub, {"user": "admin", "token": admin_token, "peer": "t1"}).ok
    r = hub.api(
        "POST", f"/users/{alice}/tokens", json={"scopes": ["read:users:name!user"], "note": "ro"}
    )
    assert r.status_code == 201, r.text
    assert authorize(hub, {"user": alice, "token": r.json()["token"]}).status_code == 403
    r = hub.api("POST", f"/users/{alice}/tokens", json={"scopes": [f"access:servers!user={alice}"]})
    assert authorize(hub, {"user": alice, "token": r.json()["token"]}).status_code == 200
    for service_token in (hub.token, gateway_token(hub)):
        r = authorize(hub, {"user": alice, "token": service_token, "peer": "t2"})
        assert r.status_code == 403, r.text
    r = hub.api("POST", f"/users/{alice}/tokens", json={"expires_in": 1})
    short = r.json()["token"]
    time.sleep(1.5)  # the token's own expiry (JupyterHub counts whole seconds): no event to wait on
    assert authorize(hub, {"user": alice, "token": short, "peer": "t3"}).status_code == 403
    hub.spawn_ready(alice, {"gpu": "none"})
    try:
        with hub.kernel(alice) as k:
            server_token = k.execute("import os; print(os.environ['JUPYTERHUB_API_TOKEN'])").strip()
        r = authorize(hub, {"user": alice, "token": server_token, "peer": "t4"})
        assert r.status_code == 403, r.text
    finally:
        hub.stop_server(alice)


def test_failed_log_ins_are_rate_limited_per_user_and_source(hub: Hub, tmp_path: Path) -> None:
    """Ten failures a minute for one user from one address: then 429, even for the right
    token, while the same user from elsewhere and another user from there still log in."""
    alice, bob = hub.create_user(), hub.create_user()
    good = token_for(hub, alice)
    peer = f"198.51.100.{uuid.uuid4().int % 250}"
    for i in range(10):
        r = authorize(hub, {"user": alice, "token": f"guess{i}", "peer": peer})
        assert r.status_code == 403, (i, r.text)
    r = authorize(hub, {"user": alice, "token": good, "peer": peer})
    assert r.status_code == 429 and int(r.headers["Retry-After"]) > 0, r.text
    r = authorize(hub, {"user": alice, "fingerprint": keygen(tmp_path)[1], "peer": peer})
    assert r.status_code == 429, r.text
    assert authorize(hub, {"user": alice, "token": good, "peer": "203.0.113.7"}).status_code == 200
    assert authorize(hub, {"user": bob, "token": token_for(hub, bob), "peer": peer}).ok


def test_rechecks_are_uncounted_and_a_gone_log_in_opens_no_session(hub: Hub) -> None:
    """An open connection's log-in checked again (``recheck: true``) follows the log-in's rules
    but is never counted nor rate-limited; a session asked with the connection's token once it is
    revoked is a 403 naming ``credential`` (attack wave on issue 25: a revoked token kept opening
    channels on a connection already open). Fails on the code before: ``recheck`` and ``token``
    were unknown fields (400)."""
    alice = hub.create_user()
    good = token_for(hub, alice)
    peer = f"198.51.100.{uuid.uuid4().int % 250}"
    for i in range(12):
        r = authorize(hub, {"user": alice, "token": f"gone{i}", "peer": peer, "recheck": True})
        assert r.status_code == 403, (i, r.text)
    r = authorize(hub, {"user": alice, "token": good, "peer": peer, "recheck": True})
    assert r.status_code == 200 and r.json()["recheck_seconds"] > 0, r.text
    assert authorize(hub, {"user": alice, "token": good, "peer": peer}).status_code == 200
    r = authorize(hub, {"user": alice, "token": good, "recheck": "yes"})
    assert r.status_code == 400 and r.json()["field"] == "recheck", r.text

    made = hub.api("POST", f"/users/{alice}/tokens", json={"note": "ssh"}).json()
    ask = {"user": alice, "server": "", "token": made["token"]}
    gw = gateway_token(hub)
    assert hub.api("POST", "/gpulab/ssh/session", token=gw, json=ask).status_code == 200
    assert hub.api("DELETE", f"/users/{alice}/tokens/{made['id']}").status_code == 204
    r = hub.api("POST", "/gpulab/ssh/session", token=gw, json=ask)
    assert r.status_code == 403 and r.json()["field"] == "credential", r.text
    both = {**ask, "token": good, "fingerprint": "SHA256:" + "A" * 43}
    r = hub.api("POST", "/gpulab/ssh/session", token=gw, json=both)
    assert r.status_code == 400 and r.json()["field"] == "fingerprint", r.text


def test_session_with_no_server_gives_the_home_and_how_to_start(hub: Hub) -> None:
    """No server: not running, nothing started or billed, but the home exists, owned by the
    user's account, so SFTP and rsync work; a plain message says how to start a server."""
    alice = hub.create_user()
    r = hub.api("POST", "/gpulab/ssh/session", token=gateway_token(hub), json={"user": alice})
    assert r.status_code == 200, r.text
    s = r.json()
    assert s["running"] is False and s["kind"] == "local" and s["pid"] is None, s
    assert s["cgroup"] is None and s["env"] == {}
    home = Path(s["home"])
    assert home.is_dir() and home.stat().st_uid == s["uid"] != 0
    assert pwd.getpwuid(s["uid"]).pw_name == s["account"]
    assert "not running" in s["message"] and f"{hub.url}/hub/home" in s["message"], s["message"]
    assert hub.server(alice) is None  # nothing started
    r = hub.api("POST", "/gpulab/ssh/session", token=gateway_token(hub), json={"user": "nobody-x"})
    assert r.status_code == 404 and r.json()["field"] == "user"
    r = hub.api(
        "POST", "/gpulab/ssh/session", token=gateway_token(hub), json={"user": alice, "server": 3}
    )
    assert r.status_code == 400, r.text


def test_session_of_a_running_server_names_its_process_cgroup_and_environment(hub: Hub) -> None:
    """A running local server: its launcher's pid (alive, in the cgroup whose cgroup.procs the
    hub names), its account, and the server's own environment (the GPUs it holds)."""
    alice = hub.create_user()
    hub.spawn_ready(alice, {"gpu": "a100-80g", "gpus": 1})
    try:
        with hub.kernel(alice) as k:
            cuda = k.execute("import os; print(os.environ['CUDA_VISIBLE_DEVICES'])").strip()
        r = hub.api(
            "POST",
            "/gpulab/ssh/session",
            token=gateway_token(hub),
            json={"user": alice, "server": ""},
        )
        assert r.status_code == 200, r.text
        s = r.json()
        assert s["running"] is True and s["kind"] == "local" and s["message"] == "", s
        assert s["env"]["CUDA_VISIBLE_DEVICES"] == cuda and cuda, s["env"]
        assert s["env"]["GPULAB_GPU_TYPE"] == "a100-80g" and s["env"]["HOME"] == s["home"]
        assert Path(f"/proc/{s['pid']}").exists()
        assert pwd.getpwuid(s["uid"]).pw_name == s["account"] != "root"
        if s["cgroup"]:
            pids = Path(s["cgroup"]).read_text().split()
            assert str(s["pid"]) in pids, (s["pid"], pids)
        assert s["ports_allowed"] == "own"
    finally:
        hub.stop_server(alice)
    r = hub.api("POST", "/gpulab/ssh/session", token=gateway_token(hub), json={"user": alice})
    assert r.json()["running"] is False and r.json()["pid"] is None, r.text


def test_a_key_does_not_outlive_its_account(hub: Hub, tmp_path: Path) -> None:
    """A user deleted and a new account made later under the same name (someone else, e.g. a
    new sign-up) does not inherit the old keys: the old owner's key logs in as nobody, and the
    new account starts with no keys (attack: "log in as another user with your key")."""
    name = f"gone{uuid.uuid4().hex[:6]}"
    hub.create_user(name)
    line, fp = keygen(tmp_path)
    r = hub.api(
        "POST", f"/gpulab/users/{name}/ssh-keys", token=token_for(hub, name), json={"key": line}
    )
    assert r.status_code == 201, r.text
    assert authorize(hub, {"user": name, "fingerprint": fp, "peer": "g1"}).status_code == 200
    assert hub.api("DELETE", f"/users/{name}").status_code == 204
    assert authorize(hub, {"user": name, "fingerprint": fp, "peer": "g1"}).status_code == 403
    hub.create_user(name)
    assert authorize(hub, {"user": name, "fingerprint": fp, "peer": "g1"}).status_code == 403
    assert keys_of(hub, name, token_for(hub, name)) == []
    # The newcomer can register that very key as theirs (the old record went with the account).
    r = hub.api(
        "POST", f"/gpulab/users/{name}/ssh-keys", token=token_for(hub, name), json={"key": line}
    )
    assert r.status_code == 201, r.text


def test_a_sign_up_whose_approval_is_withdrawn_logs_in_no_more(hub: Hub, tmp_path: Path) -> None:
    """The admin withdraws a person's approval (the Authorize page's toggle): the log-in form
    refuses them, and so does SSH, with their key and with their token."""
    name = approved_user(hub, "sshappr")
    assert WebSession(hub).login(name, PASSWORD)  # the hub's user is made at the first log-in
    token = token_for(hub, name)
    line, fp = keygen(tmp_path)
    r = hub.api("POST", f"/gpulab/users/{name}/ssh-keys", token=token, json={"key": line})
    assert r.status_code == 201, r.text
    assert authorize(hub, {"user": name, "fingerprint": fp, "peer": "w1"}).ok
    assert authorize(hub, {"user": name, "token": token, "peer": "w1"}).ok
    r = admin_web(hub).post(f"/hub/authorize/{name}", {"authorized": "0"})
    assert r.ok, r.status_code
    assert not WebSession(hub).login(name, PASSWORD)
    assert authorize(hub, {"user": name, "fingerprint": fp, "peer": "w1"}).status_code == 403
    assert authorize(hub, {"user": name, "token": token, "peer": "w1"}).status_code == 403
