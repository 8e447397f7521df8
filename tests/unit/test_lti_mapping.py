"""LTI 1.3 launches, without a hub: which username an LMS person gets, which course an LMS context
is, which course role the LMS roles make, and that the links in the hub database keep all three
stable (an in-memory JupyterHub database)."""

from __future__ import annotations

import pytest
from jupyterhub import orm, scopes

from gpulab.hub_config.courses import groups
from gpulab.hub_config.courses.lti import (
    CoursePlan,
    GpulabLTI,
    LTIError,
    configure_from_env,
    course_for,
    create_tables,
    use_nonce,
    username_for,
)
from gpulab.hub_config.courses.lti_claims import (
    CONTEXT_CLAIM,
    DEPLOYMENT_CLAIM,
    MESSAGE_TYPE_CLAIM,
    RESOURCE_LINK_CLAIM,
    ROLES_CLAIM,
    VERSION_CLAIM,
    course_role,
    course_slug,
    normalize_username,
    username_candidates,
)
from gpulab.hub_config.courses.roster import USERNAME_RE
from gpulab.hub_config.scopes import CUSTOM_SCOPES
from gpulab.spawners.options import COURSE_RE

ISS = "https://lms.example.edu"
MEMBERSHIP = "http://purl.imsglobal.org/vocab/lis/v2/membership"


@pytest.mark.parametrize(
    ("raw", "name"),
    [
        ("Ada.Lovelace", "ada.lovelace"),
        ("  José Núñez ", "jose-nunez"),
        ("ada+cs@@x", "ada-cs-x"),
        ("__-x--y..z", "x-y.z"),
        ("李雷", ""),
        ("a" * 80, "a" * 63),
        ("-" * 5, ""),
    ],
)
def test_usernames_are_normalized_to_the_hub_rule(raw: str, name: str) -> None:
    assert normalize_username(raw) == name
    assert name == "" or USERNAME_RE.match(name)


def test_username_comes_from_preferred_username_then_email_then_name() -> None:
    claims = {
        "sub": "93f1-77",
        "preferred_username": "Ada.L",
        "email": "ada.lovelace@uni.edu",
        "name": "Ada Lovelace",
    }
    assert username_candidates(claims) == ["ada.l", "ada.lovelace", "ada-lovelace"]
    assert username_candidates({"email": "Grace@navy.mil", "name": "G H"})[0] == "grace"
    assert username_candidates({"name": "Grace Hopper"}) == ["grace-hopper"]
    assert username_candidates({"given_name": "Grace", "family_name": "Hopper"}) == ["grace-hopper"]
    # Moodle's login name (its ext claim) before the e-mail; a UPN-like login keeps its local part.
    moodle = {
        "https://purl.imsglobal.org/spec/lti/claim/ext": {"user_username": "s1234@uni.edu"},
        "email": "ada@uni.edu",
    }
    assert username_candidates(moodle) == ["s1234", "ada"]
    # Never the LMS id.
    assert username_candidates({"sub": "12345"}) == []


@pytest.mark.parametrize(
    ("label", "title", "slug"),
    [
        ("ML 101", "Machine Learning", "ml-101"),
        ("CS-229 (Fall '25)", None, "cs-229-fall-25"),
        ("", "Deep Learning", "deep-learning"),
        (None, "Éléments d'IA", "elements-d-ia"),
        ("!!!", "", ""),
        ("x" * 60, None, "x" * 40),
    ],
)
def test_course_slug_from_the_context_label(label, title, slug) -> None:
    assert course_slug(label, title) == slug
    assert slug == "" or COURSE_RE.match(slug)


@pytest.mark.parametrize(
    ("roles", "role"),
    [
        ([f"{MEMBERSHIP}#Instructor"], "teacher"),
        ([f"{MEMBERSHIP}#Learner"], "student"),
        ([f"{MEMBERSHIP}/Instructor#TeachingAssistant"], "ta"),
        # Canvas sends a TA's Instructor role beside the sub-role: the TA wins.
        ([f"{MEMBERSHIP}#Instructor", f"{MEMBERSHIP}/Instructor#TeachingAssistant"], "ta"),
        ([f"{MEMBERSHIP}#Instructor#TeachingAssistantSection"], "ta"),
        ([f"{MEMBERSHIP}/Instructor#Lecturer"], "teacher"),
        ([f"{MEMBERSHIP}#Learner", f"{MEMBERSHIP}#Instructor"], "teacher"),
        (["Instructor"], "teacher"),
        (["Learner"], "student"),
        (["urn:lti:role:ims/lis/TeachingAssistant"], "ta"),
        # Institution and system roles do not make course roles.
        (["http://purl.imsglobal.org/vocab/lis/v2/institution/person#Instructor"], None),
        (["http://purl.imsglobal.org/vocab/lis/v2/system/person#Administrator"], None),
        ([f"{MEMBERSHIP}#Mentor", f"{MEMBERSHIP}#Administrator"], None),
        ([], None),
    ],
)
def test_lms_roles_map_to_course_roles(roles, role) -> None:
    assert course_role(roles) == role


