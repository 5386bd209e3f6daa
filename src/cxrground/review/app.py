"""The review web app (FastAPI): login, a queue per reviewer, the ILS pair and CheXpercept case pages, statistics,
and the JSON API behind them.

Routes (everything but ``GET /healthz``, the login page and its stylesheet needs a signed-in user):

* pages (session cookie; without one they redirect to ``/login``): ``GET /queue`` (progress, resume link),
  ``GET /review/{assignment id}`` (pair or case page; its script reads the API), ``GET /stats`` (admins),
  ``GET /login`` / ``POST /login`` (name + token), ``POST /logout``;
* API (``Authorization: Bearer TOKEN`` or the session cookie; 401 JSON without): ``GET /api/me``,
  ``GET /api/queue`` (the signed-in user's assignments, queue order), ``GET /api/assignments`` (own; an admin's:
  all), ``GET /api/assignments/{id}``, ``GET /api/assignments/{id}/image/{n}`` (the item's n-th stored image as
  PNG), ``POST /api/assignments/{id}/decision`` (JSON ``{part, decision, reason, mask, comment}``; a ``correct``
  with an empty mask is refused, one with the generated mask unchanged is recorded as ``accept``; ``comment``: the
  reviewer's free text, at most :data:`MAX_COMMENT_CHARS` characters, stored and returned as plain text),
  ``POST /api/assignments/{id}/comment`` (JSON ``{part, comment, expected_version}``: only the comment of the part's
  stored decision changes, with the decision route's version and CSRF rules), ``GET /api/stats`` (admins).

Rules: a reviewer sees only their own assignments (another's id answers 404, as an unknown one); an admin sees
every assignment but decides only on their own. A cookie-authenticated POST needs the session's CSRF token (the
``csrf`` form field or the ``X-CSRF-Token`` header; the login form has its own double-submit token); a bearer
request needs none (no ambient credential). Images are looked up by assignment id and index in the database:
no request value is ever used as a file path. A decision is committed to SQLite (WAL, ``synchronous=FULL``)
before the response is sent. Request bodies are limited to :data:`MAX_BODY_BYTES` (form posts such as the login to
:data:`MAX_FORM_BYTES`) and must arrive within :data:`BODY_TIMEOUT_S` seconds (408 beyond). Every response carries a
strict Content-Security-Policy (nothing loaded from elsewhere, no inline script) and ``Cache-Control:
no-store`` (images and static files: private caching).

Availability (:mod:`cxrground.net.connections`): a connection that sends no complete request within
:data:`IDLE_TIMEOUT_S` seconds is closed, and past :data:`MAX_CONNECTIONS` open connections the one waiting longest
for a request is closed to make room, so idle sockets never lock reviewers out; a connection whose client takes
none of its response for :data:`SEND_TIMEOUT_S` seconds is dropped (its unsent bytes freed, the request's slot given
back), so clients that never read hold neither memory nor slots (these limits and the body timeout are defaults:
:func:`serve` takes others as a :class:`~cxrground.net.limits.ConnectionLimits`); the app works on at most
:data:`MAX_IN_FLIGHT` requests at once (a request waiting for its client to send the body holds no slot) and
answers one more with 503 and ``Retry-After``. Token checks, JSON and RLE decoding and SQLite run in the thread pool;
checked tokens (right or wrong) are remembered by their SHA-256 for a few minutes, and a wrong one is answered
after a short async delay. Odd request values (an id beyond 64 bits or not a number, a body nested deeper than
:data:`_MAX_JSON_DEPTH`, an integer too long to convert) get a 4xx in the ``{"error": ...}`` shape, never a 500;
so does a stored image gone missing (404) or unreadable (422) since the import, and the server logs one line
naming its path (the client is not told it); a client that disconnects mid-request is dropped without a log entry.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import html
import io
import json
import logging
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from cxrground import __version__
from cxrground.errors import ConfigError, InputError
from cxrground.io.image import read_image
from cxrground.io.masks import decode_rle, encode_rle
from cxrground.net.connections import (
    BODY_TIMEOUT_S,
    IDLE_TIMEOUT_S,
    MAX_CONNECTIONS,
    SEND_TIMEOUT_S,
    BodyDeadline,
    BodyTimeout,
    guarded_protocol,
    prepare_process,
)
from cxrground.net.limits import ConnectionLimits
from cxrground.review.db import (
    DECISIONS,
    MAX_SESSION_HOURS,
    REJECT_REASONS,
    SESSION_SECONDS,
    UNREADABLE_REASON,
    Assignment,
    DecisionConflict,
    Neighbours,
    QueueRow,
    ReviewDB,
    User,
)
from cxrground.review.stats import review_stats, stats_html
from cxrground.vocab.display import ils_item_type_label, path_label, section_label
from cxrground.vocab.percept_templates import question_stem
from cxrground.vocab.views import BENCH_VIEW, is_frontal

__all__ = ["BODY_TIMEOUT_S", "IDLE_TIMEOUT_S", "MAX_BODY_BYTES", "MAX_COMMENT_CHARS", "MAX_CONNECTIONS",
           "MAX_FORM_BYTES", "MAX_IN_FLIGHT", "SEND_TIMEOUT_S", "STATIC_DIR", "create_app", "rle_runs", "serve",
           "server_config"]

STATIC_DIR: Final[Path] = Path(__file__).resolve().parent / "static"
MAX_BODY_BYTES: Final[int] = 16 * 1024 * 1024
#: Most body bytes all requests may be receiving at once (four full bodies); a chunk beyond it is answered 503.
MAX_RECEIVING_BYTES: Final[int] = 4 * MAX_BODY_BYTES
#: Largest body of a form post (login, logout): read before anything is checked, so kept small.
MAX_FORM_BYTES: Final[int] = 64 * 1024
SESSION_COOKIE: Final[str] = "crg_review_session"
LOGIN_COOKIE: Final[str] = "crg_review_login"
PAGE_CSP: Final[str] = ("default-src 'self'; img-src 'self' data: blob:; style-src 'self'; script-src 'self'; "
                        "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
                        "frame-ancestors 'none'")
_STATIC_FILES: Final[dict[str, str]] = {"review.js": "text/javascript", "review.css": "text/css"}
_PUBLIC_STATIC: Final[frozenset[str]] = frozenset({"review.css"})
_TOKEN_CACHE_SECONDS: Final[float] = 300.0
_TOKEN_CACHE_SIZE: Final[int] = 4096
#: Requests the app works on at once (idle connections and requests waiting for their body do not count); more get
#: 503 with ``Retry-After``.
MAX_IN_FLIGHT: Final[int] = 64
_MAX_JSON_DEPTH: Final[int] = 64
#: Longest free-text comment a decision may carry (characters); a longer one is refused (400).
MAX_COMMENT_CHARS: Final[int] = 2000
#: A wrong token is answered after this delay (an async sleep: no thread, no CPU), which slows a flood of
#: guesses to a few requests per second per connection; at most :data:`_TARPIT_SLOTS` wait at once.
_TARPIT_SECONDS: Final[float] = 0.25
#: Seconds a request over the in-flight limit waits for a working slot before it is answered 503.
SLOT_WAIT_S: Final[float] = 1.0
_TARPIT_SLOTS: Final[int] = 32
_LOG = logging.getLogger(__name__)


class _AuthError(Exception):
    """No (valid) credentials: 401 for the API, a redirect to the login page for pages."""


class _WrongCredential(_AuthError):
    """A token was presented and is wrong: answered 401 after a short delay (:data:`_TARPIT_SECONDS`)."""


class _Forbidden(Exception):
    """Signed in, but not allowed (CSRF token missing or wrong, admin-only page); ``kind`` is the JSON error type
    (``csrf`` for a CSRF token the page should fetch anew from ``GET /api/me``)."""

    def __init__(self, message: str, kind: str = "forbidden") -> None:
        super().__init__(message)
        self.kind = kind


class _Refused(Exception):
    """A decision the app refuses with ``status`` and a JSON error of type ``kind`` (plus ``extra`` fields): one
    over a decision made meanwhile (409), or an accept of a film the app cannot serve (404/422)."""

    def __init__(self, status: int, kind: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.extra = status, kind, message, extra


class _BadRequest(Exception):
    """A request the app refuses with 400 and a reason."""


@dataclass(frozen=True)
class _Principal:
    user: User
    csrf: str | None  # None for bearer requests
    session: str | None = None


def rle_runs(mask: np.ndarray) -> list[int]:
    """Uncompressed COCO RLE counts (column-major runs, starting with a run of zeros) of a boolean mask."""
    flat = np.asarray(mask, dtype=bool).ravel(order="F")
    change = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    bounds = np.concatenate([[0], change, [flat.size]])
    runs = np.diff(bounds).tolist()
    return [0, *runs] if flat.size and flat[0] else runs


def _page(title: str, body: str, principal: _Principal | None = None, body_attrs: str = "") -> HTMLResponse:
    nav = ""
    if principal is not None:
        links = "<a href='/queue'>Queue</a>" + (" <a href='/stats'>Statistics</a>" if principal.user.is_admin else "")
        nav = (f"<nav>{links} <span class='who' id='who'>{html.escape(principal.user.name)} "
               f"({html.escape(principal.user.role)})</span>"
               f"<form method='post' action='/logout' class='inline'><input type='hidden' name='csrf' "
               f"value='{html.escape(principal.csrf or '')}'><button id='logout'>Log out</button></form></nav>")
    csrf_meta = f"<meta name='csrf-token' content='{html.escape(principal.csrf or '')}'>" if principal else ""
    doc = (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)} · cxrground "
           f"review</title>{csrf_meta}<link rel='icon' href='data:,'><link rel='stylesheet' href='/static/review.css'>"
           "</head>"
           f"<body {body_attrs}>{nav}{body}<footer>cxrground {__version__}</footer></body></html>")
    return HTMLResponse(doc)


_ERROR_TITLES: Final[dict[int, str]] = {400: "Bad request", 403: "Not allowed", 404: "Not found",
                                         405: "Not allowed", 408: "Too slow", 413: "Too large", 422: "Cannot read it",
                                         503: "Server busy"}


def _error_page(status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> HTMLResponse:
    """The HTML answer of a page route (not ``/api/``) that fails: the message and the ways back (``kind``: the
    error type the API would name, in ``data-error``)."""
    title = _ERROR_TITLES.get(status, "Error")
    body = (f"<main class='error-page' data-error='{html.escape(kind)}'><h1>{html.escape(title)}</h1>"
            f"<p class='error' id='error-message' role='alert'>{html.escape(message[:1].upper() + message[1:])}</p>"
            "<p><a class='button' id='back-to-queue' href='/queue'>Back to the queue</a> "
            "<a href='/login' id='to-login'>Sign in</a></p></main>")
    response = _page(title, body)
    response.status_code = status
    for k, v in (headers or {}).items():
        response.headers[k] = v
    return response


def _is_api(request: Request) -> bool:
    """Whether a request is to the JSON API (errors as JSON); pages get their errors as HTML."""
    return request.url.path.startswith("/api/") or request.url.path == "/healthz"


def _progress(rows: list[QueueRow]) -> tuple[int, int, QueueRow | None]:
    done = sum(a.done for a in rows)
    nxt = next((a for a in rows if not a.done), None)
    return done, len(rows), nxt


def _type_label(kind: str, item_type: str) -> str:
    """An item's type in words (``lesion_inference positive`` -> ``lesion-inference instruction, positive pair``,
    ``RR`` -> ``revision required (RR)``)."""
    return ils_item_type_label(item_type) if kind == "ils" else path_label(item_type)


def _labels(item: Any) -> dict[str, Any]:
    """What the pages show for an item's internal keys (the keys stay in tooltips): its title, its type, the report
    section (ILS) and each question's stem (benchmark: the question without its options, which the page lists;
    None when the text is not laid out as the stem plus these options)."""
    out: dict[str, Any] = {"title": f"{item.lesion} · {_type_label(item.kind, item.item_type)}",
                           "item_type": _type_label(item.kind, item.item_type)}
    if item.kind == "ils":
        out["section"] = section_label(str(item.payload.get("section_name", "")))
    else:
        out["stems"] = {q["part"]: question_stem(q["question"], q["options"])
                        for q in item.payload.get("questions", [])}
    return out


def _orientation(view: str | None) -> str:
    """How the page marks the patient's right and left on an item's film: ``frontal`` (a PA/AP view: R on the image's
    left, L on its right), ``assumed`` (view unknown: marked as a frontal film, with a hint that the view is unknown)
    or ``none`` (a lateral or other view: no R/L markers). A benchmark case's film is frontal by the benchmark's
    definition (``FRONTAL``)."""
    if not view:
        return "assumed"
    return "frontal" if view == BENCH_VIEW or is_frontal(view) else "none"


def _queue_entry(a: QueueRow) -> dict[str, Any]:
    return {"id": a.id, "key": a.key, "kind": a.kind, "lesion": a.lesion, "item_type": a.item_type,
            "reviewer": a.user_name, "position": a.position, "done": a.done, "parts": a.parts, "decided": a.decided}


def _queue_table(table_id: str, rows: list[QueueRow], *, with_reviewer: bool) -> str:
    """A queue table: position, item, kind, lesion, type, (reviewer), status."""
    out = [f"<table id='{table_id}'><thead><tr><th>#</th><th>item</th><th>kind</th><th>lesion</th><th>type</th>"
           + ("<th>reviewer</th>" if with_reviewer else "") + "<th>status</th></tr></thead><tbody>"]
    for a in rows:
        state = "done" if a.done else (f"{len(a.decided)}/{len(a.parts)}" if a.decided else "open")
        out.append(f"<tr data-id='{a.id}' data-state='{'done' if a.done else 'open'}'><td>{a.position + 1}</td>"
                   f"<td><a href='/review/{a.id}'>{html.escape(a.key)}</a></td>"
                   f"<td>{a.kind}</td><td>{html.escape(a.lesion)}</td>"
                   f"<td title='{html.escape(a.item_type)}'>{html.escape(_type_label(a.kind, a.item_type))}</td>"
                   + (f"<td>{html.escape(a.user_name)}</td>" if with_reviewer else "") + f"<td>{state}</td></tr>")
    out.append("</tbody></table>")
    return "".join(out)


class _StoredImageError(Exception):
    """An image stored at import cannot be served: missing (404) or unreadable (422). The client is told only
    that; the server log names ``path`` and ``reason``."""

    def __init__(self, path: str, reason: str, *, missing: bool) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason
        self.status, self.kind = (404, "image_missing") if missing else (422, "image_unreadable")
        self.message = ("the stored image of this item is missing on the server; tell the review's admin" if missing
                        else "the stored image of this item cannot be read on the server; tell the review's admin")


def _missing(path: str) -> _StoredImageError | None:
    """The error for a stored image that is no longer a file, else None."""
    return None if Path(path).is_file() else _StoredImageError(path, "file not found", missing=True)


@functools.lru_cache(maxsize=32)
def _cxr_png(path: str) -> bytes:
    """The 8-bit grey PNG of a stored CXR path (any readable format: PNG, JPEG, DICOM); a missing or unreadable
    file is a :class:`_StoredImageError`."""
    from PIL import Image

    gone = _missing(path)
    if gone is not None:
        raise gone
    try:
        pixels = read_image(path).pixels
    except InputError as exc:
        raise _StoredImageError(path, exc.reason, missing=not Path(path).is_file()) from exc
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def _stored_png(path: str) -> bytes:
    """A stored benchmark PNG as is; a missing, unreadable or non-PNG file is a :class:`_StoredImageError`."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError as exc:
        raise _StoredImageError(path, "file not found", missing=True) from exc
    except OSError as exc:
        raise _StoredImageError(path, f"cannot read it ({exc.strerror or exc})", missing=False) from exc
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        raise _StoredImageError(path, "not a PNG", missing=False)
    return data


