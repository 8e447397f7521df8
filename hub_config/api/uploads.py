"""Uploading data into one's home through the hub: no server running, no GPU held.

A tus-like protocol under ``/hub/api/users/NAME/uploads`` (the disk side is
:mod:`gpulab.spawners.storage.uploads`):

- ``POST .../uploads`` ``{"path": "data/faces.zip", "size": N}`` -> 201 ``{"id", "offset": 0,
  ...}``. 400 naming ``path`` (absolute, ``..``, empty parts, control characters) or ``size``;
  409 naming ``path`` when a link, a file or another filesystem is in the way; 413 naming
  ``size`` when the home's usage, the unfinished uploads and ``size`` exceed the quota, checked
  before a byte is sent. ``GET .../uploads`` lists the unfinished ones (a page resumes them).
- ``PATCH .../uploads/ID`` with ``Upload-Offset: K`` and a chunk body (streamed to disk, at most
  ``UploadStore.max_chunk_bytes``) -> ``{"offset"}``; the chunk that completes it puts the file
  at its path in the home, owned by the home's owner (``"complete": true``). A chunk at the
  wrong offset, or while another chunk is being written: 409 with the right offset (JSON
  ``offset`` and header ``Upload-Offset``); a chunk past the declared size: 400. A connection
  dropped mid-chunk leaves the offset at what was written. A last chunk refused at the end (413:
  no room in the home; 409: the destination changed) keeps its bytes but does not extend the
  upload's expiry, so a pending upload cannot be kept alive by resending its end.
- ``HEAD``/``GET .../uploads/ID``: the offset (header ``Upload-Offset``; JSON for GET);
  ``DELETE``: cancel it (its reservation goes).
- ``/hub/upload``: the page (``templates/upload.html``, ``gpulab-upload.js``) that does all this
  with a progress bar per file and resumes after a dropped connection.

Who may: whoever may act fully as the user, i.e. holds ``tokens`` on them: the user's log-in
session (with the XSRF token) and their own full tokens, and admins. A server's own token does
not (it holds no ``tokens`` scope: code in a server writes the home directly and needs no hub
upload, and course staff who reach a student's server could read that token), nor do course staff.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from pathlib import Path
from typing import Any

from jupyterhub.handlers.base import BaseHandler
from jupyterhub.scopes import needs_scope
from tornado import web

from gpulab.hub_config.api.base import GpulabAPIHandler
from gpulab.spawners.local import accounts
from gpulab.spawners.mixin import SpawnError
from gpulab.spawners.node.pool import GpuPool
from gpulab.spawners.storage.homes import home_name
from gpulab.spawners.storage.uploads import UploadError, UploadStore

# The scope an upload needs on its user: acting fully as them (see the module's docstring).
UPLOAD_SCOPE = "tokens"
PAGE_CHUNK_BYTES = 8 * 2**20  # what the page sends per PATCH (smaller than the hub's maximum)

# The PATCH writing each upload now (one at a time: a second one gets 409 with the offset).
_writers: dict[str, UploadAPIHandler] = {}
_releasing: set[asyncio.Future] = set()  # releases waiting for a chunk's last write


def uploads_of(pool: GpuPool) -> UploadStore:
    """The hub's one upload store (kept on its pool, configured from the hub's config)."""
    store = getattr(pool, "_gpulab_uploads", None)
    if store is None:
        store = UploadStore(pool.data_dir, pool.homes, parent=pool)
        pool._gpulab_uploads = store
    return store


def home_owner(spawner: Any, home: Path) -> tuple[int, int] | None:
    """Who owns files in this user's home (blocking: may create the user's Unix account):
    a root hub's local account, else the home's present owner, else a container's numeric
    user; None for the hub's own user (servers run as the hub)."""
    if getattr(spawner, "user_accounts", False) and hasattr(spawner, "account_name"):
        account = accounts.ensure_account(spawner.account_name, home)
        adopt = getattr(spawner, "adopt_legacy_home", None)
        if adopt is not None:
            # A home under the user's old-rule name is adopted before an upload makes an empty
            # one under the new name (and one owned by another account is refused, 409).
            adopt(home.name, account)
        return account.uid, account.gid
    try:
        st = os.stat(home, follow_symlinks=False)
        if st.st_uid != 0:
            return st.st_uid, st.st_gid
    except FileNotFoundError:
        pass
    uid, _, gid = str(getattr(spawner, "container_user", "") or "").partition(":")
    if uid.isdigit() and int(uid) != 0:
        return int(uid), int(gid) if gid.isdigit() else int(uid)
    return None


