"""LTI 1.3 launches from an LMS (Moodle, Canvas, ...): hub users and course membership.

gpulab is the LTI *tool*, the LMS the *platform*. A launch is OpenID Connect's implicit flow
(jupyterhub-ltiauthenticator's handlers, subclassed here):

1. **login initiation**: the platform sends the browser to ``/hub/lti13/login`` with ``iss``,
   ``login_hint``, ``target_link_uri`` (and ``client_id``, ``lti_deployment_id``). The hub checks
   the issuer, client id and deployment, keeps a state and a nonce in encrypted cookies and sends
   the browser to the platform's ``authorize_url``;
2. **launch**: the platform posts a signed ``id_token`` and the state to ``/hub/lti13/launch``.
   The hub checks the state, the signature (against the platform's JWKS), issuer, audience,
   expiry, age, nonce, deployment and message type, in that order. Each id_token's nonce is
   accepted once (a used-nonce table in the hub's database, kept for ``max_age``, so across a
   restart too): a captured launch posted again is refused. A launch whose roles hold no course
   role gpulab knows (Learner, Instructor, TeachingAssistant) is refused (403, ``roles``).
   Anything wrong answers 4xx naming the field, and nothing changes: no user, no course, no
   membership;
3. the person is logged in under a readable username (:func:`username_candidates`; the same LMS
   person always gets the same hub user) and added to the course of the launch's context
   (:func:`course_slug`) with the role the LMS gives them (:func:`course_role`), through
   :mod:`gpulab.hub_config.courses.groups` as a roster import would. Membership only grows: a
   launch from course B keeps the person's other courses.

Which LMS person is which hub user, and which LMS context is which course, is kept in two small
tables of the hub's own database (``gpulab_lti_users``: issuer + ``sub`` -> username,
``gpulab_lti_courses``: issuer + context id -> course), created at the first start with LTI
configured, beside a third (``gpulab_lti_nonces``: the nonces used within ``max_age``). They survive restarts and work with any hub database (SQLite, PostgreSQL, MySQL);
``auth_state`` would need encryption keys, and group properties would not hold users. A name held
there cannot be signed up for with a password (:meth:`GpulabLTI.name_is_linked`).

Without ``GpulabLTI.issuer`` nothing of this is mounted or created.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import jwt
from jupyterhub import orm
from jupyterhub.utils import get_browser_protocol, url_path_join
from ltiauthenticator.lti13.handlers import (
    LTI13CallbackHandler,
    LTI13LoginInitHandler,
    _deserialize_state,
    _serialize_state,
    get_nonce,
)
from ltiauthenticator.utils import convert_request_to_dict
from sqlalchemy import Integer, Unicode, UniqueConstraint, inspect
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from tornado import web
from tornado.httputil import url_concat
from traitlets import Int, List, Set
from traitlets import Unicode as UnicodeTrait
from traitlets.config import LoggingConfigurable

from gpulab.catalog import settings
from gpulab.hub_config.courses import groups
from gpulab.hub_config.courses.lti_claims import (
    CONTEXT_CLAIM,
    COURSE_MAX,
    DEPLOYMENT_CLAIM,
    LAUNCH_PATH,
    LOGIN_PATH,
    MESSAGE_TYPE_CLAIM,
    RESOURCE_LINK_CLAIM,
    ROLES_CLAIM,
    USERNAME_MAX,
    VERSION_CLAIM,
    course_role,
    course_slug,
    pick_name,
    stable_suffix,
    username_candidates,
)
from gpulab.spawners.courses import Course

# ---- the durable links, in the hub's database --------------------------------------------------


class _Base(DeclarativeBase):
    pass


class LTIUser(_Base):
    """One LMS person (issuer + sub) and the hub user they are."""

    __tablename__ = "gpulab_lti_users"
    __table_args__ = (UniqueConstraint("issuer", "subject"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    issuer: Mapped[str] = mapped_column(Unicode(255))
    subject: Mapped[str] = mapped_column(Unicode(255))
    username: Mapped[str] = mapped_column(Unicode(255), unique=True)


class LTICourse(_Base):
    """One LMS context (issuer + context id) and the course it is."""

    __tablename__ = "gpulab_lti_courses"
    __table_args__ = (UniqueConstraint("issuer", "context_id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    issuer: Mapped[str] = mapped_column(Unicode(255))
    context_id: Mapped[str] = mapped_column(Unicode(255))
    course: Mapped[str] = mapped_column(Unicode(255), unique=True)


class LTINonce(_Base):
    """A nonce an accepted id_token carried (as a SHA-256), until its token could not be accepted
    anyway (``expires``: its ``iat`` plus ``max_age`` and the leeway)."""

    __tablename__ = "gpulab_lti_nonces"
    __table_args__ = (UniqueConstraint("issuer", "nonce"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    issuer: Mapped[str] = mapped_column(Unicode(255))
    nonce: Mapped[str] = mapped_column(Unicode(64))
    expires: Mapped[int] = mapped_column(Integer, index=True)


def use_nonce(db: Any, issuer: str, nonce: str, expires: float, now: float) -> bool:
    """Record ``nonce`` as used (committed); False when it was used already. Nonces past their
    ``expires`` are pruned first (their tokens are refused for age anyway)."""
    db.query(LTINonce).filter(LTINonce.expires < int(now)).delete(synchronize_session=False)
    digest = hashlib.sha256(nonce.encode()).hexdigest()
    db.add(LTINonce(issuer=issuer, nonce=digest, expires=int(expires) + 1))
    try:
        db.commit()
    except IntegrityError:
        db.rollback()
        return False
    return True


def create_tables(db: Any) -> None:
    _Base.metadata.create_all(db.get_bind(), checkfirst=True)


def _has_tables(db: Any) -> bool:
    return inspect(db.get_bind()).has_table(LTIUser.__tablename__)


def username_for(
    db: Any, issuer: str, claims: Mapping[str, Any], taken: Callable[[str], bool]
) -> str:
    """The hub username of the launch's person, linked (and committed) on their first launch.

    ``taken(name)`` says whether a name is someone else's (an existing hub user, a sign-up, an
    admin name); a name linked to another LMS person is taken too. A clash adds a short suffix
    that is stable for this person (``ada`` -> ``ada-3f9c1e``); with no usable claim the name is
    ``user-HASH``."""
    sub = str(claims["sub"])
    link = db.query(LTIUser).filter_by(issuer=issuer, subject=sub).one_or_none()
    if link is not None:
        return link.username
    key = f"{issuer}\n{sub}"
    candidates = username_candidates(claims)
    base = candidates[0] if candidates else f"user-{stable_suffix(key, 8)}"

    def busy(name: str) -> bool:
        return taken(name) or db.query(LTIUser).filter_by(username=name).first() is not None

    name = pick_name(base, key, USERNAME_MAX, busy)
    db.add(LTIUser(issuer=issuer, subject=sub, username=name))
    db.commit()
    return name


def course_for(
    db: Any, issuer: str, context: Mapping[str, Any], make_user: groups.MakeUser
) -> tuple[Any, Course]:
    """The course of an LMS context: found by its link, else created (its name from the label,
    with a stable suffix when another group has it; display name from the title; no staff)."""
    context_id = str(context["id"])
    link = db.query(LTICourse).filter_by(issuer=issuer, context_id=context_id).one_or_none()
    title = next(
        (v for v in (context.get("title"), context.get("label")) if isinstance(v, str) and v), ""
    )
    if link is None:
        key = f"{issuer}\n{context_id}"
        base = course_slug(context.get("label"), context.get("title"))
        if not base:
            name = f"course-{stable_suffix(key)}"
        else:

            def busy(n: str) -> bool:
                return (
                    orm.Group.find(db, n) is not None
                    or db.query(LTICourse).filter_by(course=n).first() is not None
                )

            name = pick_name(base, key, COURSE_MAX, busy)
        db.add(LTICourse(issuer=issuer, context_id=context_id, course=name))
        db.commit()
    else:
        name = link.course
    found = groups.find(db, name)
    if found is not None:
        return found
    course = Course(name=name, display_name=title or name)
    try:
        group = groups.save(db, course, make_user, create=True)
    except groups.CourseError as e:
        # The linked name is now a plain group somebody else made.
        raise LTIError(409, "context", str(e)) from None
    return group, course


def current_role(group: Any, course: Course, name: str) -> str | None:
    role = course.staff_role(name)
    if role is None and name in groups.students(group):
        return "student"
    return role


# ---- configuration -----------------------------------------------------------------------------


class LTIError(web.HTTPError):
    """A launch refused: HTTP ``status`` and a message that starts with the field it is about."""

    def __init__(self, status: int, field: str, message: str) -> None:
        super().__init__(status, "%s", f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class CoursePlan:
    """What a checked launch will do to courses: its context and the person's role there."""

    context: Mapping[str, Any]
    role: str | None