def _comment(value: Any) -> str:
    """A decision's free-text comment as stored: ``""`` for none; line breaks kept (``\\r\\n`` as ``\\n``), the ends
    stripped. Refused (``_BadRequest``): not a string, longer than :data:`MAX_COMMENT_CHARS`, or holding control
    characters other than line breaks and tabs."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _BadRequest(f"comment must be text, got {type(value).__name__}")
    text = value.replace("\r\n", "\n").replace("\r", "\n").strip()
    if len(text) > MAX_COMMENT_CHARS:
        raise _BadRequest(f"the comment is {len(text)} characters long; at most {MAX_COMMENT_CHARS} are kept "
                          "(shorten it)")
    if any((ord(c) < 32 and c not in "\n\t") or ord(c) == 127 for c in text):
        raise _BadRequest("the comment holds control characters (only line breaks and tabs are kept)")
    return text


def _write_guard(a: Assignment, body: dict[str, Any]) -> tuple[str, int | None, bool]:
    """``(part, expected_version, overwrite)`` of a decision or comment write, checked (``_BadRequest``)."""
    expected, overwrite = body.get("expected_version"), body.get("overwrite", False)
    if expected is not None and (type(expected) is not int or not 0 <= expected < 2**62):
        raise _BadRequest(f"expected_version must be the part's version the decision was made over (0: "
                          f"undecided), got {expected!r}"[:300])
    if type(overwrite) is not bool:
        raise _BadRequest(f"overwrite must be true or false, got {overwrite!r}"[:300])
    part = body.get("part")
    if not isinstance(part, str) or part not in a.item.parts:
        raise _BadRequest(f"part must be one of {a.item.parts}, got {part!r}"[:300])
    return part, expected, overwrite


def _conflict(exc: DecisionConflict) -> _Refused:
    """The 409 answer to a write over a decision made meanwhile (what is stored now in ``stored``)."""
    now = exc.stored
    when = time.strftime("%H:%M", time.localtime(now["updated"])) if now["updated"] else ""
    said = (f"decided meanwhile (in another tab or session) at {when} as {now['decision']}"
            + (f" ({now['reason']})" if now["reason"] else "") if now["decision"] else
            "undecided now (the decision it was made over is gone)")
    return _Refused(409, "conflict", f"not stored: this part was {said}; send overwrite: true to replace it",
                    stored={k: now[k] for k in ("decision", "reason", "comment", "updated", "version")})


def _json_body(raw: bytes) -> Any:
    """The parsed JSON body; refused (``_BadRequest``) when not JSON or nested deeper than
    :data:`_MAX_JSON_DEPTH` (checked on the text before parsing, so no parser recursion ever runs out)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
            if deepest > _MAX_JSON_DEPTH:
                raise _BadRequest(f"body is nested deeper than {_MAX_JSON_DEPTH} levels")
        elif byte in (0x5D, 0x7D):
            depth -= 1
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:  # ValueError: not JSON, not UTF-8, an integer too long to convert
        raise _BadRequest(f"body is not JSON ({exc})"[:300]) from exc