def datasets_bytes(pool: GpuPool, user_name: str) -> int:
    """What the user's published datasets count against their quota (blocking)."""
    store = getattr(pool, "datasets", None)
    return store.datasets_bytes(user_name) if store is not None else 0


class Refusal(web.HTTPError):
    """An upload request refused: JSON with ``message``, ``field`` and, where the client must
    know it, ``offset`` (also the ``Upload-Offset`` header)."""

    def __init__(self, status: int, message: str, field: str, offset: int | None = None):
        super().__init__(status, log_message=message.replace("%", "%%"))
        self.field = field
        self.upload_offset = offset


def refusal(e: UploadError) -> Refusal:
    return Refusal(e.status, str(e), e.field, e.offset)


class _UploadsBase(GpulabAPIHandler):
    @property
    def store(self) -> UploadStore:
        return uploads_of(self.pool)

    def user_or_404(self, user_name: str) -> Any:
        user = self.find_user(user_name)
        if user is None:
            raise web.HTTPError(404, f"No such user: {user_name}")
        return user

    async def owner_of(self, user: Any) -> tuple[int, int] | None:
        home = self.pool.homes.path(home_name(user.name))
        try:
            return await asyncio.to_thread(home_owner, user.spawner, home)
        except accounts.AccountError as e:
            raise web.HTTPError(500, f"Could not make your Unix account: {e}") from None
        except SpawnError as e:
            raise Refusal(e.status_code, e.jupyterhub_message, "path") from None

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        if getattr(self, "_unread", False):
            self.set_header("Connection", "close")
        exc = (kwargs.get("exc_info") or (None, None, None))[1]
        if not isinstance(exc, Refusal):
            super().write_error(status_code, **kwargs)
            return
        self.set_header("Content-Type", "application/json")
        if exc.upload_offset is not None:
            self.set_header("Upload-Offset", str(exc.upload_offset))
        body: dict[str, Any] = {
            "status": status_code,
            "message": exc.log_message % exc.args if exc.log_message else "",
            "field": exc.field,
        }
        if exc.upload_offset is not None:
            body["offset"] = exc.upload_offset
        self.finish(json.dumps(body))


class UploadsAPIHandler(_UploadsBase):
    """``/api/users/NAME/uploads``: start an upload (POST), list the unfinished ones (GET)."""

    @needs_scope(UPLOAD_SCOPE)
    async def get(self, user_name: str) -> None:
        self.user_or_404(user_name)
        store = self.store

        def listing() -> list[dict[str, Any]]:
            return [store.describe(u) for u in store.list(home_name(user_name)) if not u.complete]

        self.write(json.dumps({"uploads": await asyncio.to_thread(listing)}))

    @needs_scope(UPLOAD_SCOPE)
    async def post(self, user_name: str) -> None:
        user = self.user_or_404(user_name)
        body = self.json_object_body()
        unknown = sorted(set(body) - {"path", "size"})
        if unknown:
            raise Refusal(400, f"{unknown[0]}: unknown field; allowed: path, size", unknown[0])
        owner = await self.owner_of(user)
        store = self.store
        held = await asyncio.to_thread(datasets_bytes, self.pool, user.name)
        try:
            upload = await asyncio.to_thread(
                store.create, home_name(user.name), body.get("path"), body.get("size"), owner, held
            )
            if upload.size == 0:  # nothing to send: it is complete now
                upload = await asyncio.to_thread(store.finish, upload, owner, held)
            described = await asyncio.to_thread(store.describe, upload)
        except UploadError as e:
            raise refusal(e) from None
        self.set_status(201)
        self.set_header("Upload-Offset", str(described["offset"]))
        self.set_header("Location", self.request.path.rstrip("/") + "/" + upload.id)
        self.write(json.dumps(described))


