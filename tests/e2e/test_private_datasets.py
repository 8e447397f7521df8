"""Users' own datasets through a real hub (issue 23, "your own datasets"): a folder of a home
published as a read-only snapshot ``@OWNER/NAME``, mounted in servers of those it is shared with
(named users, the members of a course its staff shared it with), and in nobody else's.

Attacks, each a test that failed on the code before it (how is said in each test's docstring):
links and hard links in the published folder, ``..`` and absolute folders, writing into a mounted
dataset, mounting one that is not shared with you (and telling it from one that does not exist),
sharing into a course you do not teach, and a folder too big for the quota (a sparse file).
"""

from __future__ import annotations

import os
import stat
import uuid
from pathlib import Path

import pytest
from course_helpers import make_course, token_for
from harness import PASSWORD, Hub, KernelError, WebSession, approved_user, wait_for

WRITE_REFUSED = r"(Read-only file system|Permission denied)"


def home_of(hub: Hub, name: str) -> Path:
    return hub.data_dir / "users" / name


def publish(hub: Hub, owner: str, token: str, folder: str, name: str) -> dict:
    """POST a publish and follow it to its end: the dataset, ready."""
    r = hub.api(
        "POST", f"/users/{owner}/datasets", token=token, json={"folder": folder, "name": name}
    )
    assert r.status_code in (201, 202), r.text
    if r.status_code == 201:
        return r.json()["dataset"]
    return wait_for(
        lambda: ready(hub, owner, token, name), 120, what=f"@{owner}/{name} to be published"
    )


def ready(hub: Hub, owner: str, token: str, name: str) -> dict | None:
    """``@owner/name`` once it is published (a failed publish fails the test)."""
    got = hub.api("GET", f"/users/{owner}/datasets/{name}", token=token).json()["dataset"]
    assert got["state"] != "failed", got
    return got if got["state"] == "ready" else None


def write_files(hub: Hub, user: str, code: str) -> None:
    """Run ``code`` in ``user``'s own server (as their account), then stop it."""
    hub.spawn_ready(user, {"gpu": "none"})
    try:
        with hub.kernel(user) as k:
            k.execute("import os; os.chdir(os.path.expanduser('~'))\n" + code)
    finally:
        hub.stop_server(user)


def test_a_publish_copies_only_the_owners_files_and_never_changes(hub: Hub) -> None:
    """Points: a symlink in the published folder to /etc/shadow or into bob's home is not
    copied; ``folder`` with ``..`` or absolute (or naming a link) is a 400 naming it and nothing
    is created; alice edits her folder after publishing and the snapshot is unchanged; alice
    cannot write into her own mounted dataset.

    Fails on the old code: there was no datasets route (404) and ``@alice/faces`` was an unknown
    dataset (400)."""
    alice, bob = hub.create_user(), hub.create_user()
    token = token_for(hub, alice)
    write_files(hub, bob, "open('secret.txt', 'w').write('bob secret')")
    bob_home = home_of(hub, bob)
    write_files(
        hub,
        alice,
        "os.makedirs('faces/sub', exist_ok=True)\n"
        "open('faces/a.txt', 'w').write('v1')\n"
        "open('faces/sub/b.txt', 'w').write('b')\n"
        "os.symlink('/etc/shadow', 'faces/shadow')\n"
        f"os.symlink('{bob_home}', 'faces/bobhome')\n"
        f"os.symlink('{bob_home}/secret.txt', 'faces/bobsecret')\n"
        "os.symlink('/etc', 'linked')\n",
    )
    # Bad folders: 400 naming folder, nothing published.
    for folder in (f"../{bob}", "/etc", "faces/../../..", "linked", "faces/shadow", "nope"):
        r = hub.api(
            "POST", f"/users/{alice}/datasets", token=token, json={"folder": folder, "name": "x"}
        )
        assert r.status_code == 400 and r.json()["field"] == "folder", (folder, r.text)
    r = hub.api(
        "POST", f"/users/{alice}/datasets", token=token, json={"folder": "faces", "name": "A/b"}
    )
    assert r.status_code == 400 and r.json()["field"] == "name", r.text
    listed = hub.api("GET", f"/users/{alice}/datasets", token=token).json()
    assert listed["datasets"] == [] and listed["datasets_bytes"] == 0

    ds = publish(hub, alice, token, "faces", "faces")
    assert ds["slug"] == f"@{alice}/faces" and ds["mount"] == f"~/datasets/@{alice}.faces"
    skipped = {s["path"] for s in ds["skipped"]}
    assert {"shadow", "bobhome", "bobsecret"} <= skipped
    snapshot = hub.data_dir / "user-datasets" / alice / "faces" / "data"
    assert sorted(os.listdir(snapshot)) == ["a.txt", "sub"]
    if os.geteuid() == 0:
        st = os.stat(snapshot / "a.txt")
        assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o444
    listed = hub.api("GET", f"/users/{alice}/datasets", token=token).json()
    assert listed["datasets_bytes"] > 0 and [d["name"] for d in listed["datasets"]] == ["faces"]

    # Alice edits her folder afterwards: the snapshot is what she published.
    hub.spawn_ready(alice, {"gpu": "none", "datasets": [f"@{alice}/faces", "sklearn-toy"]})
    try:
        with hub.kernel(alice) as k:
            k.execute("import os; os.chdir(os.path.expanduser('~'))")
            k.execute("open('faces/a.txt', 'w').write('v2'); open('faces/new.txt', 'w')")
            got = k.execute(f"print(open('datasets/@{alice}.faces/a.txt').read())").strip()
            assert got == "v1"
            names = k.execute(f"print(sorted(os.listdir('datasets/@{alice}.faces')))").strip()
            assert names == "['a.txt', 'sub']"
            for code in (
                f"open('datasets/@{alice}.faces/a.txt', 'w')",
                f"open('datasets/@{alice}.faces/mine.txt', 'w')",
            ):
                with pytest.raises(KernelError, match=WRITE_REFUSED):
                    k.execute(code)
    finally:
        hub.stop_server(alice)
    assert (snapshot / "a.txt").read_text() == "v1"