class _InFlightLimit:
    """ASGI middleware: at most ``limit`` HTTP requests in progress. One more waits up to ``wait`` seconds for a
    slot (at most ``4 × limit`` wait at once), else is answered 503: a burst of short requests (a flood of wrong
    tokens on a loaded machine) delays a reviewer's request instead of refusing it. Idle connections hold no slot,
    nor does a request while it waits for its client to send the body, nor one whose wrong credential is answered
    late (:meth:`release`; the request's slot is in ``scope["cxr.inflight"]``)."""

    def __init__(self, app: Any, limit: int = MAX_IN_FLIGHT, wait: float = SLOT_WAIT_S) -> None:
        self.app, self.limit, self.active, self.wait, self.waiting = app, limit, 0, wait, 0

    async def _slot_free(self) -> bool:
        """Whether a slot is free now or within ``wait`` seconds (polled: the waiters are few and bounded)."""
        if self.active < self.limit:
            return True
        if self.waiting >= 4 * self.limit or self.wait <= 0:
            return False
        self.waiting += 1
        try:
            deadline = time.monotonic() + self.wait
            while self.active >= self.limit:
                if time.monotonic() >= deadline:
                    return False
                await asyncio.sleep(0.005)
            return True
        finally:
            self.waiting -= 1

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not await self._slot_free():
            busy = JSONResponse({"error": {"type": "busy", "message": "server busy, retry in a second"}},
                                status_code=503, headers={"Retry-After": "1", "Cache-Control": "no-store"})
            await busy(scope, receive, send)
            return
        slot = {"held": True}
        self.active += 1
        scope["cxr.inflight"] = (self, slot)

        async def waiting_receive() -> Any:
            if not slot["held"]:
                return await receive()
            self.active -= 1
            try:
                return await receive()
            finally:
                self.active += 1

        try:
            await self.app(scope, waiting_receive, send)
        finally:
            if slot["held"]:
                self.active -= 1

    @staticmethod
    def release(scope: dict[str, Any]) -> None:
        """Give back the slot of the request of ``scope`` for the rest of it (an answer that does no more work)."""
        limiter, slot = scope.get("cxr.inflight") or (None, None)
        if limiter is not None and slot["held"]:
            slot["held"] = False
            limiter.active -= 1


