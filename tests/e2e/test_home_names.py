"""Two user names never share one home (issue 23, red team finding on the home name).

The old rule wrote a disallowed character as ``-hex-`` but kept a literal ``-``, so ``fay.z`` and
``fay-2e-z`` (both allowed names) got the same home and with it the same image, upload folder,
private datasets, quota, keeper record and server log. Reproduced on a real hub:

- an attacker signs up as ``fay-2e-z``, plants ``~/.ipython/profile_default/startup/00-x.py``
  and stops; the victim ``fay.z`` starts: the attacker's code runs in the victim's kernel;
- the other order: the attacker's start (or upload, with no server) hands the victim's running
  home to the attacker's account, and the victim's kernel gets Permission denied;
- each lists the other's pending uploads.

Points of issue 23 covered: "Your own datasets ... uploading large files" (uploads stay one's
own) and the threat model (another user's files). Each test here failed on the old rule.
"""

from __future__ import annotations

import os
from decimal import Decimal
from pathlib import Path

import pytest
from harness import Hub, catalog_with, wait_for

from gpulab.spawners.local import accounts
from gpulab.spawners.storage.homes import home_name, legacy_home_name

VICTIM, ATTACKER = "fay.z", "fay-2e-z"
PLANTED = "~/.ipython/profile_default/startup/00-x.py"


@pytest.fixture(scope="module")
def nhub(module_hub_factory, tmp_path_factory) -> Hub:
    folder = tmp_path_factory.mktemp("home-names-catalog")
    return module_hub_factory(
        "home-names",
        simulate="RTX-4090:1",
        catalog=catalog_with(folder, free_gb=Decimal("0.0625")),
    )


def pending(hub: Hub, name: str) -> list[dict]:
    r = hub.api("GET", f"/users/{name}/uploads")
    assert r.status_code == 200, r.text
    return r.json()["uploads"]


def test_a_name_spelling_anothers_home_gets_a_home_of_its_own(nhub: Hub) -> None:
    """``fay-2e-z`` (the attacker) and ``fay.z`` (the victim): the attacker's planted IPython
    startup file is not in the victim's home and does not run in the victim's kernel; the
    attacker's later start leaves the victim's running home the victim's (it still writes);
    neither sees the other's files, pending uploads or server log. On the old rule all of
    these were one home."""
    for name in (VICTIM, ATTACKER):
        assert nhub.create_user(name) == name
    assert nhub.api("GET", f"/users/{VICTIM}").status_code == 200

    # The attacker plants code where IPython runs it at every kernel start, open to all.
    nhub.spawn_ready(ATTACKER, {"gpu": "none"})
    with nhub.kernel(ATTACKER) as k:
        k.execute(
            "import os, pathlib\n"
            f"p = pathlib.Path(os.path.expanduser({PLANTED!r}))\n"
            "p.parent.mkdir(parents=True, exist_ok=True)\n"
            "p.write_text('PWNED = open(os.path.expanduser(\"~/owner\")).read()')\n"
            "for d in [p, *p.parents][:4]: os.chmod(d, 0o777)\n"
            "open(os.path.expanduser('~/owner'), 'w').write('attacker')\n"
        )
    r = nhub.api("POST", f"/users/{ATTACKER}/uploads", json={"path": "drop.bin", "size": 10})
    assert r.status_code == 201, r.text
    attackers_upload = r.json()["id"]
    nhub.stop_server(ATTACKER)

    # The victim starts: a home of their own, nothing of the attacker's in it.
    nhub.spawn_ready(VICTIM, {"gpu": "none"})
    with nhub.kernel(VICTIM) as k:
        planted = k.execute(f"import os; print(os.path.exists(os.path.expanduser({PLANTED!r})))")
        assert planted.strip() == "False"
        ran = k.execute("print('PWNED' in dir())")
        assert ran.strip() == "False"
        victim_home = k.execute("import os; print(os.path.expanduser('~'))").strip()
        k.execute("open('mine.txt', 'w').write('victim')")
        assert attackers_upload not in [u["id"] for u in pending(nhub, VICTIM)]

        # The attacker starts again while the victim works: the victim's home stays theirs.
        nhub.spawn_ready(ATTACKER, {"gpu": "none"})
        with nhub.kernel(ATTACKER) as ka:
            attacker_home = ka.execute("import os; print(os.path.expanduser('~'))").strip()
            seen = ka.execute(f"import os; print(os.path.exists({victim_home + '/mine.txt'!r}))")
            assert seen.strip() == "False"
        assert attacker_home != victim_home
        r = nhub.api("POST", f"/users/{VICTIM}/uploads", json={"path": "v.bin", "size": 10})
        assert r.status_code == 201, r.text
        assert r.json()["id"] not in [u["id"] for u in pending(nhub, ATTACKER)]
        # No Permission denied for the victim after all that.
        again = k.execute("print(open('after.txt', 'w').write('still mine'))")
        assert again.strip() == "10"
    nhub.stop_server(VICTIM)
    nhub.stop_server(ATTACKER)

    homes = nhub.data_dir / "users"
    victims, attackers = homes / home_name(VICTIM), homes / home_name(ATTACKER)
    assert Path(victim_home) == victims and Path(attacker_home) == attackers
    assert os.stat(victims).st_uid != os.stat(attackers).st_uid or os.geteuid() != 0
    logs = nhub.data_dir / "logs"
    assert (logs / f"{home_name(VICTIM)}.log").exists()
    assert (logs / f"{home_name(ATTACKER)}.log").exists()