@web.stream_request_body
class UploadAPIHandler(_UploadsBase):
    """``/api/users/NAME/uploads/ID``: its offset (HEAD, GET), a chunk (PATCH), cancel (DELETE).

    A PATCH body is streamed to the pending file as it arrives; the caller is checked, the
    offset and length validated and the upload claimed in ``prepare``, before any body is read.
    """

    _fd: int | None = None
    _held: str | None = None
    _pos = 0
    _error: Exception | None = None
    _inflight: asyncio.Future | None = None
    _last_write = 0.0  # the upload's last write before this chunk (kept if its end is refused)
    last_progress = 0.0  # monotonic time this chunk last received bytes

    _refused: web.HTTPError | None = None

    _unread = False  # refused without reading the body: the connection is not reused

    async def prepare(self) -> None:
        if self.request.method != "PATCH":
            await super().prepare()
            return
        try:
            await super().prepare()  # who asks, and the XSRF token of a cookie
            user_name, upload_id = self.path_args
            if not self.has_scope(f"{UPLOAD_SCOPE}!user={user_name}"):
                raise web.HTTPError(403, f"You may not upload into {user_name}'s home")
            self.user_or_404(user_name)
            await self._claim(user_name, upload_id)
        except web.HTTPError as e:
            # A refused chunk is answered once its body is read (and dropped): a browser or
            # proxy still sending it gets the answer, and the proxy's kept-alive connection to
            # the hub stays usable. A body far over the maximum is not read; that answer says
            # "Connection: close".
            raw = self.request.headers.get("Content-Length", "")
            length = int(raw) if raw.isascii() and raw.isdigit() else -1
            if not 0 <= length <= 2 * self.store.max_chunk_bytes:
                self._unread = True
                raise
            self._refused = e
            self.request.connection.set_max_body_size(length)

    async def _claim(self, user_name: str, upload_id: str) -> None:
        """Check the chunk's offset and length and make this request the upload's one writer."""
        store = self.store
        upload = await asyncio.to_thread(store.get, home_name(user_name), upload_id)
        if upload is None:
            raise web.HTTPError(404, f"No such upload: {upload_id} (finished long ago or expired)")
        self.upload = upload
        at = self._header_int("Upload-Offset", "the offset this chunk starts at")
        length = self._header_int("Content-Length", "the chunk's length in bytes", status=411)
        if length > store.max_chunk_bytes:
            raise Refusal(
                413,
                f"Content-Length: a chunk holds at most {store.max_chunk_bytes} bytes; got {length}",
                "Content-Length",
            )
        if at + length > upload.size:
            raise Refusal(
                400,
                f"Content-Length: this chunk ends at byte {at + length}, past the upload's "
                f"declared size {upload.size}",
                "Content-Length",
            )
        holder = _writers.get(upload.id)
        if holder is not None:
            if time.monotonic() - holder.last_progress > store.stale_seconds:
                # Its client went silent (a dead connection the hub never heard close): end it,
                # so that this client's next try, after the release, gets in.
                self.log.info("Upload %s: a silent chunk is ended for a new one", upload.id)
                holder.request.connection.close()
            offset = await asyncio.to_thread(store.offset, upload)
            raise Refusal(
                409,
                "Upload-Offset: another chunk of this upload is being written; ask the offset "
                "(HEAD) and send from there",
                "Upload-Offset",
                offset,
            )
        _writers[upload.id] = self  # claimed: from here on, released in on_finish
        self.last_progress = time.monotonic()
        self._held = upload.id
        offset = await asyncio.to_thread(store.offset, upload)
        if upload.complete or at != offset:
            raise Refusal(
                409,
                f"Upload-Offset: the upload is at byte {offset}, not {at}"
                + (" (complete)" if upload.complete else ""),
                "Upload-Offset",
                offset,
            )
        self._last_write = await asyncio.to_thread(store.last_write, upload)
        self._fd = await asyncio.to_thread(store.open_data, upload)
        self._pos = at
        self.request.connection.set_max_body_size(length)

    def _header_int(self, name: str, what: str, status: int = 400) -> int:
        raw = self.request.headers.get(name, "")
        if not raw.isascii() or not raw.isdigit():
            raise Refusal(status, f"{name} is required: {what} (a whole number)", name)
        return int(raw)

    async def data_received(self, chunk: bytes) -> None:
        if self._fd is None or self._error is not None:
            return
        at = self._pos
        self.last_progress = time.monotonic()
        self._inflight = asyncio.ensure_future(asyncio.to_thread(_pwrite_all, self._fd, chunk, at))
        try:
            await self._inflight
            self._pos = at + len(chunk)
        except OSError as e:
            self._error = e

    async def patch(self, user_name: str, upload_id: str) -> None:
        if self._refused is not None:
            raise self._refused
        store = self.store
        upload = self.upload
        fd, self._fd = self._fd, None
        await asyncio.to_thread(_sync_close, fd)
        if self._error is not None:
            offset = await asyncio.to_thread(store.offset, upload)
            raise Refusal(
                507, f"The hub could not store this chunk: {self._error}", "Upload-Offset", offset
            )
        out: dict[str, Any] = {"offset": self._pos, "complete": False}
        if self._pos == upload.size:
            user = self.user_or_404(user_name)
            owner = await self.owner_of(user)
            held = await asyncio.to_thread(datasets_bytes, self.pool, user.name)
            try:
                done = await asyncio.to_thread(store.finish, upload, owner, held)
            except UploadError as e:
                await asyncio.to_thread(store.keep_expiry, upload, self._last_write)
                raise refusal(e) from None
            out = {"offset": done.size, "complete": True, "path": done.path}
        self.set_header("Upload-Offset", str(out["offset"]))
        self.write(json.dumps(out))

    @needs_scope(UPLOAD_SCOPE)
    async def head(self, user_name: str, upload_id: str) -> None:
        info = await self._describe(user_name, upload_id)
        self.set_header("Upload-Offset", str(info["offset"]))
        self.set_header("Upload-Length", str(info["size"]))
        self.set_header("Cache-Control", "no-store")

    @needs_scope(UPLOAD_SCOPE)
    async def get(self, user_name: str, upload_id: str) -> None:
        info = await self._describe(user_name, upload_id)
        self.set_header("Upload-Offset", str(info["offset"]))
        self.set_header("Cache-Control", "no-store")
        self.write(json.dumps(info))

    @needs_scope(UPLOAD_SCOPE)
    async def delete(self, user_name: str, upload_id: str) -> None:
        self.user_or_404(user_name)
        store = self.store
        upload = await asyncio.to_thread(store.get, home_name(user_name), upload_id)
        if upload is None:
            raise web.HTTPError(404, f"No such upload: {upload_id}")
        if upload.id in _writers:
            raise Refusal(409, "id: a chunk of this upload is being written", "id")
        await asyncio.to_thread(store.remove, upload)
        self.set_status(204)

    async def _describe(self, user_name: str, upload_id: str) -> dict[str, Any]:
        self.user_or_404(user_name)
        store = self.store

        def look() -> dict[str, Any] | None:
            upload = store.get(home_name(user_name), upload_id)
            return store.describe(upload) if upload is not None else None

        info = await asyncio.to_thread(look)
        if info is None:
            raise web.HTTPError(404, f"No such upload: {upload_id} (finished long ago or expired)")
        return info

    def on_connection_close(self) -> None:
        super().on_connection_close()
        self._release()

    def on_finish(self) -> None:
        self._release()

    def _release(self) -> None:
        """Let the next chunk in once what this one was writing has landed."""
        held, self._held = self._held, None
        if held is None:
            return
        fd, self._fd = self._fd, None
        inflight = self._inflight

        async def later() -> None:
            try:
                if inflight is not None:
                    await asyncio.wait([inflight])
                if fd is not None:
                    await asyncio.to_thread(_sync_close, fd)
            finally:
                if _writers.get(held) is self:
                    del _writers[held]

        task = asyncio.ensure_future(later())
        _releasing.add(task)
        task.add_done_callback(_releasing.discard)


