"""Training jobs' REST API (issue 26): thin handlers over :class:`JobScheduler`.

- ``POST /hub/api/gpulab/users/NAME/jobs`` (a JSON job spec): 201 with the job, queued; a bad
  field is 400 naming it, and nothing is created; so is a job its owner's courses do not allow
  (the course rules of a server start: a course the owner is not a student of is 400 naming
  ``course``).
- ``GET /hub/api/gpulab/users/NAME/jobs``: NAME's jobs, newest first, each with ``reason`` (why it
  waits, or how it ended).
- ``GET /hub/api/gpulab/users/NAME/jobs/ID``: one job, its attempts and their timings.
- ``GET /hub/api/gpulab/users/NAME/jobs/ID/log?offset=N[&follow=1]``: the job's output across its
  attempts from byte ``offset`` (``X-Gpulab-Log-Offset``: where the answer ends); ``follow=1``
  streams new output until the job has ended.
- ``DELETE /hub/api/gpulab/users/NAME/jobs/ID``: cancel (202): a queued job at once, a running
  one by stopping its servers.
- ``GET /hub/api/gpulab/admin/jobs[?state=S]``: every user's jobs (``admin:servers``).

Scope ``custom:gpulab:jobs`` filtered to the user (``!user=NAME``): each user holds it for
themself (log-in, tokens, their servers' tokens). A job of someone else, asked for under any
name, is the same 404 as a job that does not exist. None of the GETs start, stop or charge
anything.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from jupyterhub.scopes import needs_scope
from tornado import web
from tornado.iostream import StreamClosedError

from gpulab.hub_config.api.base import GpulabAPIHandler
from gpulab.hub_config.jobs.scheduler import JobScheduler
from gpulab.hub_config.overrides.errors import http_error
from gpulab.hub_config.scopes import JOBS_SCOPE
from gpulab.spawners.courses import student_courses
from gpulab.spawners.jobs.model import STATES, Job
from gpulab.spawners.jobs.spec import JobSpecError

NOT_FOUND = "No access to resources or resources not found"
# How often a followed log is read again, and the most one answer carries without follow.
FOLLOW_INTERVAL = 0.5
READ_MAX = 4 * 1024 * 1024


def job_json(job: Job, base: str) -> dict[str, Any]:
    out = job.to_api()
    out["log_url"] = f"{base}/users/{job.owner}/jobs/{job.id}/log"
    return out


class JobsBase(GpulabAPIHandler):
    @property
    def scheduler(self) -> JobScheduler:
        return JobScheduler.instance(config=self.settings["config"])

    @property
    def api_base(self) -> str:
        return self.hub.base_url.rstrip("/") + "/api/gpulab"

    def own_job(self, user_name: str, job_id: str) -> Job:
        """``user_name``'s job ``job_id``; anyone else's, or none, is the same 404."""
        store = self.scheduler.store
        job = store.get(int(job_id)) if store is not None and job_id.isdigit() else None
        if job is None or job.owner != user_name:
            raise web.HTTPError(404, NOT_FOUND)
        return job


class JobsHandler(JobsBase):
    @needs_scope(JOBS_SCOPE)
    def get(self, user_name: str) -> None:
        store = self.scheduler.store
        jobs = store.list(owner=user_name) if store is not None else []
        jobs.sort(key=lambda j: j.id, reverse=True)
        self.write(json.dumps({"jobs": [job_json(j, self.api_base) for j in jobs]}))

    @needs_scope(JOBS_SCOPE)
    def post(self, user_name: str) -> None:
        user = self.find_user(user_name)
        if user is None:
            raise web.HTTPError(404, NOT_FOUND)
        body = self.json_object_body()
        gangs = bool(getattr(self.settings.get("spawner_class"), "supports_gangs", False))
        try:
            job = self.scheduler.submit(
                user_name,
                body,
                admin=self.has_scope("admin:servers"),
                gangs=gangs,
                courses=student_courses(user),
            )
        except JobSpecError as e:  # 400 naming the field; 429 over the queue's limit
            raise http_error(e.status, str(e), e, field=e.field) from None
        self.set_status(201)
        self.write(json.dumps(job_json(job, self.api_base)))


class JobHandler(JobsBase):
    @needs_scope(JOBS_SCOPE)
    def get(self, user_name: str, job_id: str) -> None:
        self.write(json.dumps(job_json(self.own_job(user_name, job_id), self.api_base)))

    @needs_scope(JOBS_SCOPE)
    def delete(self, user_name: str, job_id: str) -> None:
        job = self.scheduler.cancel(self.own_job(user_name, job_id))
        self.set_status(202)
        self.write(json.dumps(job_json(job, self.api_base)))


class JobLogHandler(JobsBase):
    @needs_scope(JOBS_SCOPE)
    async def get(self, user_name: str, job_id: str) -> None:
        job = self.own_job(user_name, job_id)
        raw = self.get_argument("offset", "0")
        if not raw.isdigit():
            raise http_error(400, "offset: must be a whole number of bytes >= 0", field="offset")
        offset = int(raw)
        follow = self.get_argument("follow", "0")
        if follow not in ("0", "1"):
            raise http_error(400, "follow: must be 0 or 1", field="follow")
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.set_header("X-Content-Type-Options", "nosniff")
        scheduler = self.scheduler
        if follow == "0":
            data = await scheduler.output(job)
            chunk = data[offset : offset + READ_MAX]
            self.set_header("X-Gpulab-Log-Offset", str(offset + len(chunk)))
            self.set_header("X-Gpulab-Job-State", job.state)
            self.finish(chunk)
            return
        while True:
            done = scheduler.finished(job.id)  # read before the output: nothing is missed
            job = scheduler.store.get(job.id) or job
            data = await scheduler.output(job)
            if len(data) > offset:
                try:
                    self.write(data[offset:])
                    await self.flush()
                except StreamClosedError:
                    return
                offset = len(data)
            if done:
                break
            await asyncio.sleep(FOLLOW_INTERVAL)
        self.finish()


class AdminJobsHandler(JobsBase):
    @needs_scope("admin:servers")
    def get(self) -> None:
        state = self.get_argument("state", "")
        if state and state not in STATES:
            raise http_error(400, f"state: must be one of {', '.join(STATES)}", field="state")
        store = self.scheduler.store
        jobs = store.list(states=[state] if state else None) if store is not None else []
        jobs.sort(key=lambda j: j.id, reverse=True)
        self.write(json.dumps({"jobs": [job_json(j, self.api_base) for j in jobs]}))


ROUTES = [
    (r"/api/gpulab/users/([^/]+)/jobs", JobsHandler),
    (r"/api/gpulab/users/([^/]+)/jobs/([^/]+)", JobHandler),
    (r"/api/gpulab/users/([^/]+)/jobs/([^/]+)/log", JobLogHandler),
    (r"/api/gpulab/admin/jobs", AdminJobsHandler),
]