def create_app(db: ReviewDB | str | Path, *, secure_cookies: bool = False,
               max_in_flight: int = MAX_IN_FLIGHT, body_timeout: float = BODY_TIMEOUT_S,
               session_hours: float = SESSION_SECONDS / 3600) -> FastAPI:
    """The app over the review database ``db`` (``secure_cookies``: mark cookies Secure, behind HTTPS;
    ``max_in_flight``: requests worked on at once; ``body_timeout``: seconds a request body may take to arrive;
    ``session_hours``: how long a sign-in lasts, more than 0 and at most :data:`MAX_SESSION_HOURS`).
    Token checks, RLE decoding and database work run in the thread pool (sync handlers, or
    :func:`run_in_threadpool`), never on the event loop."""
    if not 0 < session_hours <= MAX_SESSION_HOURS:
        raise ConfigError(f"session hours must be more than 0 and at most {MAX_SESSION_HOURS}, got {session_hours}")
    session_seconds = session_hours * 3600
    db = db if isinstance(db, ReviewDB) else ReviewDB(db)
    app = FastAPI(title="cxrground review", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(_InFlightLimit, limit=max_in_flight)
    app.add_middleware(BodyDeadline, timeout=body_timeout)
    token_cache: dict[str, tuple[User | None, float]] = {}

    def checked_token(token: str) -> User | None:
        """The token's user (None: wrong), remembered by the token's SHA-256 for a while, both ways, so a
        repeated wrong token costs one hash."""
        digest = hashlib.sha256(token.encode("utf-8", "replace")).hexdigest()
        now = time.monotonic()
        hit = token_cache.get(digest)
        if hit and hit[1] > now:
            return hit[0]
        user = db.user_by_token(token)
        if len(token_cache) >= _TOKEN_CACHE_SIZE:
            for k in [k for k, (_, until) in token_cache.items() if until <= now] or list(token_cache)[:1024]:
                token_cache.pop(k, None)
        token_cache[digest] = (user, now + _TOKEN_CACHE_SECONDS)
        return user

    def bearer_user(header: str) -> User:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise _AuthError("expected Authorization: Bearer TOKEN")
        user = checked_token(token.strip())
        if user is None:
            raise _WrongCredential("unknown or wrong token")
        return user

    def principal(request: Request, *, allow_bearer: bool) -> _Principal:
        header = request.headers.get("authorization")
        if header and allow_bearer:
            return _Principal(bearer_user(header), None)
        session = request.cookies.get(SESSION_COOKIE, "")
        found = db.session_user(session) if session else None
        if found is None:
            raise _AuthError("not signed in")
        return _Principal(found[0], found[1], session)

    def check_csrf(p: _Principal, supplied: str | None) -> None:
        if p.csrf is None:
            return  # bearer: no ambient credential to abuse
        if not supplied or not hmac.compare_digest(supplied.encode(), p.csrf.encode()):
            raise _Forbidden("CSRF token missing or wrong (the page is older than your session: reload it)", "csrf")

    def visible(p: _Principal, assignment_id: int) -> Assignment:
        found = db.assignment(assignment_id, p.user) if 0 < assignment_id < 2**63 else None
        if found is None:
            raise StarletteHTTPException(404, "no such assignment")
        return found

    receiving = {"bytes": 0}  # body bytes of the requests being received (one event loop: no lock needed)

    async def bounded_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
        declared = request.headers.get("content-length", "")
        if declared.isascii() and declared.isdigit() and int(declared) > limit:
            raise StarletteHTTPException(413, f"body over {limit} bytes")
        chunks, size = [], 0
        try:
            async for chunk in request.stream():
                if size + len(chunk) > limit:
                    raise StarletteHTTPException(413, f"body over {limit} bytes")
                if receiving["bytes"] + len(chunk) > MAX_RECEIVING_BYTES:
                    raise StarletteHTTPException(503, "server busy receiving other large requests, retry in a "
                                                      "second", headers={"Retry-After": "1"})
                size += len(chunk)
                receiving["bytes"] += len(chunk)
                chunks.append(chunk)
        finally:
            receiving["bytes"] -= size
        return b"".join(chunks)

    async def form_fields(request: Request) -> dict[str, str]:
        from urllib.parse import parse_qs

        if request.headers.get("content-type", "").split(";")[0].strip() != "application/x-www-form-urlencoded":
            raise _BadRequest("expected a form post (application/x-www-form-urlencoded)")
        parsed = parse_qs((await bounded_body(request, MAX_FORM_BYTES)).decode("utf-8", "replace"),
                          keep_blank_values=True)
        return {k: v[0] for k, v in parsed.items()}

    @app.middleware("http")
    async def security_headers(request: Request, call_next: Any) -> Response:
        response = await call_next(request)
        response.headers.setdefault("Content-Security-Policy", PAGE_CSP)
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers.setdefault("Cache-Control", "no-store")
        return response

    tarpit = {"waiting": 0}

    async def slow_down(request: Request) -> None:
        if tarpit["waiting"] < _TARPIT_SLOTS:
            tarpit["waiting"] += 1
            _InFlightLimit.release(request.scope)  # the wait and the 401 after it hold no working slot
            try:
                await asyncio.sleep(_TARPIT_SECONDS)
            finally:
                tarpit["waiting"] -= 1

    @app.exception_handler(_AuthError)
    async def on_auth(request: Request, exc: _AuthError) -> Response:
        if isinstance(exc, _WrongCredential):
            await slow_down(request)
        if _is_api(request):
            return JSONResponse({"error": {"type": "unauthorized", "message": str(exc)}}, status_code=401,
                                headers={"WWW-Authenticate": "Bearer"})
        return RedirectResponse("/login", status_code=303)

    def error(request: Request, status: int, kind: str, message: str, headers: dict[str, str] | None = None,
              **extra: Any) -> Response:
        """The error answer: ``{"error": {type, message, ...}}`` for the API, an HTML page for page routes."""
        if _is_api(request):
            return JSONResponse({"error": {"type": kind, "message": message, **extra}}, status_code=status,
                                headers=headers)
        return _error_page(status, kind, message, headers)

    @app.exception_handler(_Forbidden)
    async def on_forbidden(request: Request, exc: _Forbidden) -> Response:
        return error(request, 403, exc.kind, str(exc))

    @app.exception_handler(_Refused)
    async def on_refused(request: Request, exc: _Refused) -> Response:
        return error(request, exc.status, exc.kind, exc.message, **exc.extra)

    @app.exception_handler(_BadRequest)
    async def on_bad(request: Request, exc: _BadRequest) -> Response:
        return error(request, 400, "bad_request", str(exc))

    @app.exception_handler(InputError)
    async def on_input(request: Request, exc: InputError) -> Response:
        return error(request, 400, "bad_request", exc.reason)

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException) -> Response:
        headers = dict(exc.headers or {})
        if exc.status_code in (413, 503):  # the unread body ends the connection
            headers["Connection"] = "close"
        return error(request, exc.status_code, "http", str(exc.detail), headers or None)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, exc: RequestValidationError) -> Response:
        # the only typed request values are path ids: one that is no integer names nothing
        return error(request, 404, "http", "not found")

    @app.exception_handler(BodyTimeout)
    async def on_body_timeout(request: Request, exc: BodyTimeout) -> Response:
        return error(request, 408, "request_timeout", str(exc), {"Connection": "close"})

    @app.exception_handler(ClientDisconnect)
    async def on_disconnect(request: Request, exc: ClientDisconnect) -> Response:
        return Response(status_code=400)  # nobody reads it: the client is gone

    # --- public ------------------------------------------------------------------------------------

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok", "version": __version__}

    def login_page(message: str = "", status: int = 200, name: str = "") -> Response:
        """The sign-in form (``message``: why it is shown again, as an error; ``name``: the name typed before)."""
        token = secrets.token_urlsafe(24)
        focus = " autofocus" if not name else ""
        body = ("<main class='login'><h1>cxrground review</h1>"
                + (f"<p class='error' id='login-error' role='alert'>{html.escape(message)}</p>" if message else "")
                + "<form method='post' action='/login' id='login-form'>"
                f"<input type='hidden' name='csrf' value='{token}'>"
                f"<label for='name'>Name</label><input id='name' name='name' autocomplete='username' required{focus} "
                f"value='{html.escape(name[:64])}'>"
                "<label for='token'>Token</label><input id='token' name='token' type='password' "
                f"autocomplete='current-password' required{'' if focus else ' autofocus'}>"
                "<button id='login-button'>Sign in</button></form></main>")
        response = _page("Sign in", body)
        response.status_code = status
        response.set_cookie(LOGIN_COOKIE, token, httponly=True, samesite="strict", secure=secure_cookies,
                            max_age=3600)
        return response

    @app.get("/login")
    def login_get() -> Response:
        return login_page()

    @app.post("/login")
    async def login_post(request: Request) -> Response:
        fields = await form_fields(request)
        expected = request.cookies.get(LOGIN_COOKIE, "")
        name = fields.get("name", "")
        if not expected or not hmac.compare_digest(fields.get("csrf", "").encode(), expected.encode()):
            # a form left open past its cookie's hour (or posted from elsewhere): a fresh form, the name kept
            return login_page("This sign-in form had expired (or came from another site). Enter your token and "
                              "sign in again.", 403, name)
        made = await run_in_threadpool(db.login, name, fields.get("token", "").strip(), session_seconds)
        if made is None:
            await slow_down(request)
            return login_page("Unknown name or wrong token.", 401, name)
        response = RedirectResponse("/queue", status_code=303)
        response.set_cookie(SESSION_COOKIE, made[0], httponly=True, samesite="strict", secure=secure_cookies)
        response.delete_cookie(LOGIN_COOKIE)
        return response

    @app.get("/static/{name}")
    def static(name: str, request: Request) -> Response:
        if name not in _STATIC_FILES:
            raise StarletteHTTPException(404, "not found")
        if name not in _PUBLIC_STATIC:
            principal(request, allow_bearer=True)
        return Response((STATIC_DIR / name).read_bytes(), media_type=_STATIC_FILES[name],
                        headers={"Cache-Control": "private, max-age=60"})

    # --- pages -------------------------------------------------------------------------------------

    @app.post("/logout")
    async def logout(request: Request) -> Response:
        p = await run_in_threadpool(principal, request, allow_bearer=False)
        check_csrf(p, (await form_fields(request)).get("csrf"))
        await run_in_threadpool(db.logout, p.session or "")
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(SESSION_COOKIE)
        return response

    @app.get("/")
    def root(request: Request) -> Response:
        principal(request, allow_bearer=False)
        return RedirectResponse("/queue", status_code=303)

    @app.get("/queue")
    def queue_page(request: Request) -> Response:
        p = principal(request, allow_bearer=False)
        mine = db.queue(p.user)
        done, total, nxt = _progress(mine)
        pct = 100 * done / total if total else 100
        body = [f"<main><h1>Review queue of {html.escape(p.user.name)}</h1>",
                f"<p id='progress-text'>{done} of {total} done</p>"
                f"<progress id='progress' max='{total}' value='{done}'>{pct:.0f} %</progress>"]
        body.append(f"<p><a class='button' id='resume' href='/review/{nxt.id}'>Resume</a></p>" if nxt else
                    "<p id='all-done'>Everything in this queue is reviewed.</p>")
        body.append(_queue_table("queue", mine, with_reviewer=False))
        if p.user.is_admin:  # everyone's assignments in a table of their own, with each reviewer's progress
            everyone = db.queue()
            by_user: dict[str, list[QueueRow]] = {}
            for a in everyone:
                by_user.setdefault(a.user_name, []).append(a)
            summary = ", ".join(f"{html.escape(n)} {sum(a.done for a in rows)}/{len(rows)}"
                                for n, rows in by_user.items())
            body.append(f"<h2>All assignments (admin view)</h2><p class='sub' id='team-progress'>{summary}</p>")
            body.append(_queue_table("all-assignments", everyone, with_reviewer=True))
        body.append("</main>")
        return _page("Queue", "".join(body), p)

    @app.get("/review/{assignment_id}")
    def review_page(assignment_id: int, request: Request) -> Response:
        p = principal(request, allow_bearer=False)
        a = visible(p, assignment_id)
        title, key = _labels(a.item)["title"], html.escape(a.item.key)
        body = (f"<main id='app' data-assignment='{a.id}' data-kind='{a.item.kind}' data-key='{key}'>"
                f"<header class='title'><h1 id='title' title='item {key}'>{html.escape(title)}</h1>"
                f"<p id='status' class='sub' role='status' aria-live='polite'>loading…</p></header>"
                f"<div id='content'></div></main><script src='/static/review.js'></script>")
        return _page(f"{title} ({a.item.key})", body, p, "data-ready='false' class='wide'")

    @app.get("/stats")
    def stats_page(request: Request) -> Response:
        p = principal(request, allow_bearer=False)
        if not p.user.is_admin:
            raise _Forbidden("the statistics page is for admins")
        return _page("Statistics", f"<main><h1>Review statistics</h1>{stats_html(review_stats(db))}</main>", p)

    # --- API ---------------------------------------------------------------------------------------

    @app.get("/api/me")
    def me(request: Request) -> dict[str, Any]:
        p = principal(request, allow_bearer=True)
        # a signed-in page reads its session's CSRF token here after a sign-in in another tab replaced its session
        # (same-origin only: the CSP and the absence of CORS keep other sites from reading it)
        return {"name": p.user.name, "role": p.user.role, **({"csrf": p.csrf} if p.csrf else {})}

    @app.get("/api/queue")
    def api_queue(request: Request) -> dict[str, Any]:
        p = principal(request, allow_bearer=True)
        mine = db.queue(p.user)
        done, total, nxt = _progress(mine)
        return {"user": p.user.name, "done": done, "total": total, "next": nxt.id if nxt else None,
                "assignments": [_queue_entry(a) for a in mine]}

    @app.get("/api/assignments")
    def api_assignments(request: Request) -> dict[str, Any]:
        p = principal(request, allow_bearer=True)
        rows = db.queue() if p.user.is_admin else db.queue(p.user)
        return {"assignments": [_queue_entry(a) for a in rows]}

    @app.get("/api/assignments/{assignment_id}")
    def api_assignment(assignment_id: int, request: Request) -> dict[str, Any]:
        p = principal(request, allow_bearer=True)
        a = visible(p, assignment_id)
        item = a.item
        shape = (item.height, item.width)
        own = a.decisions.get("pair", {})
        mask = own.get("mask") if own.get("decision") == "correct" and own.get("mask") else item.mask
        # the viewer's own queue around it (an admin looking at another's assignment: that one alone)
        around = db.neighbours(a) if a.user_id == p.user.id else Neighbours(0, 1, None, None)
        return {
            "id": a.id, "key": item.key, "kind": item.kind, "lesion": item.lesion, "item_type": item.item_type,
            "positive": item.positive, "height": item.height, "width": item.width, "reviewer": a.user_name,
            "editable": a.user_id == p.user.id, "images": [{"index": i, "label": im.get("label", "")}
                                                            for i, im in enumerate(item.images)],
            "payload": item.payload, "parts": item.parts, "reasons": list(REJECT_REASONS[item.kind]),
            "unreadable_reason": UNREADABLE_REASON[item.kind],
            "max_comment": MAX_COMMENT_CHARS, "labels": _labels(item), "view": item.view,
            "orientation": _orientation(item.view),
            "decisions": {k: {"decision": v["decision"], "reason": v["reason"], "comment": v["comment"],
                              "updated": v["updated"], "version": v["version"]} for k, v in a.decisions.items()},
            "mask": {"size": list(shape), "counts": rle_runs(decode_rle(mask, shape))} if mask else None,
            "generated_mask": ({"size": list(shape), "counts": rle_runs(decode_rle(item.mask, shape))}
                               if item.mask else None),
            "position": around.index, "total": around.total, "prev": around.prev, "next_open": around.next_open,
        }

    @app.get("/api/assignments/{assignment_id}/image/{index}")
    def api_image(assignment_id: int, index: int, request: Request) -> Response:
        p = principal(request, allow_bearer=True)
        a = visible(p, assignment_id)
        if not 0 <= index < len(a.item.images):
            raise StarletteHTTPException(404, "no such image")
        try:
            data = served_image(a, index)
        except _StoredImageError as exc:
            return JSONResponse({"error": {"type": exc.kind, "message": exc.message}}, status_code=exc.status)
        return Response(data, media_type="image/png", headers={"Cache-Control": "private, max-age=600"})

    def served_image(a: Assignment, index: int) -> bytes:
        """The PNG the image route answers for image ``index`` of ``a``; one that cannot be served is logged (its
        path, for the admin) and raised as :class:`_StoredImageError`."""
        stored = a.item.images[index]
        try:
            return _cxr_png(stored["path"]) if stored.get("role") == "cxr" else _stored_png(stored["path"])
        except _StoredImageError as exc:
            _LOG.warning("review app: image %d of assignment %d: %s: %s (images that moved: `cxrground review "
                         "relink`)", index, a.id, exc.path, exc.reason)
            raise

    @app.post("/api/assignments/{assignment_id}/decision")
    async def api_decision(assignment_id: int, request: Request) -> dict[str, Any]:
        p = await run_in_threadpool(principal, request, allow_bearer=True)
        check_csrf(p, request.headers.get("x-csrf-token"))
        raw = await bounded_body(request)
        return await run_in_threadpool(decide, p, assignment_id, raw)

    def decide(p: _Principal, assignment_id: int, raw: bytes) -> dict[str, Any]:
        """Validate and commit one decision (in the thread pool: JSON, RLE, SQLite)."""
        a = visible(p, assignment_id)
        if a.user_id != p.user.id:
            raise _Forbidden("only the assigned reviewer decides on an assignment")
        body = _json_body(raw)
        if not isinstance(body, dict):
            raise _BadRequest("body must be a JSON object {part, decision, reason, mask, comment}")
        part, expected, overwrite = _write_guard(a, body)
        decision, reason = body.get("decision"), body.get("reason") or ""
        if not isinstance(decision, str) or decision not in DECISIONS:
            raise _BadRequest(f"decision must be one of {list(DECISIONS)}, got {decision!r}"[:300])
        comment = _comment(body.get("comment"))
        rle = None
        if decision == "reject":
            if not isinstance(reason, str) or reason not in REJECT_REASONS[a.item.kind]:
                raise _BadRequest(f"a rejection needs a reason from {list(REJECT_REASONS[a.item.kind])}")
        else:
            reason = ""
        if decision == "correct":
            decision, rle = corrected(a, body.get("mask"))
        if decision != "reject":
            shown(a)
        try:  # committed before we answer
            stored = db.write_decision(a.id, part, decision, reason, rle, comment=comment, expected_version=expected,
                                       overwrite=overwrite, via="token" if p.csrf is None else "session")
        except DecisionConflict as exc:
            raise _conflict(exc) from exc
        done, total, nxt = db.progress(p.user)
        parts_done = len(a.decisions.keys() | {part})
        return {"ok": True, "decision_id": stored.id, "decision": decision, "comment": comment,
                "version": stored.version, "updated": stored.updated,
                "assignment_done": parts_done >= len(a.item.parts), "done": done, "total": total, "next_open": nxt}

    @app.post("/api/assignments/{assignment_id}/comment")
    async def api_comment(assignment_id: int, request: Request) -> dict[str, Any]:
        p = await run_in_threadpool(principal, request, allow_bearer=True)
        check_csrf(p, request.headers.get("x-csrf-token"))
        raw = await bounded_body(request)
        return await run_in_threadpool(edit_comment, p, assignment_id, raw)

    def edit_comment(p: _Principal, assignment_id: int, raw: bytes) -> dict[str, Any]:
        """Change only the comment of a stored decision (the decision, reason and mask stay), with the decision
        route's version rules (in the thread pool)."""
        a = visible(p, assignment_id)
        if a.user_id != p.user.id:
            raise _Forbidden("only the assigned reviewer comments on an assignment")
        body = _json_body(raw)
        if not isinstance(body, dict):
            raise _BadRequest("body must be a JSON object {part, comment, expected_version}")
        part, expected, overwrite = _write_guard(a, body)
        if "comment" not in body:
            raise _BadRequest("the body needs 'comment' (the new text; empty removes the comment)")
        comment = _comment(body.get("comment"))
        try:
            stored = db.write_comment(a.id, part, comment, expected_version=expected, overwrite=overwrite,
                                      via="token" if p.csrf is None else "session")
        except DecisionConflict as exc:
            raise _conflict(exc) from exc
        return {"ok": True, "decision_id": stored.id, "comment": comment, "version": stored.version,
                "updated": stored.updated}

    def shown(a: Assignment) -> None:
        """Refuse (404/422) an accept or a correction of an item one of whose images the app cannot serve: the
        reviewer cannot have seen it (the page offers only a rejection as unreadable then)."""
        for index in range(len(a.item.images)):
            try:
                served_image(a, index)
            except _StoredImageError as exc:
                reason = UNREADABLE_REASON[a.item.kind]
                raise _Refused(exc.status, exc.kind, f"{exc.message}; an image the viewer cannot show cannot be "
                                                     f"accepted: reject it as '{reason}'") from exc

    def corrected(a: Assignment, mask: Any) -> tuple[str, dict[str, Any] | None]:
        """What a ``correct`` decision records: ``("correct", its mask)``, or ``("accept", None)`` when the mask is
        the generated one exactly. Refused (400): an item that is no positive ILS pair, a mask that is missing or
        malformed, and an empty mask (no lesion: that pair is to be rejected)."""
        if a.item.kind != "ils" or not a.item.positive:
            raise _BadRequest("only the mask of a positive ILS pair can be corrected")
        if not isinstance(mask, dict):
            raise _BadRequest("a correction needs 'mask': {size: [H, W], counts: [...]} at the native size")
        shape = (a.item.height, a.item.width)
        pixels = decode_rle(mask, shape)
        if not pixels.any():
            raise _BadRequest("the corrected mask is empty: an empty mask means no lesion, so reject the pair "
                              "(with a reason) instead of saving an empty mask")
        if a.item.mask and np.array_equal(pixels, decode_rle(a.item.mask, shape)):
            return "accept", None  # the generated mask unchanged: an accept, not a correction
        return "correct", encode_rle(pixels)

    @app.get("/api/stats")
    def api_stats(request: Request) -> dict[str, Any]:
        p = principal(request, allow_bearer=True)
        if not p.user.is_admin:
            raise _Forbidden("statistics are for admins")
        return review_stats(db)

    return app


