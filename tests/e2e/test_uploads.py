"""Uploading into one's home through the hub, with no server and no GPU (issue 23, part E2).

Points of issue 23 covered (each test failed on the code before: there was no upload API, every
call below was a 404, so no file could reach a home without a running server):

- "Uploading large files works without holding a GPU (a no-GPU server or the hub), resumes after
  a dropped connection": chunks at offsets, the offset asked again after a drop, the file in the
  home owned by the home's owner, no server started and no card held.
- "fill the node's disk through the home": an upload past the quota is refused before a byte is
  sent, unfinished uploads count against it, and they expire (their bytes removed).
- "a symlink in a home that makes the hub ... follow into system paths" or another user's home:
  a link anywhere on the way to the destination, or at it, is refused, also when swapped in
  between the first and the last chunk; nothing is written where it points.
- "counted once against their quota" / "billing meters GB-days from what the hub measures":
  what unfinished uploads hold (outside the home) counts in the hub's storage answers like
  datasets, and a last chunk refused for want of room does not keep them longer.
- "root never acts on a path a user controls": a destination in a folder the user does not own
  (an image's root-owned ``lost+found``) is refused, and so is publishing it as a dataset; a
  path with invisible bidi/format characters is refused.
- The threat model: another user, a server's own token and a cross-site page (a cookie without
  the XSRF token) upload nothing into a home; two chunks racing at one offset do not corrupt it.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
import uuid
from decimal import Decimal
from pathlib import Path

import pytest
import requests
from course_helpers import token_for
from harness import PASSWORD, Hub, WebSession, approved_user, catalog_with, wait_for

MiB = 2**20
FREE_GB = "0.0625"  # 64 MiB
EXPIRE_SECONDS = 20
STALE_SECONDS = 5
REFUSED = (403, 404)


def small_catalog(folder: Path) -> Path:
    return catalog_with(folder, free_gb=Decimal(FREE_GB))


@pytest.fixture(scope="module")
def uhub(module_hub_factory, tmp_path_factory) -> Hub:
    return module_hub_factory(
        "uploads",
        simulate="RTX-4090:1",
        catalog=small_catalog(tmp_path_factory.mktemp("uploads-catalog")),
        extra_args=[
            f"--UploadStore.expire_seconds={EXPIRE_SECONDS}",
            "--UploadStore.sweep_seconds=1",
            f"--UploadStore.stale_seconds={STALE_SECONDS}",
            f"--UploadStore.max_chunk_bytes={4 * MiB}",
            "--StorageAPI.cache_seconds=0",
        ],
    )


def home_of(hub: Hub, name: str) -> Path:
    return hub.data_dir / "users" / name


def pending_dir(hub: Hub, name: str) -> Path:
    return hub.data_dir / "uploads" / name


def start(hub: Hub, name: str, path, size, token: str | None = None) -> requests.Response:
    return hub.api("POST", f"/users/{name}/uploads", token=token, json={"path": path, "size": size})


def patch(
    hub: Hub, name: str, upload_id: str, offset, data: bytes, token: str | None = None
) -> requests.Response:
    headers = {"Upload-Offset": str(offset), "Content-Type": "application/offset+octet-stream"}
    return hub.api(
        "PATCH", f"/users/{name}/uploads/{upload_id}", token=token, data=data, headers=headers
    )


def offset_of(hub: Hub, name: str, upload_id: str) -> int | None:
    r = hub.api("HEAD", f"/users/{name}/uploads/{upload_id}")
    return int(r.headers["Upload-Offset"]) if r.status_code == 200 else None


def upload(hub: Hub, name: str, path: str, data: bytes, chunk: int = MiB) -> dict:
    r = start(hub, name, path, len(data))
    assert r.status_code == 201, r.text
    up = r.json()
    at = 0
    while at < len(data) or not up.get("complete"):
        r = patch(hub, name, up["id"], at, data[at : at + chunk])
        assert r.status_code == 200, r.text
        up = {**up, **r.json()}
        at = up["offset"]
    return up


def raw_patch_start(hub: Hub, name: str, upload_id: str, offset: int, length: int) -> socket.socket:
    """A PATCH whose headers (and no body yet) are on the wire: the test sends the body."""
    sock = socket.create_connection(("127.0.0.1", hub.port), timeout=30)
    head = (
        f"PATCH /hub/api/users/{name}/uploads/{upload_id} HTTP/1.1\r\n"
        f"Host: localhost:{hub.port}\r\n"
        f"Authorization: token {hub.token}\r\n"
        f"Upload-Offset: {offset}\r\n"
        "Content-Type: application/offset+octet-stream\r\n"
        f"Content-Length: {length}\r\n\r\n"
    )
    sock.sendall(head.encode())
    return sock


def entries(folder: Path) -> list[str]:
    """What a folder holds, without an image home's own ``lost+found``."""
    return sorted(p.name for p in folder.iterdir() if p.name != "lost+found")