def legacy_folder(hub: Hub, user: str, owner: accounts.Account) -> Path:
    """A home as the old rule named and made it (a plain folder), owned by ``owner``."""
    old = hub.data_dir / "users" / legacy_home_name(user)
    assert old.name != home_name(user)
    old.mkdir(parents=True)
    (old / "thesis.tex").write_text("mine")
    for p in (old, old / "thesis.tex"):
        os.chown(p, owner.uid, owner.gid)
    old.chmod(0o700)
    return old


def account_of(hub: Hub, user: str) -> accounts.Account:
    return accounts.ensure_account(accounts.account_name(user), hub.data_dir / "users" / user)


@pytest.mark.skipif(os.geteuid() != 0, reason="users' own accounts need a root hub")
def test_a_home_from_the_old_rule_goes_to_its_own_account_only(nhub: Hub) -> None:
    """After the fix some names get a new home name (``kim.o-1``: ``kim-2e-o-1`` before,
    ``kim-2e-o-2d-1`` now). Their home from before is adopted when their own account owns it
    (the file is there at the first start); one owned by another account is not (``lee.p-2``
    starts in an empty home, the old folder untouched); and a home at a user's name that another
    user's account owns (the old rule's shared home) is never handed over: the start is
    refused. On the old code the shared home was chowned to whoever started."""
    kim, lee, ann, other = "kim.o-1", "lee.p-2", "ann.q", "oth-1"
    for name in (kim, lee, ann, other):
        nhub.create_user(name)
    stranger = account_of(nhub, other)

    legacy_folder(nhub, kim, account_of(nhub, kim))
    nhub.spawn_ready(kim, {"gpu": "none"})
    with nhub.kernel(kim) as k:
        assert k.execute("print(open('thesis.tex').read())").strip() == "mine"
    nhub.stop_server(kim)

    not_lees = legacy_folder(nhub, lee, stranger)
    nhub.spawn_ready(lee, {"gpu": "none"})
    with nhub.kernel(lee) as k:
        assert k.execute("import os; print(os.path.exists('thesis.tex'))").strip() == "False"
    nhub.stop_server(lee)
    assert os.stat(not_lees).st_uid == stranger.uid
    assert (not_lees / "thesis.tex").read_text() == "mine"

    shared = nhub.data_dir / "users" / home_name(ann)
    shared.mkdir()
    (shared / "planted.py").write_text("x = 1")
    for p in (shared, shared / "planted.py"):
        os.chown(p, stranger.uid, stranger.gid)
    r = nhub.spawn(ann, {"gpu": "none"})
    assert r.status_code in (202, 409, 500), r.text

    def ended() -> bool:
        s = nhub.server(ann)
        return s is None or not s.get("pending")

    wait_for(ended, 60, what="ann's start to end")
    assert nhub.server(ann) is None  # refused: no server runs in the stranger's home
    said = r.text if r.status_code != 202 else nhub.log_tail(400)
    assert "belongs to another user's account" in said or "belongs to jupyter-" in said, said
    assert os.stat(shared).st_uid == stranger.uid


@pytest.mark.skipif(os.geteuid() != 0, reason="users' own accounts need a root hub")
def test_an_upload_before_the_first_start_adopts_the_old_home_too(nhub: Hub) -> None:
    """A user whose home name changed uploads a file before their first start: the upload goes
    into their old home, adopted under the new name, instead of an empty new home that would
    leave the old one behind for good (the adoption then refuses to overwrite it)."""
    mia = "mia.r-3"
    nhub.create_user(mia)
    old = legacy_folder(nhub, mia, account_of(nhub, mia))
    r = nhub.api("POST", f"/users/{mia}/uploads", json={"path": "notes.txt", "size": 0})
    assert r.status_code == 201, r.text
    new = nhub.data_dir / "users" / home_name(mia)
    assert not old.exists()
    nhub.spawn_ready(mia, {"gpu": "none"})
    with nhub.kernel(mia) as k:
        got = k.execute("import os; print(open('thesis.tex').read(), os.path.exists('notes.txt'))")
    assert got.split() == ["mine", "True"], got
    assert new.is_dir()
    nhub.stop_server(mia)