# The GPULAB_LTI_* variables (declared in gpulab.catalog.settings) -> GpulabLTI traits.
ENV = {
    s.name: s.traitlets[0].split(".", 1)[1]
    for s in settings.TABLE
    if s.traitlets and s.traitlets[0].startswith("GpulabLTI.")
}


def configure_from_env(c: Any, env: Mapping[str, str]) -> None:
    """``GPULAB_LTI_*`` variables (lists comma-separated) into ``c.GpulabLTI``; unset: nothing."""
    for var, trait in ENV.items():
        value = settings.get(var, env)
        if value:
            setattr(c.GpulabLTI, trait, set(value) if isinstance(value, tuple) else value)


class GpulabLTI(LoggingConfigurable):
    """LTI 1.3 launches from one LMS (the platform), beside the hub's password log-in.

    Configure the values the LMS shows when gpulab is registered as a tool (docs/lti.md), in a
    hub config (``c.GpulabLTI.issuer = ...``) or as ``GPULAB_LTI_*`` variables. Unset ``issuer``:
    LTI is off and nothing is mounted.
    """

    issuer = UnicodeTrait(
        "",
        config=True,
        help="""The platform's issuer (``iss``), exactly as the LMS sends it, e.g.
        ``https://moodle.example.edu`` or ``https://canvas.instructure.com``. Empty: LTI is off.""",
    )
    client_ids = Set(
        UnicodeTrait(),
        config=True,
        help="""The client ids the LMS gave this tool; an id_token's audience must be one.""",
    )
    authorize_url = UnicodeTrait(
        "",
        config=True,
        help="""The platform's OIDC authentication request URL, where the hub sends the browser
        after login initiation (Moodle: ``/mod/lti/auth.php``; Canvas:
        ``https://sso.canvaslms.com/api/lti/authorize_redirect``).""",
    )
    jwks_endpoint = UnicodeTrait(
        "",
        config=True,
        help="""The platform's public key set URL (JWKS) that id_tokens are checked against
        (Moodle: ``/mod/lti/certs.php``; Canvas: ``https://sso.canvaslms.com/api/lti/security/jwks``).""",
    )
    deployment_ids = Set(
        UnicodeTrait(),
        config=True,
        help="""The deployment ids of this tool in the LMS. A launch from another deployment is
        refused (403). Empty: any deployment of the client ids (logged as a warning at start).""",
    )
    algorithms = List(
        UnicodeTrait(),
        default_value=["RS256"],
        config=True,
        help="""Signature algorithms accepted for id_tokens (LTI 1.3 uses RS256).""",
    )
    leeway = Int(
        30,
        config=True,
        help="""Seconds of clock difference allowed between the LMS and the hub when checking an
        id_token's ``exp``, ``iat`` and ``nbf``.""",
    )
    max_age = Int(
        600,
        config=True,
        help="""Seconds a launch may take: an id_token issued longer ago, or a login initiation
        (its state cookie) started longer ago, is refused.""",
    )

    _jwks_client: Any = None

    @property
    def enabled(self) -> bool:
        return bool(self.issuer)

    def check(self) -> None:
        """At start: LTI configured by halves is an error naming what is missing."""
        if not self.enabled:
            return
        missing = [
            name
            for name in ("client_ids", "authorize_url", "jwks_endpoint")
            if not getattr(self, name)
        ]
        if missing:
            raise ValueError(
                f"GpulabLTI.issuer is set ({self.issuer!r}) but {', '.join('GpulabLTI.' + m for m in missing)} "
                "is not: set all of issuer, client_ids, authorize_url, jwks_endpoint (docs/lti.md)"
            )
        if not self.deployment_ids:
            self.log.warning(
                "GpulabLTI.deployment_ids is empty: launches from any deployment of client ids %s "
                "are accepted",
                sorted(self.client_ids),
            )

    def handlers(self, db: Any) -> list[tuple[str, type]]:
        """The routes (under /hub), creating the link tables on first use."""
        create_tables(db)
        self.log.info(
            "LTI 1.3 launches from %s (client ids %s) at /hub%s and /hub%s",
            self.issuer,
            sorted(self.client_ids),
            LOGIN_PATH,
            LAUNCH_PATH,
        )
        return [(LOGIN_PATH, LTILoginHandler), (LAUNCH_PATH, LTILaunchHandler)]

    def name_is_linked(self, db: Any, name: str) -> bool:
        """Whether ``name`` belongs to an LMS person (so no password sign-up may take it)."""
        return _has_tables(db) and db.query(LTIUser).filter_by(username=name).first() is not None

    # ---- the id_token --------------------------------------------------------------------------

    @property
    def jwks_client(self) -> jwt.PyJWKClient:
        if self._jwks_client is None or self._jwks_client.uri != self.jwks_endpoint:
            self._jwks_client = jwt.PyJWKClient(self.jwks_endpoint, lifespan=300, timeout=10)
        return self._jwks_client

    def _signing_key(self, encoded: str) -> Any:
        try:
            header = jwt.get_unverified_header(encoded)
        except jwt.PyJWTError as e:
            raise LTIError(400, "id_token", f"not a signed JWT ({e})") from None
        kid = header.get("kid")
        try:
            if kid:
                return self.jwks_client.get_signing_key(kid).key
            keys = self.jwks_client.get_signing_keys()
        except jwt.PyJWKClientConnectionError as e:
            raise LTIError(
                502,
                "jwks_endpoint",
                f"the platform's keys could not be fetched from {self.jwks_endpoint}: {e}",
            ) from None
        except jwt.PyJWKClientError:
            raise LTIError(
                401,
                "id_token",
                f"bad signature: signed with key id {kid!r}, which is not in the platform's "
                f"key set ({self.jwks_endpoint})",
            ) from None
        if len(keys) != 1:
            raise LTIError(
                401,
                "id_token",
                f"no key id (kid) in its header, and the platform has {len(keys)} keys",
            )
        return keys[0].key

    def verify(self, encoded: str) -> dict[str, Any]:
        """The claims of an id_token whose signature, issuer, audience and times are good;
        else :class:`LTIError` naming what is wrong. Blocking (fetches the JWKS): run in a thread."""
        try:
            unverified = jwt.decode(encoded, options={"verify_signature": False})
        except jwt.PyJWTError as e:
            raise LTIError(400, "id_token", f"not a valid JWT ({e})") from None
        key = self._signing_key(encoded)
        try:
            claims = jwt.decode(
                encoded,
                key,
                algorithms=self.algorithms,
                audience=sorted(self.client_ids),
                issuer=self.issuer,
                leeway=self.leeway,
                options={"require": ["iss", "aud", "exp", "iat", "sub", "nonce"]},
            )
        except jwt.InvalidSignatureError:
            raise LTIError(
                401,
                "id_token",
                f"bad signature: not signed by the platform's key ({self.jwks_endpoint})",
            ) from None
        except jwt.ExpiredSignatureError:
            raise LTIError(
                401,
                "id_token",
                f"expired at {unverified.get('exp')} (now {int(time.time())}): launch again from the LMS",
            ) from None
        except jwt.InvalidIssuerError:
            raise LTIError(
                401,
                "iss",
                f"unknown issuer {unverified.get('iss')!r}: this hub accepts launches from {self.issuer!r} only",
            ) from None
        except jwt.InvalidAudienceError:
            raise LTIError(
                401,
                "aud",
                f"unknown client id {unverified.get('aud')!r}: not one of this hub's client ids",
            ) from None
        except jwt.MissingRequiredClaimError as e:
            raise LTIError(400, "id_token", f"missing claim {e.claim!r}") from None
        except jwt.ImmatureSignatureError:
            raise LTIError(
                401, "id_token", "not valid yet (iat/nbf in the future): check the clocks"
            ) from None
        except jwt.InvalidAlgorithmError:
            raise LTIError(
                401,
                "id_token",
                f"signature algorithm not allowed; allowed: {', '.join(self.algorithms)}",
            ) from None
        except jwt.PyJWTError as e:
            raise LTIError(401, "id_token", str(e)) from None
        if claims["iat"] < time.time() - self.max_age - self.leeway:
            raise LTIError(
                401, "id_token", f"issued more than {self.max_age} s ago: launch again from the LMS"
            )
        aud = claims["aud"]
        if isinstance(aud, list) and len(aud) > 1 and claims.get("azp") not in self.client_ids:
            raise LTIError(401, "azp", f"{claims.get('azp')!r} is not one of this hub's client ids")
        return claims

    def check_claims(self, claims: Mapping[str, Any]) -> CoursePlan | None:
        """The LTI claims of a verified id_token; what the launch does to courses (None: no
        context). Raise :class:`LTIError` naming the claim."""
        if claims.get(VERSION_CLAIM) != "1.3.0":
            raise LTIError(400, "version", f"{claims.get(VERSION_CLAIM)!r}; expected '1.3.0'")
        deployment = claims.get(DEPLOYMENT_CLAIM)
        if not isinstance(deployment, str) or not deployment:
            raise LTIError(400, "deployment_id", "missing")
        if self.deployment_ids and deployment not in self.deployment_ids:
            raise LTIError(
                403,
                "deployment_id",
                f"unknown deployment {deployment!r}: not one of this hub's deployments",
            )
        message_type = claims.get(MESSAGE_TYPE_CLAIM)
        if message_type != "LtiResourceLinkRequest":
            raise LTIError(
                400,
                "message_type",
                f"{message_type!r} is not supported; add gpulab to the course as a link "
                "(LtiResourceLinkRequest)",
            )
        link = claims.get(RESOURCE_LINK_CLAIM)
        if not isinstance(link, dict) or not link.get("id"):
            raise LTIError(400, "resource_link", "missing its id")
        if not str(claims.get("sub") or ""):
            raise LTIError(400, "sub", "missing: anonymous launches are not supported")
        roles = claims.get(ROLES_CLAIM)
        if not isinstance(roles, list):
            raise LTIError(400, "roles", "missing or not a list")
        role = course_role(roles)
        if role is None:
            # Nothing is made for a launch gpulab has no role for: no user, no course.
            shown = ", ".join(str(r) for r in roles[:5]) or "none"
            raise LTIError(
                403,
                "roles",
                f"no course role gpulab knows in the launch's roles ({shown}); allowed: Learner "
                "(student), Instructor (teacher), Instructor#TeachingAssistant (ta). Ask the "
                "course's teacher to enrol you in the LMS",
            )
        context = claims.get(CONTEXT_CLAIM)
        if context is None:
            return None
        if not isinstance(context, dict) or not context.get("id"):
            raise LTIError(400, "context", "the context claim has no id")
        return CoursePlan(context=context, role=role)

    def spend_nonce(self, db: Any, claims: Mapping[str, Any]) -> None:
        """Accept the id_token's nonce once: raise :class:`LTIError` (401) for a used one."""
        now = time.time()
        expires = float(claims["iat"]) + self.max_age + self.leeway
        if not use_nonce(db, self.issuer, str(claims["nonce"]), expires, now):
            raise LTIError(
                401,
                "nonce",
                "this id_token was used already (each launch is accepted once): launch again "
                "from the LMS",
            )

    # ---- what a good launch does -----------------------------------------------------------------

    def authenticate(
        self, handler: Any, claims: Mapping[str, Any], taken: Callable[[str], bool]
    ) -> dict:
        """The auth model of a checked launch: its person's (linked) hub username."""
        name = username_for(handler.db, self.issuer, claims, taken)
        return {"name": name}

    def join_course(self, db: Any, name: str, plan: CoursePlan, make_user: groups.MakeUser) -> None:
        """Add ``name`` to the launch's course with its role (creating the course if new); other
        courses stay as they are."""
        if plan.role is None:
            # check_claims refuses these; nothing, not even the course, is made for one.
            self.log.info("LTI launch of %s with no course role; nothing joined", name)
            return
        group, course = course_for(db, self.issuer, plan.context, make_user)
        if current_role(group, course, name) != plan.role:
            groups.add_members(db, group, course, [(name, plan.role)], make_user)
            self.log.info("LTI launch: %s is %s of course %s", name, plan.role, course.name)