def owned_like_home(home: Path, path: Path) -> None:
    st, top = os.lstat(path), os.stat(home)
    assert (st.st_uid, st.st_gid) == (top.st_uid, top.st_gid), (path, st.st_uid, top.st_uid)


def test_chunks_land_in_the_home_with_no_server_and_no_gpu(uhub: Hub) -> None:
    name = uhub.create_user()
    free = uhub.free("rtx-4090")
    data = os.urandom(2 * MiB + 12345)
    r = start(uhub, name, "data/sets/faces.bin", len(data))
    assert r.status_code == 201, r.text
    up = r.json()
    assert up["offset"] == 0 and up["size"] == len(data) and not up["complete"]
    # Pending bytes live outside the home, root's.
    pend = pending_dir(uhub, name) / up["id"]
    assert pend.is_dir() and os.stat(pend).st_uid == 0 and os.stat(pend).st_mode & 0o077 == 0
    assert not (home_of(uhub, name) / "data").exists()

    r = patch(uhub, name, up["id"], 0, data[:MiB])
    assert r.status_code == 200 and r.json() == {"offset": MiB, "complete": False}, r.text
    assert offset_of(uhub, name, up["id"]) == MiB
    # A chunk at the wrong offset: 409 with the right one; nothing written.
    for wrong in (0, MiB + 1):
        r = patch(uhub, name, up["id"], wrong, data[wrong : wrong + 10])
        assert r.status_code == 409, r.text
        assert r.json()["offset"] == MiB and r.headers["Upload-Offset"] == str(MiB)
        assert r.json()["field"] == "Upload-Offset"
    # A chunk past the declared size: 400, nothing written.
    r = patch(uhub, name, up["id"], MiB, data[MiB:] + b"extra")
    assert r.status_code == 400 and r.json()["field"] == "Content-Length", r.text
    # No offset, or a chunk over the hub's maximum (4 MiB here).
    r = patch(uhub, name, up["id"], "", data[MiB : MiB + 10])
    assert r.status_code == 400 and r.json()["field"] == "Upload-Offset", r.text
    big = start(uhub, name, "big.bin", 5 * MiB).json()
    r = patch(uhub, name, big["id"], 0, bytes(5 * MiB))
    assert r.status_code == 413 and r.json()["field"] == "Content-Length", r.text
    assert uhub.api("DELETE", f"/users/{name}/uploads/{big['id']}").status_code == 204
    assert offset_of(uhub, name, up["id"]) == MiB

    r = patch(uhub, name, up["id"], MiB, data[MiB:])
    assert r.status_code == 200, r.text
    assert r.json() == {"offset": len(data), "complete": True, "path": "data/sets/faces.bin"}
    home = home_of(uhub, name)
    dest = home / "data" / "sets" / "faces.bin"
    assert hashlib.sha256(dest.read_bytes()).digest() == hashlib.sha256(data).digest()
    for made in (home / "data", home / "data" / "sets", dest):
        owned_like_home(home, made)
    assert os.stat(home).st_uid != 0  # the user's account, not root
    assert not (pending_dir(uhub, name) / up["id"] / "data").exists()
    assert offset_of(uhub, name, up["id"]) == len(data)  # a lost answer: the client learns
    # A second upload replaces the regular file.
    upload(uhub, name, "data/sets/faces.bin", b"v2")
    assert dest.read_bytes() == b"v2"
    owned_like_home(home, dest)
    # No temp file left, no server started, no card held.
    assert not [p for p in (home / "data" / "sets").iterdir() if p.name.startswith(".gpulab")]
    assert uhub.server(name) is None and uhub.free("rtx-4090") == free


