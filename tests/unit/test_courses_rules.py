"""Course rules and the roster CSV, without a hub: what a student may start, which course pays,
and which roster rows are refused (with the line and field)."""

from __future__ import annotations

import pytest

from gpulab.catalog import load_catalog
from gpulab.hub_config.courses.groups import CourseError, staff_scopes
from gpulab.hub_config.courses.roster import parse_roster
from gpulab.spawners.courses import (
    Course,
    CourseLimits,
    CourseRuleError,
    allowed_choices,
    apply_course_rules,
    course_of_group,
)
from gpulab.spawners.options import parse_options

CATALOG = load_catalog()
ML = Course(name="ml101", limits=CourseLimits(gpu_types=("none", "rtx-4090"), images=("base",)))
CV = Course(name="cv201", limits=CourseLimits(gpu_types=("a100-80g",)))


def opts(**raw):
    return parse_options(raw, CATALOG)


def test_users_in_no_course_are_unrestricted_and_may_not_name_one() -> None:
    o = opts(gpu="a100-80g")
    assert apply_course_rules(o, [], CATALOG) == o
    with pytest.raises(CourseRuleError) as e:
        apply_course_rules(opts(course="ml101"), [], CATALOG)
    assert e.value.field == "course"


def test_the_first_course_that_allows_the_server_pays_for_it() -> None:
    assert apply_course_rules(opts(gpu="none"), [CV, ML], CATALOG).course == "ml101"
    assert apply_course_rules(opts(gpu="a100-80g"), [CV, ML], CATALOG).course == "cv201"
    named = apply_course_rules(opts(gpu="rtx-4090", course="ml101"), [CV, ML], CATALOG)
    assert named.course == "ml101"


def test_a_server_no_course_allows_is_refused_naming_the_rule() -> None:
    with pytest.raises(CourseRuleError) as e:
        apply_course_rules(opts(gpu="a100-80g"), [ML], CATALOG)
    assert e.value.field == "gpu" and e.value.status == 403
    assert "course ml101 does not allow gpu type 'a100-80g'; allowed: rtx-4090, none" in str(
        e.value
    )
    with pytest.raises(CourseRuleError) as e:
        apply_course_rules(opts(gpu="rtx-4090", course="cv201"), [CV, ML], CATALOG)
    assert e.value.field == "gpu" and "course cv201" in str(e.value)
    with pytest.raises(CourseRuleError) as e:
        apply_course_rules(opts(gpu="rtx-4090", course="nope"), [CV, ML], CATALOG)
    assert e.value.field == "course" and "your courses: cv201, ml101" in str(e.value)
    datasets = next(iter(CATALOG.datasets))
    locked = Course(name="x", limits=CourseLimits(datasets=()))
    with pytest.raises(CourseRuleError) as e:
        apply_course_rules(opts(datasets=[datasets]), [locked], CATALOG)
    assert e.value.field == "datasets" and "allowed: none" in str(e.value)


def test_the_form_offers_the_union_of_the_courses_choices() -> None:
    assert allowed_choices([], CATALOG) is None
    both = allowed_choices([ML, CV], CATALOG)
    picked = [t for t in CATALOG.gpu_types if t in ("rtx-4090", "a100-80g")]
    assert both["gpu_types"] == [*picked, "none"]
    assert both["images"] == list(CATALOG.images)


def test_limits_must_name_catalog_entries() -> None:
    with pytest.raises(ValueError, match=r"limits.gpu_types: unknown gpu type 'h100'"):
        CourseLimits(gpu_types=("h100",)).check(CATALOG)
    CourseLimits(gpu_types=("none",)).check(CATALOG)


def test_a_group_is_a_course_only_with_course_properties() -> None:
    class Group:
        name = "ml101"
        properties = {"gpulab_course": {"display_name": "ML", "teachers": ["t"]}}

    class Plain:
        name = "staff"
        properties = {"colour": "red"}

    assert course_of_group(Group()).teachers == ("t",)
    assert course_of_group(Plain()) is None


def test_staff_scopes_reach_their_course_only() -> None:
    ta = staff_scopes("ml101", "ta", ["s1"])
    assert "access:servers!group=ml101" in ta and "access:servers!user=s1" in ta
    assert not [s for s in ta if "course-manage" in s]
    teacher = staff_scopes("ml101", "teacher")
    assert "custom:gpulab:course-manage!group=ml101" in teacher
    assert all("!" in s for s in ta + teacher)  # nothing unfiltered: never admin


def valid(name: str) -> bool:
    return True


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("Bad Name,student\n", "roster line 1: username"),
        ("ok,student\n/etc,student\n", "roster line 2: username"),
        ("ok,dean\n", "roster line 1: role"),
        ("ok,student,extra\n", "roster line 1"),
        ("ok\nok,ta\n", "roster line 2: username"),
        ("username,role\n", "roster"),
    ],
)
def test_roster_rows_are_checked_before_anything_changes(text: str, field: str) -> None:
    with pytest.raises(CourseError) as e:
        parse_roster(text, str.lower, valid)
    assert e.value.field == field and e.value.status == 400


def test_roster_roles_default_to_student() -> None:
    rows = parse_roster("username,role\nAlice\nbob,TA\ncarol,learner\n", str.lower, valid)
    assert [(r.username, r.role) for r in rows] == [
        ("alice", "student"),
        ("bob", "ta"),
        ("carol", "student"),
    ]