def test_only_those_it_is_shared_with_mount_it_and_others_cannot_tell_it_exists(hub: Hub) -> None:
    """Points: bob, shared read-only, mounts it and cannot write into it; carol (not shared)
    cannot mount it and gets the same 400 as for a dataset that does not exist (REST start);
    once unshared, bob's switch, REST start and app launch are refused the same way; bob's
    token can neither publish, share nor delete alice's datasets.

    Fails on the old code: ``@alice/...`` was refused for everyone, bob too. Checked also with
    the spawner's access check (``GpuSpawnerMixin._check_private_datasets``) taken out: carol's
    start was not refused (it went ahead to the launch)."""
    alice = hub.create_user()
    bob, carol = approved_user(hub, "bob"), approved_user(hub, "carol")  # they log in below
    hub.create_user(bob), hub.create_user(carol)
    a_token, b_token = token_for(hub, alice), token_for(hub, bob)
    write_files(hub, alice, "os.makedirs('data', exist_ok=True); open('data/x.csv','w').write('1')")
    publish(hub, alice, a_token, "data", "tab")
    slug = f"@{alice}/tab"

    def refusal(user: str, wanted: str) -> str:
        r = hub.spawn(user, {"gpu": "none", "datasets": [wanted]})
        assert r.status_code == 400 and r.json().get("field") == "datasets", r.text
        assert hub.server(user) is None
        return r.json()["message"].replace(wanted, "SLUG")

    # Not shared yet: bob is refused like carol, and like a dataset that does not exist.
    missing = refusal(carol, f"@{alice}/nothing-here")
    assert refusal(carol, slug) == missing
    assert refusal(bob, slug) == missing
    # Bob cannot share it with himself, nor publish or delete in alice's name.
    attempts = [
        ("PUT", f"/users/{alice}/datasets/tab/sharing", {"users": [bob]}),
        ("POST", f"/users/{alice}/datasets", {"folder": "data", "name": "mine"}),
        ("DELETE", f"/users/{alice}/datasets/tab", None),
        ("GET", f"/users/{alice}/datasets", None),
    ]
    for method, path, body in attempts:
        r = hub.api(method, path, token=b_token, json=body)
        assert r.status_code in (403, 404), (method, path, r.text)
    ds = hub.api("GET", f"/users/{alice}/datasets/tab", token=a_token).json()["dataset"]
    assert ds["shared_with"] == {"users": [], "courses": []}

    r = hub.api("PUT", f"/users/{alice}/datasets/tab/sharing", token=a_token, json={"users": [bob]})
    assert r.status_code == 200 and r.json()["dataset"]["shared_with"]["users"] == [bob], r.text
    shared = hub.api("GET", f"/users/{bob}/datasets", token=b_token).json()["shared_with_me"]
    assert [d["slug"] for d in shared] == [slug] and "shared_with" not in shared[0]
    # Bob's spawn form offers it; carol's does not.
    for name, offered in ((bob, True), (carol, False)):
        web = WebSession(hub)
        assert web.login(name, PASSWORD)
        form = web.get(f"/hub/spawn/{name}")
        assert form.status_code == 200 and 'name="datasets"' in form.text, form.text[-500:]
        assert (f'value="{slug}"' in form.text) == offered, name
    assert refusal(carol, slug) == missing  # still nobody else

    hub.spawn_ready(bob, {"gpu": "none", "datasets": [slug]})
    try:
        with hub.kernel(bob) as k:
            k.execute("import os; os.chdir(os.path.expanduser('~/datasets'))")
            assert k.execute(f"print(open('@{alice}.tab/x.csv').read())").strip() == "1"
            for code in (f"open('@{alice}.tab/x.csv', 'a')", f"open('@{alice}.tab/y', 'w')"):
                with pytest.raises(KernelError, match=WRITE_REFUSED):
                    k.execute(code)
        # Unshared while bob's server runs: it keeps what it mounted at its start, but a switch
        # (a new start) is refused with the same words, and his server goes on.
        r = hub.api(
            "PUT", f"/users/{alice}/datasets/tab/sharing", token=a_token, json={"users": []}
        )
        assert r.status_code == 200, r.text
        r = hub.api("POST", f"/gpulab/users/{bob}/switch", token=b_token, json={"gpu": "rtx-4090"})
        assert r.status_code == 400 and r.json().get("field") == "datasets", r.text
        assert r.json()["message"].replace(slug, "SLUG") == missing
        assert hub.server(bob)["ready"] and hub.server(bob)["user_options"]["gpu"] == "none"
    finally:
        hub.stop_server(bob)

    # Bob's next start, from the REST API or an app launch, is refused with the same words.
    assert refusal(bob, slug) == missing
    r = hub.api(
        "POST",
        f"/gpulab/users/{bob}/apps/jupyterlab/launch",
        token=b_token,
        json={"gpu": "none", "datasets": [slug]},
    )
    assert r.status_code == 400 and r.json().get("field") == "datasets", r.text
    assert hub.server(bob) is None
    r = hub.api("DELETE", f"/users/{alice}/datasets/tab", token=a_token)
    assert r.status_code == 204 and not (hub.data_dir / "user-datasets" / alice / "tab").exists()