@pytest.fixture
def db(monkeypatch):
    # gpulab's course roles use its custom scopes, which a hub defines from its config.
    monkeypatch.setattr(scopes, "scope_definitions", dict(scopes.scope_definitions))
    scopes.define_custom_scopes(CUSTOM_SCOPES)
    session = orm.new_session_factory("sqlite://")()
    create_tables(session)
    yield session
    session.close()


def make_user(db):
    def make(name: str):
        user = orm.User.find(db, name)
        if user is None:
            user = orm.User(name=name)
            db.add(user)
            db.commit()
        return user

    return make


def test_the_same_lms_person_always_gets_the_same_user_and_a_clash_a_stable_suffix(db) -> None:
    taken = {"admin"}

    def is_taken(name: str) -> bool:
        return name in taken

    ada = {"sub": "sub-ada", "preferred_username": "ada"}
    assert username_for(db, ISS, ada, is_taken) == "ada"
    # Another LMS person called "ada": a suffix from their own subject, the same every time.
    other = {"sub": "sub-other", "preferred_username": "Ada"}
    second = username_for(db, ISS, other, is_taken)
    assert second.startswith("ada-") and len(second) == len("ada-") + 6
    assert username_for(db, ISS, other, is_taken) == second
    # Ada's name changes in the LMS: still the same hub user.
    assert username_for(db, ISS, {**ada, "preferred_username": "lovelace"}, is_taken) == "ada"
    # The same sub on another platform is another person.
    assert username_for(db, "https://other.lms", ada, is_taken) not in ("ada", second)
    # Existing hub users and admin names are never handed out.
    assert username_for(db, ISS, {"sub": "x", "preferred_username": "admin"}, is_taken) != "admin"
    # No usable claim: a readable fallback, not the LMS id.
    anon = username_for(db, ISS, {"sub": "8812345"}, is_taken)
    assert anon.startswith("user-") and "8812345" not in anon
    assert GpulabLTI().name_is_linked(db, "ada") and not GpulabLTI().name_is_linked(db, "bob")


def test_a_context_is_one_course_created_once_and_stable_when_its_label_changes(db) -> None:
    ctx = {"id": "ctx-1", "label": "ML 101", "title": "Machine Learning"}
    group, course = course_for(db, ISS, ctx, make_user(db))
    assert course.name == "ml-101" and course.title == "Machine Learning"
    assert course.teachers == () and groups.students(group) == []
    renamed = {**ctx, "label": "ML 102"}
    assert course_for(db, ISS, renamed, make_user(db))[1].name == "ml-101"
    # Another context with the same label gets a suffixed name, stable too.
    other = {"id": "ctx-2", "label": "ML 101"}
    name = course_for(db, ISS, other, make_user(db))[1].name
    assert name.startswith("ml-101-") and COURSE_RE.match(name)
    assert course_for(db, ISS, other, make_user(db))[1].name == name
    # A plain group with the label's name is never taken over.
    db.add(orm.Group(name="cv-201"))
    db.commit()
    cv = course_for(db, ISS, {"id": "ctx-3", "label": "CV 201"}, make_user(db))[1]
    assert cv.name.startswith("cv-201-")
    # No label nor title: a name from the context id.
    assert course_for(db, ISS, {"id": "ctx-4"}, make_user(db))[1].name.startswith("course-")


def test_joining_is_additive_and_roles_follow_the_last_launch(db) -> None:
    lti = GpulabLTI(issuer=ISS)
    mk = make_user(db)
    mk("s1")
    a = {"id": "a", "label": "A 1"}
    b = {"id": "b", "label": "B 1"}
    lti.join_course(db, "s1", CoursePlan(a, "student"), mk)
    lti.join_course(db, "s1", CoursePlan(b, "student"), mk)
    assert groups.students(groups.find(db, "a-1")[0]) == ["s1"]
    assert groups.students(groups.find(db, "b-1")[0]) == ["s1"]
    lti.join_course(db, "s1", CoursePlan(a, "ta"), mk)
    group, course = groups.find(db, "a-1")
    assert course.tas == ("s1",) and groups.students(group) == []
    assert groups.students(groups.find(db, "b-1")[0]) == ["s1"]
    # No course role: nothing is made, not even the course (issue 20, attack 8).
    lti.join_course(db, "s1", CoursePlan({"id": "c", "label": "C 1"}, None), mk)
    assert groups.find(db, "c-1") is None


