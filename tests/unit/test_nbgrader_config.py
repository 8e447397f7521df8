"""nbgrader on gpulab without a hub: the config each server gets, the course exchanges' folders
and ACLs, and the courses the hub reports for a user (docs/nbgrader.md)."""

from __future__ import annotations

import asyncio
import os
import stat
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from jupyterhub import orm
from traitlets.config.loader import PyFileConfigLoader

from gpulab.hub_config.courses.assignments import course_seats
from gpulab.spawners.courses import COURSE_KEY
from gpulab.spawners.local import exchange
from gpulab.spawners.local.accounts import Account
from gpulab.spawners.mixin import CourseSeat, GpuSpawnerMixin

TEACHES_TWO = [
    CourseSeat("alg", "teacher", students=("ann", "bob"), staff=("tom",)),
    CourseSeat("bio", "ta", students=("ann",), staff=("pat", "tom")),
    CourseSeat("chem", "student", students=("tom",), staff=("pat",)),
]


def load(tmp_path: Path, monkeypatch, seats, argv, cwd=None, student_id=None):
    """The config as nbgrader would load it for ``nbgrader ARGV`` run in ``cwd``."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(sys, "argv", ["nbgrader", *argv])
    folder = tmp_path / "conf"
    folder.mkdir(exist_ok=True)
    text = exchange.render_config("/x/exchange", seats, student_id=student_id)
    (folder / exchange.CONFIG_NAME).write_text(text)
    monkeypatch.chdir(cwd or home)
    return PyFileConfigLoader(exchange.CONFIG_NAME, path=str(folder)).load_config(), home


def test_config_picks_the_course_and_its_directory(tmp_path, monkeypatch) -> None:
    c, home = load(
        tmp_path, monkeypatch, TEACHES_TWO, ["release_assignment", "ps1", "--course", "bio"]
    )
    assert c.Exchange.root == "/x/exchange"
    assert c.Exchange.path_includes_course is True
    assert c.CourseDirectory.groupshared is True
    assert c.CourseDirectory.course_id == "bio"
    assert c.CourseDirectory.root == str(home / "courses" / "bio")
    assert (home / "courses" / "bio" / "source").is_dir()
    # --course=X and nbgrader's long form name the course too.
    c, home = load(tmp_path, monkeypatch, TEACHES_TWO, ["collect", "--course=alg"])
    assert c.CourseDirectory.root == str(home / "courses" / "alg")
    c, _ = load(tmp_path, monkeypatch, TEACHES_TWO, ["collect", "--CourseDirectory.course_id=alg"])
    assert c.CourseDirectory.course_id == "alg"


def test_config_in_a_course_folder_and_as_a_student(tmp_path, monkeypatch) -> None:
    inside = tmp_path / "home" / "courses" / "alg" / "source"
    inside.mkdir(parents=True)
    c, home = load(tmp_path, monkeypatch, TEACHES_TWO, ["generate_assignment", "ps1"], cwd=inside)
    assert c.CourseDirectory.course_id == "alg"
    assert c.CourseDirectory.root == str(home / "courses" / "alg")
    # Anywhere else, with several courses and no --course: nbgrader's own defaults.
    c, _ = load(tmp_path, monkeypatch, TEACHES_TWO, ["list"])
    assert "course_id" not in c.CourseDirectory and "root" not in c.CourseDirectory
    # A course they study: no course directory; the student id only where it is given.
    c, _ = load(tmp_path, monkeypatch, TEACHES_TWO, ["submit", "ps1", "--course", "chem"])
    assert c.CourseDirectory.course_id == "chem"
    assert "root" not in c.CourseDirectory and "student_id" not in c.CourseDirectory
    c, _ = load(
        tmp_path, monkeypatch, TEACHES_TWO, ["submit", "--course", "chem"], student_id="tom"
    )
    assert c.CourseDirectory.student_id == "tom"
    # A course they are not in: nothing chosen for it (the exchange has no entry for it either).
    c, _ = load(tmp_path, monkeypatch, TEACHES_TWO, ["fetch_assignment", "ps1", "--course", "zoo"])
    assert "course_id" not in c.CourseDirectory and "root" not in c.CourseDirectory
    # One course only: it is the default.
    c, _ = load(tmp_path, monkeypatch, TEACHES_TWO[2:], ["list"])
    assert c.CourseDirectory.course_id == "chem"


def test_acl_encoding_round_trips() -> None:
    value = exchange.encode_acl(7, {1001: 5, 1000: 7}, 0, 3)
    assert exchange.decode_acl(value) == {
        "owner": 7,
        "group": 0,
        "mask": 7,
        "other": 3,
        "named": {1000: 7, 1001: 5},
    }
    # Without named entries there is no mask.
    assert exchange.decode_acl(exchange.encode_acl(7, {}, 5, 5))["mask"] is None


def test_user_folder_without_accounts(tmp_path) -> None:
    folder, problems = exchange.prepare(tmp_path, "tom", "tom", TEACHES_TWO, None, None)
    assert problems == []
    base = tmp_path / "courses"
    assert folder == base / "users" / "tom"
    links = sorted(p.name for p in (folder / "exchange").iterdir())
    assert links == ["alg", "bio", "chem"]
    assert (folder / "exchange" / "alg").resolve() == (base / "exchange" / "alg").resolve()
    for course in links:
        for part in exchange.EXCHANGE_PARTS:
            assert (base / "exchange" / course / part).is_dir()
    text = (folder / exchange.CONFIG_NAME).read_text()
    assert "GPULAB_STUDENT_ID = 'tom'" in text
    # A course name that is no safe folder name is left out, and said so.
    odd = CourseSeat("../etc", "student")
    _, problems = exchange.prepare(tmp_path, "tom", "tom", [*TEACHES_TWO, odd], None, None)
    assert problems == ["course '../etc': not a safe folder name, left out"]
    assert "../etc" not in (folder / exchange.CONFIG_NAME).read_text()
    # Leaving a course removes its link at the next start.
    exchange.prepare(tmp_path, "tom", "tom", TEACHES_TWO[:1], None, None)
    assert [p.name for p in (folder / "exchange").iterdir()] == ["alg"]


@pytest.mark.skipif(os.geteuid() != 0, reason="ACLs owned by root need root")
def test_course_gate_acls(tmp_path) -> None:
    os.chmod(tmp_path, 0o755)
    accounts = {
        name: Account(name=f"jupyter-{name}", uid=uid, gid=uid, home="/nonexistent")
        for name, uid in (("tom", 61001), ("ann", 61002), ("bob", 61003))
    }  # "pat" has no account yet: no entry
    seat = TEACHES_TWO[0]
    try:
        folder, problems = exchange.prepare(
            tmp_path, "tom", "tom", [seat], accounts["tom"], accounts.get
        )
    except exchange.ExchangeError as e:  # pragma: no cover - a filesystem without ACLs
        pytest.skip(str(e))
    assert problems == []
    course = tmp_path / "courses" / "exchange" / "alg"

    def acl(path: Path, name: str = exchange.ACL_ACCESS) -> dict:
        return exchange.decode_acl(os.getxattr(path, name))

    gate = acl(course)
    assert gate["named"] == {61001: 5, 61002: 5, 61003: 5}
    assert (gate["group"], gate["other"]) == (0, 0)
    assert stat.S_IMODE(course.stat().st_mode) == 0o750
    out = acl(course / "outbound")
    assert out["named"] == {61001: 7} and out["other"] == 5
    assert acl(course / "outbound", exchange.ACL_DEFAULT)["named"] == {61001: 7}
    inbound = course / "inbound"
    assert acl(inbound)["named"] == {61001: 7} and acl(inbound)["other"] == 3
    assert inbound.stat().st_mode & stat.S_ISVTX
    assert acl(course / "feedback")["other"] == 1
    # The user's own folder: theirs to read, not to change; nobody else's.
    st = folder.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 61001, 0o750)
    config = folder / exchange.CONFIG_NAME
    assert stat.S_IMODE(config.stat().st_mode) == 0o640
    assert "GPULAB_STUDENT_ID = None" in config.read_text()
    # Bob leaves: the next sync drops his entry.
    left = CourseSeat("alg", "teacher", students=("ann",), staff=("tom",))
    exchange.prepare(tmp_path, "tom", "tom", [left], accounts["tom"], accounts.get)
    assert acl(course)["named"] == {61001: 5, 61002: 5}


def test_hub_reports_roles_and_people() -> None:
    db = orm.new_session_factory("sqlite://")()
    users = {n: orm.User(name=n) for n in ("tom", "pat", "ann", "bob")}
    db.add_all(users.values())
    alg = orm.Group(name="alg", properties={COURSE_KEY: {"teachers": ["tom"], "tas": ["pat"]}})
    alg.users = [users["ann"], users["bob"]]
    bio = orm.Group(name="bio", properties={COURSE_KEY: {"teachers": ["pat"]}})
    bio.users = [users["tom"], users["ann"]]
    plain = orm.Group(name="lab", properties={})
    plain.users = [users["bob"]]
    db.add_all([alg, bio, plain])
    db.commit()
    assert course_seats(db, "tom") == [
        CourseSeat("alg", "teacher", students=("ann", "bob"), staff=("tom", "pat")),
        CourseSeat("bio", "student", students=("ann", "tom"), staff=("pat",)),
    ]
    assert [(s.course, s.role) for s in course_seats(db, "ann")] == [
        ("alg", "student"),
        ("bio", "student"),
    ]
    assert [(s.course, s.role) for s in course_seats(db, "pat")] == [
        ("alg", "ta"),
        ("bio", "teacher"),
    ]
    assert course_seats(db, "bob") == [
        CourseSeat("alg", "student", students=("ann", "bob"), staff=("tom", "pat"))
    ]


def test_seats_hook_may_be_sync_or_async() -> None:
    seats = [CourseSeat("alg", "student")]

    async def later(spawner):
        return seats

    for hook in (lambda spawner: seats, later, None):
        spawner = SimpleNamespace(course_seats_hook=hook)
        got = asyncio.run(GpuSpawnerMixin.gpulab_course_seats(spawner))
        assert got == (tuple(seats) if hook else ())


def test_config_refuses_autograding_in_a_staff_server(tmp_path, monkeypatch) -> None:
    """`nbgrader autograde` (and the Formgrader's button) in a teacher's or TA's server would run
    students' code as them: gpulab's config replaces its executing steps by a refusal that names
    the hub's sandboxed path. Students' configs are left alone; the teacher may opt out."""
    monkeypatch.delenv("GPULAB_UNSAFE_AUTOGRADE", raising=False)
    c, _ = load(tmp_path, monkeypatch, TEACHES_TWO, ["autograde", "ps1", "--course", "alg"])
    (refusal,) = c.Autograde.autograde_preprocessors
    with pytest.raises(RuntimeError, match="assignments/ASSIGNMENT/autograde"):
        refusal().preprocess(None, {})
    # Naming no course, or another course the user staffs: refused all the same.
    c, _ = load(tmp_path, monkeypatch, TEACHES_TWO, ["autograde", "ps1"])
    assert len(c.Autograde.autograde_preprocessors) == 1
    studies_only = [CourseSeat("chem", "student", students=("tom",), staff=("pat",))]
    c, _ = load(tmp_path, monkeypatch, studies_only, ["autograde", "ps1"])
    assert "autograde_preprocessors" not in c.Autograde
    monkeypatch.setenv("GPULAB_UNSAFE_AUTOGRADE", "1")
    c, _ = load(tmp_path, monkeypatch, TEACHES_TWO, ["autograde", "ps1", "--course", "alg"])
    assert "autograde_preprocessors" not in c.Autograde