def test_bad_paths_are_400_naming_path_and_change_nothing(uhub: Hub) -> None:
    name = uhub.create_user()
    upload(uhub, name, "hello.txt", b"hi")
    bad = [
        "",
        "/etc/cron.d/x",
        "../x",
        "a/../../x",
        "a//b",
        "a/./b",
        "a/",
        ".",
        "x\x00y",
        "x\ny",
        5,
    ]
    for path in bad:
        r = start(uhub, name, path, 1)
        assert r.status_code == 400 and r.json()["field"] == "path", (path, r.text)
    for size in (-1, "10", 1.5, True, None):
        r = start(uhub, name, "ok.txt", size)
        assert r.status_code == 400 and r.json()["field"] == "size", (size, r.text)
    r = uhub.api("POST", f"/users/{name}/uploads", json={"path": "a", "size": 1, "mode": 511})
    assert r.status_code == 400 and r.json()["field"] == "mode", r.text
    # A folder at the destination is never replaced.
    (home_of(uhub, name) / "folder").mkdir()
    r = start(uhub, name, "folder", 1)
    assert r.status_code == 409 and r.json()["field"] == "path", r.text
    listed = uhub.api("GET", f"/users/{name}/uploads").json()["uploads"]
    assert listed == []
    assert entries(home_of(uhub, name)) == ["folder", "hello.txt"]


def test_links_in_the_home_are_never_followed(uhub: Hub, tmp_path) -> None:
    alice, bob = uhub.create_user(), uhub.create_user()
    upload(uhub, bob, "secret.txt", b"bob's")
    upload(uhub, alice, "hello.txt", b"hi")
    home, bob_home = home_of(uhub, alice), home_of(uhub, bob)
    bob_before = entries(bob_home)
    owner = os.stat(home)
    mark = f"gpulab-upload-test-{uuid.uuid4().hex[:8]}"

    def link(name: str, target: Path) -> Path:
        p = home / name
        p.symlink_to(target)
        os.lchown(p, owner.st_uid, owner.st_gid)
        return p

    link("etc", Path("/etc"))
    link("bobs", bob_home)
    link("secret.txt", bob_home / "secret.txt")
    for path in (f"etc/{mark}", f"bobs/{mark}", f"bobs/deeper/{mark}", "secret.txt"):
        r = start(uhub, alice, path, 3)
        assert r.status_code == 409 and r.json()["field"] == "path", (path, r.text)
    # Swapped in between the first chunk and the last: refused, nothing written there.
    (home / "later").mkdir()
    os.chown(home / "later", owner.st_uid, owner.st_gid)
    up = start(uhub, alice, f"later/{mark}", 6).json()
    assert patch(uhub, alice, up["id"], 0, b"abc").status_code == 200
    (home / "later").rmdir()
    link("later", bob_home)
    r = patch(uhub, alice, up["id"], 3, b"def")
    assert r.status_code == 409 and r.json()["field"] == "path", r.text
    assert (home / "later").is_symlink()
    assert not (Path("/etc") / mark).exists()
    assert entries(bob_home) == bob_before
    assert (bob_home / "secret.txt").read_bytes() == b"bob's"
    # Once the link is gone the last chunk's bytes are kept: an empty PATCH completes it.
    (home / "later").unlink()
    r = patch(uhub, alice, up["id"], 6, b"")
    assert r.status_code == 200 and r.json()["complete"], r.text
    assert (home / "later" / mark).read_bytes() == b"abcdef"
    assert not (home / "later").is_symlink()