# ---- handlers ----------------------------------------------------------------------------------


def _https(handler: web.RequestHandler) -> bool:
    public = handler.settings.get("public_url")
    if public:
        return public.scheme == "https"
    return get_browser_protocol(handler.request) == "https"


class _LTIBase:
    @property
    def lti(self) -> GpulabLTI:
        return self.authenticator.lti  # type: ignore[attr-defined]


class LTILoginHandler(_LTIBase, LTI13LoginInitHandler):
    """``/hub/lti13/login``: OIDC login initiation (GET or POST, from the LMS)."""

    def post(self) -> None:
        args = convert_request_to_dict(self.request.arguments)
        lti = self.lti
        for arg in ("iss", "login_hint", "target_link_uri"):
            if not args.get(arg):
                raise LTIError(400, arg, "missing from the login initiation request")
        if args["iss"] != lti.issuer:
            raise LTIError(
                400,
                "iss",
                f"unknown issuer {args['iss']!r}: this hub accepts launches from {lti.issuer!r} only",
            )
        client_id = args.get("client_id")
        if not client_id:
            if len(lti.client_ids) != 1:
                raise LTIError(400, "client_id", "missing, and this hub has more than one")
            (client_id,) = lti.client_ids
        if client_id not in lti.client_ids:
            raise LTIError(400, "client_id", f"unknown client id {client_id!r}")
        deployment = args.get("lti_deployment_id")
        if deployment and lti.deployment_ids and deployment not in lti.deployment_ids:
            raise LTIError(403, "lti_deployment_id", f"unknown deployment {deployment!r}")
        self.authorize_redirect(
            redirect_uri=self.get_redirect_uri(),
            login_hint=args["login_hint"],
            nonce=self.generate_nonce(),
            client_id=client_id,
            state=self.generate_state(),
            lti_message_hint=args.get("lti_message_hint"),
        )

    get = post

    def authorize_redirect(
        self,
        redirect_uri: str,
        login_hint: str,
        nonce: str,
        client_id: str,
        state: str,
        lti_message_hint: str | None = None,
    ) -> None:
        # As ltiauthenticator's, with the authorize URL of GpulabLTI (not the authenticator's).
        args = {
            "response_type": "id_token",
            "scope": "openid",
            "response_mode": "form_post",
            "prompt": "none",
            "client_id": client_id,
            "redirect_uri": redirect_uri,
            "login_hint": login_hint,
            "nonce": nonce,
            "state": state,
        }
        if lti_message_hint is not None:
            args["lti_message_hint"] = lti_message_hint
        self.redirect(url_concat(self.lti.authorize_url, args))

    def get_state(self) -> str:
        if self._state is None:
            self._state = _serialize_state(
                {"state_id": uuid.uuid4().hex, "next_url": self._next_url(), "t": int(time.time())}
            )
        return self._state

    def _next_url(self) -> str | None:
        """Where to land after the launch: ``next``, else the target link URI's path (not the
        hub's own root or LTI URLs, which send to the hub's home page)."""
        raw = self.get_argument("next", "") or self.get_argument("target_link_uri", "")
        parsed = urlparse(raw)
        path = "/" + parsed.path.lstrip("/")
        hub = self.hub.base_url.rstrip("/")
        if not raw or path.rstrip("/") in ("", hub) or path.startswith(hub + "/lti13"):
            return None
        return parsed._replace(scheme="", netloc="", path=path).geturl()

    def get_redirect_uri(self) -> str:
        public = self.settings.get("public_url")
        if public:
            root = f"{public.scheme}://{public.netloc}"
        else:
            root = f"{get_browser_protocol(self.request)}://{self.request.host}"
        return root + url_path_join(self.hub.base_url, LAUNCH_PATH.lstrip("/"))

    def _set_oauth_cookie(self, key: str, value: str) -> None:
        # The launch is a cross-site POST from the LMS: over HTTPS the cookies must be
        # SameSite=None to come back with it.
        extra = {"samesite": "None", "secure": True} if _https(self) else {}
        self._set_cookie(
            key,
            value,
            expires=time.time() + self.lti.max_age,
            httponly=True,
            encrypted=True,
            **extra,
        )


