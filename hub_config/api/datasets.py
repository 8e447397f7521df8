"""Users' own datasets over the hub's REST API: publish a folder of your home, share, delete.

- ``POST /hub/api/users/NAME/datasets`` ``{"folder": "data/faces", "name": "faces"}``: publish
  ``~/data/faces`` as ``@NAME/faces``, a read-only snapshot (:mod:`gpulab.spawners.storage.datasets`).
  The folder is checked and measured first: 400 naming ``folder`` (absolute, ``..``, not a
  folder of the home, a link) or ``name`` (not a slug), 409 naming ``name`` (taken) or
  ``folder`` (does not fit the quota with the home and the other datasets), and nothing is
  created. Then the copy runs in one of the store's own threads (one publish per user at a
  time, 409 naming ``name`` while one runs): done within ``DatasetStore.quick_answer_seconds``,
  201 with the dataset; else 202 with its progress, and ``GET .../datasets/DSNAME`` follows it.
- ``GET /hub/api/users/NAME/datasets``: their own (with what was skipped and who they are shared
  with), those shared with them, and ``datasets_bytes`` (counted against their quota).
- ``GET|DELETE /hub/api/users/NAME/datasets/DSNAME``: one of their own (a publish under way shows
  its progress; DELETE also cancels it).
- ``PUT /hub/api/users/NAME/datasets/DSNAME/sharing`` ``{"users": [...], "courses": [...]}``:
  the users (existing ones, 400 naming ``users`` otherwise) and courses it is shared with; a
  key left out keeps its list. Sharing with a course follows the share rule
  (``hub_config/courses/staff.py``: its teachers and TAs only, 403 naming ``courses``).

Only the user themself publishes, shares and deletes (their log-in, their tokens, their server's
token): scope ``servers`` on the user (what starts the servers that mount a dataset), and the
caller must be that user; course staff, who hold ``servers`` on their students, are refused.
Admins also read and delete. Refusals change nothing.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from jupyterhub import orm
from jupyterhub.scopes import needs_scope
from tornado import web

from gpulab.hub_config.api.base import GpulabAPIHandler
from gpulab.hub_config.courses.staff import share_problem
from gpulab.hub_config.overrides.errors import http_error
from gpulab.spawners.courses import student_courses
from gpulab.spawners.storage.datasets import DatasetStore
from gpulab.spawners.storage.homes import StorageError

PUBLISH_FIELDS = ("folder", "name")
SHARE_FIELDS = ("users", "courses")
MAX_SHARES = 1000
# Copies under way, kept referenced until they end (the request may have answered already).
_RUNNING: set[asyncio.Future] = set()


def _refusal(e: StorageError) -> web.HTTPError:
    return http_error(e.status, str(e), field=e.field)


class _DatasetsHandler(GpulabAPIHandler):
    @property
    def store(self) -> DatasetStore:
        return self.pool.datasets

    def own(self, user_name: str, *, admin_too: bool = False) -> Any:
        """The hub user ``user_name`` when the caller is that user (or, with ``admin_too``, an
        admin of users); 403 otherwise."""
        me = self.current_user
        is_self = me is not None and getattr(me, "kind", "") == "user" and me.name == user_name
        if not is_self and not (admin_too and self.has_scope("admin:users")):
            raise web.HTTPError(403, f"only {user_name} manages {user_name}'s datasets")
        user = self.find_user(user_name)
        if user is None:
            raise web.HTTPError(404, f"No such user: {user_name}")
        return user

    def body_of(self, allowed: tuple[str, ...]) -> dict[str, Any]:
        body = self.json_object_body()
        for key in body:
            if key not in allowed:
                raise http_error(
                    400, f"{key}: unknown field; allowed: {', '.join(allowed)}", field=key
                )
        return body


class DatasetsHandler(_DatasetsHandler):
    @needs_scope("read:servers")
    async def get(self, user_name: str) -> None:
        user = self.own(user_name, admin_too=True)
        courses = [c.name for c in student_courses(user.orm_user)]
        store = self.store
        own = await asyncio.to_thread(store.owned_by, user_name)
        shared = await asyncio.to_thread(store.shared_with, user_name, courses)
        jobs = [j.as_json() for j in store.jobs_of(user_name)]
        self.write(
            json.dumps(
                {
                    "datasets": [m.as_json() for m in own] + jobs,
                    "shared_with_me": [m.as_json(for_owner=False) for m in shared],
                    "datasets_bytes": sum(m.size_bytes for m in own),
                }
            )
        )

    @needs_scope("servers")
    async def post(self, user_name: str) -> None:
        self.own(user_name)
        body = self.body_of(PUBLISH_FIELDS)
        store = self.store
        try:
            job = await asyncio.to_thread(
                store.start_publish, user_name, body.get("folder"), body.get("name")
            )
        except StorageError as e:
            raise _refusal(e) from None
        copy = asyncio.get_running_loop().run_in_executor(store.executor, store.run_publish, job)
        _RUNNING.add(copy)
        copy.add_done_callback(_RUNNING.discard)
        await asyncio.wait([copy], timeout=store.quick_answer_seconds)
        self.set_header(
            "Location", self.hub.base_url + f"api/users/{user_name}/datasets/{job.name}"
        )
        if not copy.done():
            self.set_status(202)
            self.write(json.dumps({"dataset": job.as_json()}))
            return
        manifest = copy.result()
        if manifest is None:
            error = job.error or {"status": 500, "field": "folder", "message": "publish failed"}
            raise http_error(error["status"], error["message"], field=error["field"])
        self.set_status(201)
        self.write(json.dumps({"dataset": manifest.as_json()}))


class DatasetHandler(_DatasetsHandler):
    @needs_scope("read:servers")
    def get(self, user_name: str, name: str) -> None:
        self.own(user_name, admin_too=True)
        manifest = self.store.get(user_name, name)
        if manifest is not None:
            self.write(json.dumps({"dataset": manifest.as_json()}))
            return
        job = self.store.job(user_name, name)
        if job is None:
            raise web.HTTPError(404, f"name: {user_name} has no dataset {name!r}")
        self.write(json.dumps({"dataset": job.as_json()}))

    @needs_scope("servers")
    async def delete(self, user_name: str, name: str) -> None:
        self.own(user_name, admin_too=True)
        if not await asyncio.to_thread(self.store.delete, user_name, name):
            raise web.HTTPError(404, f"name: {user_name} has no dataset {name!r}")
        self.set_status(204)


class SharingHandler(_DatasetsHandler):
    @needs_scope("servers")
    async def put(self, user_name: str, name: str) -> None:
        self.own(user_name)
        body = self.body_of(SHARE_FIELDS)
        manifest = self.store.get(user_name, name)
        if manifest is None:
            raise web.HTTPError(404, f"name: {user_name} has no dataset {name!r}")
        users = self._names("users", body.get("users", list(manifest.users)))
        courses = self._names("courses", body.get("courses", list(manifest.courses)))
        unknown = [u for u in users if orm.User.find(self.db, u) is None]
        if unknown:
            raise http_error(400, f"users: no such users: {', '.join(unknown)}", field="users")
        for course in courses:
            if course in manifest.courses:
                continue  # shared before: keeping it is no new share (a TA who left keeps it)
            problem = share_problem(self, course)
            if problem is not None:
                raise http_error(problem[0], problem[1], field="courses")
        try:
            new = await asyncio.to_thread(self.store.set_sharing, user_name, name, users, courses)
        except StorageError as e:
            raise _refusal(e) from None
        self.log.info(
            "%s shares %s with users %s, courses %s", user_name, new.slug, new.users, new.courses
        )
        self.write(json.dumps({"dataset": new.as_json()}))

    @staticmethod
    def _names(field: str, value: Any) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise http_error(400, f"{field}: must be a list of names, not {value!r}", field=field)
        if len(value) > MAX_SHARES:
            raise http_error(400, f"{field}: at most {MAX_SHARES} names", field=field)
        return list(dict.fromkeys(value))


ROUTES = [
    (r"/api/users/([^/]+)/datasets", DatasetsHandler),
    (r"/api/users/([^/]+)/datasets/([^/]+)", DatasetHandler),
    (r"/api/users/([^/]+)/datasets/([^/]+)/sharing", SharingHandler),
]