def valid_claims(**extra) -> dict:
    claims = {
        VERSION_CLAIM: "1.3.0",
        DEPLOYMENT_CLAIM: "dep-1",
        MESSAGE_TYPE_CLAIM: "LtiResourceLinkRequest",
        RESOURCE_LINK_CLAIM: {"id": "rl"},
        ROLES_CLAIM: [f"{MEMBERSHIP}#Learner"],
        CONTEXT_CLAIM: {"id": "c1", "label": "ML 101"},
        "sub": "s",
    }
    claims.update(extra)
    return claims


def test_claims_are_checked_naming_the_claim() -> None:
    lti = GpulabLTI(issuer=ISS, deployment_ids={"dep-1"})
    plan = lti.check_claims(valid_claims())
    assert plan is not None and plan.role == "student" and plan.context["id"] == "c1"
    assert lti.check_claims(valid_claims(**{CONTEXT_CLAIM: None})) is None
    for claims, status, field in [
        (valid_claims(**{DEPLOYMENT_CLAIM: "dep-9"}), 403, "deployment_id"),
        (valid_claims(**{VERSION_CLAIM: "1.1"}), 400, "version"),
        (valid_claims(**{MESSAGE_TYPE_CLAIM: "LtiDeepLinkingRequest"}), 400, "message_type"),
        (valid_claims(**{RESOURCE_LINK_CLAIM: {}}), 400, "resource_link"),
        (valid_claims(**{ROLES_CLAIM: "Learner"}), 400, "roles"),
        # No role gpulab knows: refused, whether or not there is a context.
        (valid_claims(**{ROLES_CLAIM: [f"{MEMBERSHIP}#Mentor"]}), 403, "roles"),
        (valid_claims(**{ROLES_CLAIM: [], CONTEXT_CLAIM: None}), 403, "roles"),
        (valid_claims(**{CONTEXT_CLAIM: {"label": "x"}}), 400, "context"),
    ]:
        with pytest.raises(LTIError) as e:
            lti.check_claims(claims)
        assert (e.value.status_code, e.value.field) == (status, field)
        assert e.value.log_message % e.value.args == str(e.value.args[0])
        assert str(e.value.args[0]).startswith(f"{field}: ")


def test_configuration_from_the_environment_and_half_configs_refused() -> None:
    from traitlets.config import Config

    c = Config()
    configure_from_env(c, {})
    assert "GpulabLTI" not in c
    configure_from_env(
        c,
        {
            "GPULAB_LTI_ISSUER": ISS,
            "GPULAB_LTI_CLIENT_IDS": "a, b",
            "GPULAB_LTI_AUTHORIZE_URL": f"{ISS}/auth",
            "GPULAB_LTI_JWKS_URL": f"{ISS}/jwks",
            "GPULAB_LTI_DEPLOYMENT_IDS": "1",
        },
    )
    lti = GpulabLTI(config=c)
    assert lti.enabled and lti.client_ids == {"a", "b"} and lti.deployment_ids == {"1"}
    lti.check()
    assert not GpulabLTI().enabled
    with pytest.raises(ValueError, match=r"GpulabLTI\.jwks_endpoint"):
        GpulabLTI(issuer=ISS, client_ids={"a"}, authorize_url="x").check()


def test_a_nonce_is_accepted_once_and_kept_across_sessions(tmp_path) -> None:
    # Issue 20, attack 8: an id_token could be replayed within max_age (no used-nonce store).
    url = f"sqlite:///{tmp_path / 'hub.sqlite'}"
    first = orm.new_session_factory(url)()
    create_tables(first)
    now = 1_000_000.0
    assert use_nonce(first, ISS, "n-1", now + 600, now)
    assert not use_nonce(first, ISS, "n-1", now + 600, now + 1)
    assert use_nonce(first, "https://other.example", "n-1", now + 600, now)  # per issuer
    first.close()
    # A new session on the same database (a restarted hub) still knows it ...
    second = orm.new_session_factory(url)()
    assert not use_nonce(second, ISS, "n-1", now + 600, now + 2)
    # ... until its token would be refused for age anyway: then it is pruned.
    assert use_nonce(second, ISS, "n-1", now + 1200, now + 602)
    second.close()


def test_spend_nonce_refuses_a_used_nonce_naming_the_field(db) -> None:
    lti = GpulabLTI(issuer=ISS)
    claims = {"nonce": "abc", "iat": 1e10}
    lti.spend_nonce(db, claims)
    with pytest.raises(LTIError) as e:
        lti.spend_nonce(db, claims)
    assert (e.value.status_code, e.value.field) == (401, "nonce")
    assert "used already" in str(e.value.args[0])