def _pwrite_all(fd: int, data: bytes, at: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, at)
        view, at = view[n:], at + n


def _sync_close(fd: int | None) -> None:
    if fd is None:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class UploadPage(BaseHandler):
    """``/hub/upload``: choose files and a folder of the home; each file is uploaded in chunks
    through the API above, with its progress, speed and time left, and resumes after a drop."""

    @web.authenticated
    async def get(self) -> None:
        store = uploads_of(GpuPool.instance(config=self.settings["config"]))
        html = await self.render_template(
            "upload.html",
            chunk_bytes=min(PAGE_CHUNK_BYTES, store.max_chunk_bytes),
            expire_text=_period(store.expire_seconds),
        )
        self.finish(html)


def _period(seconds: float) -> str:
    """``a day``, ``3 hours``, ``20 s``: how long an unfinished upload is kept, for people."""
    if seconds == 86400:
        return "a day"
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            n = round(seconds / size)
            return f"{n} {unit}{'s' if n != 1 else ''}"
    return f"{round(seconds)} s"


# ---- the sweep of expired uploads ----------------------------------------------------------


def start_sweeping(pool: GpuPool, log: Any) -> asyncio.Task:
    """Remove expired uploads every ``sweep_seconds`` (jittered); idempotent."""
    task = getattr(pool, "_gpulab_upload_sweep", None)
    if task is not None and not task.done():
        return task
    store = uploads_of(pool)

    async def loop() -> None:
        while True:
            try:
                gone = await asyncio.to_thread(store.sweep, None, set(_writers))
                for upload in gone:
                    log.info(
                        "Upload %s of %s to %s expired: removed",
                        upload.id,
                        upload.user,
                        upload.path,
                    )
            except Exception:
                log.exception("Sweeping expired uploads failed")
            await asyncio.sleep(store.sweep_seconds * (1 + random.random() / 10))

    pool._gpulab_upload_sweep = asyncio.ensure_future(loop())
    return pool._gpulab_upload_sweep


_ID = r"([0-9a-f]{32})"
ROUTES = [
    (r"/api/users/([^/]+)/uploads/?", UploadsAPIHandler),
    (rf"/api/users/([^/]+)/uploads/{_ID}/?", UploadAPIHandler),
    (r"/upload/?", UploadPage),
]