def test_a_class_gets_its_teachers_dataset_and_a_student_shares_into_no_course(hub: Hub) -> None:
    """Points: a teacher shares a dataset with a course and a student of it mounts it (the
    course's dataset limits are about the catalog's datasets); a student cannot share with a
    course they are not staff of (403 naming courses), nor with a course or user that does not
    exist (400 naming the field), and nothing changes; the teacher, who holds ``servers`` on
    the class, cannot publish, share or delete the student's datasets.

    Fails on the old code: no sharing at all. Checked also with the share rule
    (``staff.share_problem``) answering None: the student's share went through; and with the
    API's caller-is-the-user check (``_DatasetsHandler.own``) taken out: the teacher published
    the student's folder (201)."""
    tag = uuid.uuid4().hex[:6]
    teacher, student = f"tch{tag}", f"stu{tag}"
    course = f"ds{tag}"
    make_course(hub, course, [teacher], datasets=["sklearn-toy"])
    hub.create_user(student)
    r = hub.api("POST", f"/groups/{course}/users", json={"users": [student]})
    assert r.status_code == 200, r.text
    t_token, s_token = token_for(hub, teacher), token_for(hub, student)

    write_files(hub, student, "os.makedirs('notes', exist_ok=True); open('notes/n','w')")
    publish(hub, student, s_token, "notes", "notes")
    for body, code, fld in (
        ({"courses": [course]}, 403, "courses"),
        ({"courses": [f"no{tag}"]}, 400, "courses"),
        ({"users": [f"nobody{tag}"]}, 400, "users"),
        ({"users": "everyone"}, 400, "users"),
        ({"readers": [teacher]}, 400, "readers"),
    ):
        r = hub.api("PUT", f"/users/{student}/datasets/notes/sharing", token=s_token, json=body)
        assert r.status_code == code and r.json()["field"] == fld, (body, r.text)
    # The teacher holds servers!group on the class, yet publishes and shares nothing of the
    # student's (only the user themself does).
    for method, path, body in (
        ("POST", f"/users/{student}/datasets", {"folder": "notes", "name": "copy"}),
        ("PUT", f"/users/{student}/datasets/notes/sharing", {"users": [teacher]}),
        ("DELETE", f"/users/{student}/datasets/notes", None),
    ):
        r = hub.api(method, path, token=t_token, json=body)
        assert r.status_code in (403, 404), (method, path, r.text)
    ds = hub.api("GET", f"/users/{student}/datasets/notes", token=s_token).json()["dataset"]
    assert ds["shared_with"] == {"users": [], "courses": []}
    assert [
        d["name"]
        for d in hub.api("GET", f"/users/{student}/datasets", token=s_token).json()["datasets"]
    ] == ["notes"]

    write_files(
        hub, teacher, "os.makedirs('lab1', exist_ok=True); open('lab1/q.txt','w').write('q')"
    )
    publish(hub, teacher, t_token, "lab1", "lab1")
    r = hub.api(
        "PUT", f"/users/{teacher}/datasets/lab1/sharing", token=t_token, json={"courses": [course]}
    )
    assert r.status_code == 200, r.text
    hub.spawn_ready(student, {"gpu": "none", "datasets": ["sklearn-toy", f"@{teacher}/lab1"]})
    try:
        with hub.kernel(student) as k:
            got = k.execute(
                f"import os; print(open(os.path.expanduser('~/datasets/@{teacher}.lab1/q.txt'))"
                ".read())"
            ).strip()
            assert got == "q"
    finally:
        hub.stop_server(student)