def test_another_user_a_servers_token_and_a_cross_site_page_upload_nothing(uhub: Hub) -> None:
    alice = approved_user(uhub, "alice")
    web = WebSession(uhub)
    assert web.login(alice, PASSWORD)  # the hub knows her from her first log-in
    bob = uhub.create_user()
    up = upload(uhub, alice, "mine.txt", b"alice")
    pending = start(uhub, alice, "pending.bin", 10).json()
    bob_token = token_for(uhub, bob)
    attempts = [
        ("POST", f"/users/{alice}/uploads", {"json": {"path": "evil.txt", "size": 4}}),
        ("GET", f"/users/{alice}/uploads", {}),
        ("GET", f"/users/{alice}/uploads/{pending['id']}", {}),
        ("HEAD", f"/users/{alice}/uploads/{pending['id']}", {}),
        ("DELETE", f"/users/{alice}/uploads/{pending['id']}", {}),
        (
            "PATCH",
            f"/users/{alice}/uploads/{pending['id']}",
            {"data": b"evil", "headers": {"Upload-Offset": "0"}},
        ),
    ]
    for method, path, kw in attempts:
        r = uhub.api(method, path, token=bob_token, **kw)
        assert r.status_code in REFUSED, (method, path, r.status_code, r.text)
    # A server's own token (code in alice's notebook, or staff who reach it) holds no `tokens`.
    uhub.spawn_ready(alice, {"gpu": "none"})
    try:
        server_token = (
            uhub.kernel(alice)
            .execute("import os; print(os.environ['JUPYTERHUB_API_TOKEN'])")
            .strip()
        )
        r = start(uhub, alice, "from-server.txt", 4, token=server_token)
        assert r.status_code in REFUSED, r.text
        r = patch(uhub, alice, pending["id"], 0, b"0123456789", token=server_token)
        assert r.status_code in REFUSED, r.text
    finally:
        uhub.stop_server(alice)
    # A cross-site page riding alice's cookie without the XSRF token.
    url = f"{uhub.url}/hub/api/users/{alice}/uploads"
    r = web.http.post(url, json={"path": "csrf.txt", "size": 4}, timeout=30)
    assert r.status_code == 403, r.text
    r = web.http.patch(
        f"{url}/{pending['id']}", data=b"csrf", headers={"Upload-Offset": "0"}, timeout=30
    )
    assert r.status_code == 403, r.text
    # With it (the upload page), alice herself may.
    xsrf = web.http.cookies.get("_xsrf")
    r = web.http.post(url, json={"path": "page.txt", "size": 2}, headers={"X-XSRFToken": xsrf})
    assert r.status_code == 201, r.text
    # Nothing of the refused attempts happened.
    home = home_of(uhub, alice)
    assert [n for n in entries(home) if not n.startswith(".")] == ["mine.txt"], entries(home)
    assert (home / "mine.txt").read_bytes() == b"alice" and up["complete"]
    assert offset_of(uhub, alice, pending["id"]) == 0


def test_over_quota_is_refused_up_front_pending_uploads_count_and_a_full_home_waits(
    uhub: Hub,
) -> None:
    name = uhub.create_user()
    r = start(uhub, name, "huge.bin", 65 * MiB)  # the quota is 64 MiB
    assert r.status_code == 413 and r.json()["field"] == "size", r.text
    assert not pending_dir(uhub, name).exists() or not list(pending_dir(uhub, name).iterdir())
    assert not (home_of(uhub, name) / "huge.bin").exists()
    first = start(uhub, name, "a.bin", 40 * MiB)
    assert first.status_code == 201, first.text
    r = start(uhub, name, "b.bin", 30 * MiB)  # 40 MiB reserved: 30 more do not fit
    assert r.status_code == 413 and r.json()["field"] == "size", r.text
    assert "reserve" in r.json()["message"]
    r = uhub.api("DELETE", f"/users/{name}/uploads/{first.json()['id']}")
    assert r.status_code == 204
    second = start(uhub, name, "b.bin", 30 * MiB)
    assert second.status_code == 201, second.text
    # The home filled up meanwhile (the user's server wrote 40 MiB): the last chunk is refused,
    # nothing is placed, and the bytes stay pending until there is room.
    home = home_of(uhub, name)
    filler = home / "filler.bin"
    filler.write_bytes(os.urandom(40 * MiB))
    os.chown(filler, os.stat(home).st_uid, os.stat(home).st_gid)
    up, data = second.json(), os.urandom(30 * MiB)
    for at in range(0, len(data), 4 * MiB):
        r = patch(uhub, name, up["id"], at, data[at : at + 4 * MiB])
    assert r.status_code == 413 and r.json()["field"] == "size", r.text
    assert not (home / "b.bin").exists() and offset_of(uhub, name, up["id"]) == len(data)
    filler.unlink()
    r = patch(uhub, name, up["id"], len(data), b"")
    assert r.status_code == 200 and r.json()["complete"], r.text
    assert hashlib.sha256((home / "b.bin").read_bytes()).digest() == hashlib.sha256(data).digest()