class LTILaunchHandler(_LTIBase, LTI13CallbackHandler):
    """``/hub/lti13/launch``: the platform's form post of the id_token (the redirect URI)."""

    _checked_state: dict | None = None

    async def post(self) -> None:
        lti = self.lti
        self.checked_state()
        encoded = self.get_body_argument("id_token", "")
        if not encoded:
            raise LTIError(400, "id_token", "missing from the launch request")
        claims = await asyncio.to_thread(lti.verify, encoded)
        self.checked_nonce(claims)
        lti.spend_nonce(self.db, claims)
        plan = lti.check_claims(claims)
        # Everything is checked: from here the launch changes things.
        user = await self.login_user(claims)
        if user is None:
            raise LTIError(
                403,
                "user",
                "this LMS user may not log in to this hub (blocked, or the name is not allowed)",
            )
        if plan is not None:
            lti.join_course(self.db, user.name, plan, lambda n: self.user_from_username(n).orm_user)
        self.redirect(self.get_next_url(user))

    def checked_state(self) -> dict:
        url_state = self.get_body_argument("state", "") or self.get_argument("state", "")
        if not url_state:
            raise LTIError(400, "state", "missing from the launch request")
        cookie_state = self._get_state_cookie()
        if not cookie_state:
            raise LTIError(
                400,
                "state",
                "no login in progress in this browser (no state cookie): start the launch from "
                "the LMS again; it must go through /hub/lti13/login first",
            )
        if cookie_state != url_state:
            raise LTIError(400, "state", "does not match this browser's login initiation")
        state = _deserialize_state(url_state)
        if not isinstance(state, dict) or time.time() - state.get("t", 0) > self.lti.max_age:
            raise LTIError(400, "state", f"the login started more than {self.lti.max_age} s ago")
        self._checked_state = state
        return state

    def checked_nonce(self, claims: Mapping[str, Any]) -> None:
        nonce_state = self._get_nonce_state_cookie()
        if not nonce_state:
            raise LTIError(
                400,
                "nonce",
                "no nonce cookie in this browser (used already, or the login was not started here)",
            )
        if get_nonce(nonce_state) != claims.get("nonce"):
            raise LTIError(
                401,
                "nonce",
                "the id_token's nonce is not this login's (a replayed or foreign token)",
            )

    def get_next_url(self, user: Any = None, default: Any = None) -> str:
        state = self._checked_state or {}
        next_url = self._validate_next_url(state.get("next_url") or "")
        return next_url or url_path_join(self.hub.base_url, "home")