def test_a_folder_larger_than_the_quota_is_409_and_copies_nothing(hub: Hub) -> None:
    """Points: a sparse file (a terabyte of holes) or a folder that does not fit the quota with
    the home and the other datasets is refused, 409 naming folder, before anything is copied:
    the node's disk is never filled through a snapshot.

    Fails on the old code: no publishing (404). Checked also with the bound taken out of the
    store (``_Walk.charge`` not raising): the publish was accepted."""
    alice = hub.create_user()
    token = token_for(hub, alice)
    write_files(
        hub,
        alice,
        "os.makedirs('big', exist_ok=True)\n"
        "f = open('big/holes', 'wb'); f.truncate(1 << 40); f.close()\n",
    )
    r = hub.api(
        "POST", f"/users/{alice}/datasets", token=token, json={"folder": "big", "name": "big"}
    )
    assert r.status_code == 409 and r.json()["field"] == "folder", r.text
    assert "does not fit your quota" in r.json()["message"]
    assert hub.api("GET", f"/users/{alice}/datasets", token=token).json()["datasets"] == []
    assert not (hub.data_dir / "user-datasets" / alice / "big").exists()


def test_a_hard_link_to_another_users_file_is_not_copied(hub_factory) -> None:
    """Point: a hard link to a file alice does not own (directory backend: every home on one
    filesystem, so the link can exist) is not copied into her snapshot.

    Fails on the old code: no publishing (404). Checked also with the store's owner check
    (``_Walk._entry``/``_copy_file``: ``st_uid != owner_uid``) taken out: bob's secret was in
    alice's snapshot."""
    # Plain folders for homes; and every publish answers 202 at once (then followed by GET).
    hub = hub_factory(
        "plainhomes",
        simulate="RTX-4090:1",
        extra_args=["--HomeStore.mode=directory", "--DatasetStore.quick_answer_seconds=0"],
    )
    alice, bob = hub.create_user(), hub.create_user()
    token = token_for(hub, alice)
    write_files(hub, bob, "open('secret.txt', 'w').write('bob secret')")
    write_files(hub, alice, "os.makedirs('faces', exist_ok=True); open('faces/a.txt','w')")
    # Made here as root: the kernel's protected_hardlinks keeps alice from making it herself,
    # but the snapshot must not rest on that sysctl.
    os.link(home_of(hub, bob) / "secret.txt", home_of(hub, alice) / "faces" / "bobs")
    r = hub.api(
        "POST", f"/users/{alice}/datasets", token=token, json={"folder": "faces", "name": "faces"}
    )
    assert r.status_code == 202 and r.json()["dataset"]["state"] == "publishing", r.text
    assert set(r.json()["dataset"]["progress"]) == {"bytes", "total_bytes", "files", "total_files"}
    assert r.headers["Location"] == f"/hub/api/users/{alice}/datasets/faces"
    # One publish at a time per user: a second one while it runs is a 409 naming name.
    r = hub.api(
        "POST", f"/users/{alice}/datasets", token=token, json={"folder": "faces", "name": "two"}
    )
    assert r.status_code in (409, 201, 202), r.text  # 201/202 only if the first was done
    assert r.status_code != 409 or r.json()["field"] == "name"
    ds = wait_for(lambda: ready(hub, alice, token, "faces"), 60, what="the first publish")
    assert [s["path"] for s in ds["skipped"]] == ["bobs"], ds["skipped"]
    assert "not the home owner's" in ds["skipped"][0]["why"]
    snapshot = hub.data_dir / "user-datasets" / alice / "faces" / "data"
    assert sorted(os.listdir(snapshot)) == ["a.txt"]