def server_config(app: Any, host: str = "127.0.0.1", port: int = 8765, *, log_level: str = "info",
                  idle_timeout: float = IDLE_TIMEOUT_S, send_timeout: float = SEND_TIMEOUT_S,
                  max_connections: int = MAX_CONNECTIONS) -> Any:
    """The uvicorn configuration ``review serve`` runs ``app`` with: connections without a request closed after
    ``idle_timeout`` seconds (keep-alive ones after 5 s, or after ``idle_timeout`` when that is shorter), at most
    ``max_connections`` kept open by closing the one idle longest, and a connection whose client takes none of its
    response for ``send_timeout`` seconds dropped (:class:`~cxrground.net.connections.GuardedH11Protocol`, a class
    of its own for other limits than the defaults); the in-flight limit is inside the app."""
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, log_level=log_level,
                          http=guarded_protocol(idle_timeout, max_connections, send_timeout),
                          timeout_keep_alive=5, lifespan="off")


def serve(db_path: str | Path, host: str = "127.0.0.1", port: int = 8765, *, log_level: str = "info",
          secure_cookies: bool = False, connections: ConnectionLimits | None = None,
          session_hours: float = SESSION_SECONDS / 3600) -> None:
    """Run the app with uvicorn until interrupted (``secure_cookies``: the session cookie is ``Secure``, for a
    deployment behind HTTPS; ``connections``: the idle, body and send timeouts and the connection limit, by default
    :data:`IDLE_TIMEOUT_S`, :data:`BODY_TIMEOUT_S`, :data:`SEND_TIMEOUT_S` and :data:`MAX_CONNECTIONS`;
    ``session_hours``: how long a sign-in lasts)."""
    import uvicorn

    c = connections or ConnectionLimits()
    prepare_process()
    app = create_app(db_path, secure_cookies=secure_cookies, body_timeout=c.body_timeout, session_hours=session_hours)
    uvicorn.Server(server_config(app, host, port, log_level=log_level, idle_timeout=c.idle_timeout,
                                 send_timeout=c.send_timeout, max_connections=c.max_connections)).run()