def test_racing_and_dropped_chunks_keep_the_file_whole(uhub: Hub) -> None:
    name = uhub.create_user()
    data = os.urandom(3 * MiB)
    up = start(uhub, name, "race.bin", len(data)).json()
    # Chunk A is on the wire (half its body sent); chunk B for the same offset arrives meanwhile.
    sock = raw_patch_start(uhub, name, up["id"], 0, MiB)
    try:
        sock.sendall(data[: MiB // 2])
        wait_for(lambda: offset_of(uhub, name, up["id"]) == MiB // 2, 30, what="chunk A's half")
        r = patch(uhub, name, up["id"], 0, b"B" * 65536)
        assert r.status_code == 409 and r.json()["field"] == "Upload-Offset", r.text
        sock.sendall(data[MiB // 2 : MiB])
        answer = sock.recv(65536).decode(errors="replace")
        assert answer.startswith("HTTP/1.1 200"), answer
    finally:
        sock.close()
    assert offset_of(uhub, name, up["id"]) == MiB
    # Chunk C drops mid-body: the offset is what was written, and the upload goes on from there.
    sent = MiB + 300_000
    sock = raw_patch_start(uhub, name, up["id"], MiB, 2 * MiB)
    sock.sendall(data[MiB:sent])
    wait_for(lambda: offset_of(uhub, name, up["id"]) == sent, 30, what="chunk C's bytes")
    sock.close()
    # The hub lets the next chunk in once C's connection is gone.
    deadline = time.monotonic() + 30
    while True:
        r = patch(uhub, name, up["id"], sent, data[sent:])
        if r.status_code != 409 or time.monotonic() > deadline:
            break
        assert r.json()["offset"] == sent, r.text
        time.sleep(0.2)
    assert r.status_code == 200 and r.json()["complete"], r.text
    got = (home_of(uhub, name) / "race.bin").read_bytes()
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(data).hexdigest()


def test_a_silent_chunk_gives_way_to_the_next_after_stale_seconds(uhub: Hub) -> None:
    """A client whose connection died without the hub hearing of it does not lock its upload:
    after ``stale_seconds`` without a byte, the next chunk ends it and goes on from its offset."""
    name = uhub.create_user()
    data = os.urandom(MiB)
    up = start(uhub, name, "silent.bin", len(data)).json()
    sock = raw_patch_start(uhub, name, up["id"], 0, MiB)
    try:
        sock.sendall(data[:100_000])
        wait_for(lambda: offset_of(uhub, name, up["id"]) == 100_000, 30, what="the first bytes")
        silent_since = time.monotonic()
        r = patch(uhub, name, up["id"], 100_000, data[100_000:])
        assert r.status_code == 409 and r.json()["offset"] == 100_000, r.text
        while True:
            r = patch(uhub, name, up["id"], 100_000, data[100_000:])
            if r.status_code != 409:
                break
            assert time.monotonic() - silent_since < STALE_SECONDS + 30, r.text
            time.sleep(0.5)
        assert r.status_code == 200 and r.json()["complete"], r.text
        assert time.monotonic() - silent_since >= STALE_SECONDS
    finally:
        sock.close()
    got = (home_of(uhub, name) / "silent.bin").read_bytes()
    assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()


def test_unfinished_uploads_expire_and_their_space_comes_back(uhub: Hub) -> None:
    name = uhub.create_user()
    up = start(uhub, name, "stale.bin", 50 * MiB).json()
    assert patch(uhub, name, up["id"], 0, bytes(MiB)).status_code == 200
    assert (pending_dir(uhub, name) / up["id"] / "data").stat().st_size == MiB
    r = uhub.api("GET", f"/users/{name}/uploads/{up['id']}")
    assert r.status_code == 200 and r.json()["expires_at"] > time.time(), r.text
    assert start(uhub, name, "other.bin", 30 * MiB).status_code == 413  # reserved
    wait_for(
        lambda: not (pending_dir(uhub, name) / up["id"]).exists(),
        EXPIRE_SECONDS + 30,
        what="the stale upload to expire",
    )
    assert offset_of(uhub, name, up["id"]) is None
    r = patch(uhub, name, up["id"], MiB, b"late")
    assert r.status_code == 404, r.text
    assert start(uhub, name, "other.bin", 30 * MiB).status_code == 201


def test_pending_upload_bytes_count_in_storage_and_a_refused_end_keeps_the_expiry(
    uhub: Hub,
) -> None:
    """Red team (issue 23, "counted against their quota", "billing meters GB-days from what the
    hub measures"): an upload pending with all but its last byte, then the home filled by the
    server, held home + pending bytes above the quota while the hub's storage answers showed
    only the home (billable 0), and the refused last byte (413) extended the upload's expiry.

    Fails on the old code: no ``uploads_bytes`` in ``GET /users/NAME/storage`` nor in the
    admins' ``GET /storage`` row, ``percent`` and the cost counted the home alone, and the
    refused chunk moved ``expires_at`` to its own time."""
    name = uhub.create_user()
    data = os.urandom(30 * MiB)
    up = start(uhub, name, "parked.bin", len(data)).json()
    for at in range(0, len(data) - 1, 4 * MiB):
        r = patch(uhub, name, up["id"], at, data[at : min(at + 4 * MiB, len(data) - 1)])
        assert r.status_code == 200, r.text
    assert offset_of(uhub, name, up["id"]) == len(data) - 1
    # The user's server fills the home: the image allows it (the pending bytes are elsewhere).
    home = home_of(uhub, name)
    filler = home / "filler.bin"
    filler.write_bytes(os.urandom(40 * MiB))
    os.chown(filler, os.stat(home).st_uid, os.stat(home).st_gid)

    mine = uhub.api("GET", f"/users/{name}/storage").json()
    assert mine["uploads_bytes"] >= len(data) - 1, mine
    held = mine["home"]["used_bytes"] + mine["datasets_bytes"] + mine["uploads_bytes"]
    quota = mine["home"]["quota_bytes"]
    assert held > quota and mine["percent"] > 100, mine
    assert mine["cost"]["billable_bytes"] >= held - quota > 0, mine
    assert mine["notice"]["level"] == "critical", mine
    rows = [h for h in uhub.api("GET", "/storage").json()["homes"] if h["user"] == name]
    assert len(rows) == 1 and rows[0]["uploads_bytes"] >= len(data) - 1, rows

    # The last byte, a while after the previous chunk: refused (no room), its expiry unmoved.
    before = uhub.api("GET", f"/users/{name}/uploads/{up['id']}").json()["expires_at"]
    wait_for(lambda: time.time() > before - EXPIRE_SECONDS + 2, 10, 0.1, what="two seconds")
    r = patch(uhub, name, up["id"], len(data) - 1, data[-1:])
    assert r.status_code == 413 and r.json()["field"] == "size", r.text
    after = uhub.api("GET", f"/users/{name}/uploads/{up['id']}").json()
    assert after["offset"] == len(data) and abs(after["expires_at"] - before) < 0.01, (
        before,
        after,
    )
    assert not (home / "parked.bin").exists()
    # Cancelled: nothing pending is counted any more.
    assert uhub.api("DELETE", f"/users/{name}/uploads/{up['id']}").status_code == 204
    assert uhub.api("GET", f"/users/{name}/storage").json()["uploads_bytes"] == 0


def root_folder(home: Path, name: str = "lost+found") -> Path:
    """A folder of the home owned by root, 0700, like an image home's own ``lost+found``."""
    folder = home / name
    if not folder.exists():
        folder.mkdir(mode=0o700)
    st = os.lstat(folder)
    assert st.st_uid == 0 and st.st_uid != os.stat(home).st_uid, "the home must be the user's"
    return folder


def test_uploads_into_a_folder_the_user_does_not_own_are_refused(uhub: Hub) -> None:
    """Red team (issue 23, "root never acts on a path a user controls"): an upload into
    ``lost+found`` (root's, 0700, in every image home) succeeded: root put a file there its
    owner can neither see nor delete, counted against their quota for good.

    Fails on the old code: the POST was 201 and the last chunk put the file in lost+found."""
    name = uhub.create_user()
    upload(uhub, name, "hello.txt", b"hi")  # the home exists, the user's
    home = home_of(uhub, name)
    lost = root_folder(home)
    inside = sorted(os.listdir(lost))
    for path in ("lost+found/x.bin", "lost+found/deeper/x.bin"):
        r = start(uhub, name, path, 3)
        assert r.status_code == 409 and r.json()["field"] == "path", (path, r.text)
        assert "not yours" in r.json()["message"], r.text
    # Made root's between the first chunk and the last: refused at the end, nothing written.
    (home / "later").mkdir()
    os.chown(home / "later", os.stat(home).st_uid, os.stat(home).st_gid)
    up = start(uhub, name, "later/x.bin", 6).json()
    assert patch(uhub, name, up["id"], 0, b"abc").status_code == 200
    os.chown(home / "later", 0, 0)
    r = patch(uhub, name, up["id"], 3, b"def")
    assert r.status_code == 409 and r.json()["field"] == "path", r.text
    assert os.listdir(home / "later") == [] and sorted(os.listdir(lost)) == inside
    assert uhub.api("GET", f"/users/{name}/uploads").json()["uploads"] != []


def test_invisible_characters_in_paths_are_400_naming_path(uhub: Hub) -> None:
    """Red team: a path with a right-to-left override (U+202E between ``a`` and ``b``: shown
    as another name), a zero-width or line/paragraph separator, or an unpaired surrogate was
    accepted.

    Fails on the old code: only Cc and Cs were refused, so the POSTs below were 201."""
    name = uhub.create_user()
    for path in (
        "a\u202eb.txt",
        "cod\u202egnp.exe",
        "x\u200by",
        "x\ufeffy",
        "x\u2028y",
        "x\u2029y",
    ):
        r = start(uhub, name, path, 1)
        assert r.status_code == 400 and r.json()["field"] == "path", (path, r.text)
    r = uhub.api(
        "POST",
        f"/users/{name}/uploads",
        data='{"path": "x\\ud800y", "size": 1}',
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 400 and r.json()["field"] == "path", r.text
    assert uhub.api("GET", f"/users/{name}/uploads").json()["uploads"] == []


def test_a_folder_the_user_does_not_own_is_not_published(uhub: Hub) -> None:
    """Red team (issue 23, "your own datasets"): publishing ``lost+found`` (root's) as a private
    dataset answered 201 with an empty dataset (only the owner's files are copied).

    Fails on the old code: the publish was accepted (201/202) and listed."""
    name = uhub.create_user()
    token = token_for(uhub, name)
    upload(uhub, name, "hello.txt", b"hi")
    root_folder(home_of(uhub, name))
    r = uhub.api(
        "POST", f"/users/{name}/datasets", token=token, json={"folder": "lost+found", "name": "lf"}
    )
    assert r.status_code in (400, 409) and r.json()["field"] == "folder", r.text
    listed = uhub.api("GET", f"/users/{name}/datasets", token=token).json()
    assert listed["datasets"] == [], listed
