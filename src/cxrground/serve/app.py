"""The FastAPI application: ``/v1/segment``, the OpenAI-compatible ``/v1/chat/completions``, the web page.

Routes:

* ``POST /v1/segment`` — multipart (``image`` file + ``instruction`` field) or JSON
  ``{"image": "<base64 | data URL>", "instruction": ...}``; options ``mask_format`` (rle | png | both,
  default both), ``overlay`` and ``include_image`` as body fields or query parameters (the body wins).
  Answers :class:`~cxrground.serve.schemas.SegmentResponse`: ``answer``, ``structured``, ``mask`` (COCO
  RLE at the native size), ``mask_png`` (base64 PNG 0/255, native size), ``overlay_png`` (base64 RGB,
  the mask blended onto the image in :data:`OVERLAY_COLOUR` with :data:`OVERLAY_ALPHA` by
  :func:`cxrground.io.overlay.overlay_masks`), ``image_png`` (the 8-bit grey image the model saw),
  ``image_size`` ``[H, W]``, ``mask_pixels``, ``model`` and ``timing_ms``.
* ``POST /v1/chat/completions`` — see :mod:`cxrground.serve.openai_compat`.
* ``GET /v1/models`` (OpenAI list format), ``GET /health``, ``GET /v1/examples`` (example
  instructions rendered from :mod:`cxrground.vocab.ils_templates`), ``GET /`` (the web page) and
  ``/static/*``.

Errors are JSON ``{"error": {"type", "message", "code", "param"}}`` (the OpenAI error shape) with
status 400 (bad input, named), 401 (API key missing or wrong, see :mod:`cxrground.serve.access`),
404/405 (routing), 408 (the body did not arrive in time), 413 (body or image too large, too many pixels),
415 (unsupported image or body type), 422 (validation; 400 ``invalid_request_error`` on the OpenAI-compatible
route, as OpenAI answers), 500 (the model failed) and 503 (no model
loaded, or ``busy``). Limits: :class:`~cxrground.serve.limits.Limits`; the request body is bounded by
:attr:`Limits.max_body_bytes` before any parsing and must arrive within :attr:`Limits.body_timeout_s`.

The image routes' work (JSON parsing, image decoding, the model, encoding the answer) runs in worker threads,
never on the event loop, so ``/health`` and the other light routes answer at once whatever the image requests
do; at most :attr:`Limits.max_in_flight` image requests are worked on at once per process, and one that finds no
free slot within :attr:`Limits.busy_wait_s` seconds is answered 503 ``busy`` (with ``Retry-After``); a request whose
client has disconnected by the time its slot comes free is not worked on. Model calls
run under one lock: backends are not assumed thread-safe, so one prediction runs at a time per process (use
``--workers`` for parallelism). There are no Swagger or ReDoc pages (they load scripts from a CDN);
``/openapi.json`` describes the API.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import io
import json
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from PIL import Image
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cxrground import __version__
from cxrground.errors import InputError
from cxrground.io.image import CXRImage
from cxrground.io.masks import as_mask, encode_rle
from cxrground.io.overlay import PALETTE, overlay_masks
from cxrground.models.base import IlsModel, IlsOutput
from cxrground.net.connections import BodyDeadline, BodyTimeout
from cxrground.serve.access import AccessPolicy, install_access
from cxrground.serve.decode import decode_image_bytes, decode_image_string
from cxrground.serve.limits import STALLED_BODY_BYTES, STALLED_BODY_S, ApiError, Limits
from cxrground.serve.openai_compat import chat_input, completion_body, max_tokens_of
from cxrground.serve.schemas import ChatCompletionRequest, SegmentRequest
from cxrground.vocab import ils_templates
from cxrground.vocab.lesions import LESIONS
from cxrground.vocab.locations import ILS_LOCATION_LABELS
from cxrground.vocab.traits import traits

__all__ = ["OVERLAY_ALPHA", "OVERLAY_COLOUR", "STATIC_DIR", "create_app", "example_instructions"]

STATIC_DIR: Final[Path] = Path(__file__).resolve().parent / "static"
#: Colour (RGB in [0, 1]) and opacity of the mask in ``overlay_png`` (with a 1-px outline); the web page draws
#: the same blend without the outline.
OVERLAY_COLOUR: Final[tuple[float, float, float]] = PALETTE[0]
OVERLAY_ALPHA: Final[float] = 0.45
#: Content-Security-Policy of the web page: nothing is loaded from outside the server.
PAGE_CSP: Final[str] = ("default-src 'self'; img-src 'self' data: blob:; style-src 'self'; script-src 'self'; "
                        "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'")
_T = TypeVar("_T")
#: How often a request body waiting for room in the held-body budget looks again (seconds).
_ROOM_POLL_S: Final[float] = 0.05


class _WorkGate:
    """At most ``slots`` image requests worked on at once, each in a worker thread; a request that finds no free
    slot within ``wait_s`` seconds is refused with 503 ``busy``, and one whose client has gone when its slot comes
    free is dropped without being worked on."""

    def __init__(self, slots: int, wait_s: float) -> None:
        self.slots = slots
        self.wait_s = wait_s
        self._free = asyncio.Semaphore(slots)

    async def run(self, work: Callable[[], _T], request: Request | None = None) -> _T:
        """``work()`` in a worker thread once a slot is free, unless the client of ``request`` has gone by then
        (:class:`ClientDisconnect`: a request nobody waits for is not worked on)."""
        try:
            async with asyncio.timeout(self.wait_s):
                await self._free.acquire()
        except TimeoutError:
            raise ApiError(503, "busy", f"the server is working on {self.slots} image requests; "
                                        "retry in a few seconds") from None
        try:
            if request is not None and await request.is_disconnected():
                raise ClientDisconnect()
            return await run_in_threadpool(work)
        finally:
            self._free.release()


class _ServerState:
    """The loaded model, its identity, the limits, the gate of image requests and the lock that serialises
    predictions."""

    def __init__(self, model: IlsModel | None, limits: Limits, checkpoint: str | None) -> None:
        self.model = model
        self.limits = limits
        self.checkpoint = checkpoint
        self.gate = _WorkGate(limits.max_in_flight, limits.busy_wait_s)
        self.lock = threading.Lock()
        self.started = int(time.time())

    @property
    def model_id(self) -> str:
        return self.model.name if self.model is not None else "none"

    def predict(self, image: CXRImage, instruction: str) -> IlsOutput:
        """One prediction under the lock; model input errors become 400s."""
        if self.model is None:
            raise ApiError(503, "model_not_loaded", "no model is loaded; try again once the server is ready")
        with self.lock:
            try:
                output = self.model.predict(image, instruction)
            except InputError as exc:
                raise ApiError(400, "invalid_request", f"the model cannot use this input: {exc.reason}") from exc
        if tuple(np.shape(output.mask)) != image.shape:
            raise ApiError(500, "model_error",
                           f"the model returned a mask of shape {np.shape(output.mask)} for an image of {image.shape}")
        return output


@dataclass(eq=False)
class _HeldBody:
    """A request body being received or held by :class:`_BodyLimit`: its bytes so far, whether it is complete, when
    it last made progress (:data:`~cxrground.serve.limits.STALLED_BODY_BYTES` more bytes) and the events that drop
    it and say it has given its bytes back."""

    progress_at: float
    held: int = 0
    progress_mark: int = 0
    complete: bool = False
    dropped: asyncio.Event = field(default_factory=asyncio.Event)
    released: asyncio.Event = field(default_factory=asyncio.Event)


class _BodyLimit:
    """ASGI middleware: refuse request bodies over ``max_bytes`` (by Content-Length, then as they stream; 413), and
    a body whose bytes would make all the bodies held at once exceed ``max_held`` for longer than ``wait_s`` seconds
    (503 ``busy``); either answer closes the connection. A request's bytes count as held until its answer is sent.

    While a body waits for room, room is made by dropping bodies that have stalled: incomplete bodies that received
    fewer than ``stall_bytes`` bytes in the last ``stall_s`` seconds, the longest stalled first (each is answered 408
    ``request_timeout`` and its connection closed). A few clients that send most of a large body and then stop can
    therefore not keep everyone else's requests out until the body timeout; bodies that keep arriving are never
    dropped, and complete ones (waiting for or in the model) never."""

    def __init__(self, app: ASGIApp, max_bytes: int, max_held: int | None = None, *, wait_s: float = 0.0,
                 stall_s: float = STALLED_BODY_S, stall_bytes: int = STALLED_BODY_BYTES) -> None:
        self.app = app
        self.wait_s = wait_s
        self.max_bytes = max_bytes
        self.max_held = max_held
        self.stall_s = stall_s
        self.stall_bytes = stall_bytes
        self.held = 0  # body bytes of the requests in progress (one event loop: no lock needed)
        self.bodies: set[_HeldBody] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await _too_large(self.max_bytes, int(declared))(scope, receive, send)
            return
        body = _HeldBody(progress_at=time.monotonic())
        self.bodies.add(body)

        async def limited() -> Message:
            message = await (receive() if body.complete else self._receive_unless_dropped(receive, body))
            if message["type"] == "http.request":
                size = len(message.get("body", b""))
                if body.held + size > self.max_bytes:
                    raise ApiError(413, "payload_too_large",
                                   f"request body exceeds the limit of {self.max_bytes} bytes", close=True)
                if self.max_held is not None and self.held + size > self.max_held:
                    await self._make_room(size, body)
                body.held += size
                self.held += size
                if not message.get("more_body", False):
                    body.complete = True
                elif body.held - body.progress_mark >= self.stall_bytes:
                    body.progress_mark, body.progress_at = body.held, time.monotonic()
            return message

        try:
            await self.app(scope, limited, send)
        finally:
            self.held -= body.held
            self.bodies.discard(body)
            body.released.set()

    async def _receive_unless_dropped(self, receive: Receive, body: _HeldBody) -> Message:
        """The next message, unless ``body`` is dropped first (then 408, closing the connection)."""
        if not body.dropped.is_set():
            message = asyncio.ensure_future(receive())
            dropped = asyncio.ensure_future(body.dropped.wait())
            try:
                await asyncio.wait((message, dropped), return_when=asyncio.FIRST_COMPLETED)
                received = message.done()
            finally:
                dropped.cancel()
                if not message.done():
                    message.cancel()
            if received:
                return message.result()
        raise ApiError(408, "request_timeout", f"the request body stalled (under {self.stall_bytes} bytes in "
                                               f"{self.stall_s:g} s) while other requests needed the memory it held; "
                                               "send the body without pauses", close=True)

    async def _make_room(self, size: int, body: _HeldBody) -> None:
        """Wait until ``size`` more bytes fit, for at most ``wait_s`` seconds: bodies finishing give theirs back, and
        stalled ones (the longest stalled first) are dropped as soon as that makes room enough; then 503 ``busy``."""
        assert self.max_held is not None
        deadline = time.monotonic() + self.wait_s
        while self.held + size > self.max_held:
            now = time.monotonic()
            stalled = sorted((b for b in self.bodies if b is not body and b.held > 0 and not b.complete
                              and not b.dropped.is_set() and now - b.progress_at >= self.stall_s),
                             key=lambda b: b.progress_at)
            victims, free = [], self.max_held - self.held
            for victim in stalled:
                if free >= size:
                    break
                victims.append(victim)
                free += victim.held
            if free >= size and victims:
                for victim in victims:
                    victim.dropped.set()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.stall_s):
                        await asyncio.gather(*(v.released.wait() for v in victims))
                continue
            if now >= deadline:
                raise ApiError(503, "busy", "the server is receiving other large requests; retry in a few seconds",
                               close=True)
            await asyncio.sleep(min(_ROOM_POLL_S, max(0.0, deadline - now)))


def _too_large(limit: int, size: int) -> JSONResponse:
    err = ApiError(413, "payload_too_large", f"request body is {size} bytes; the limit is {limit} bytes")
    return JSONResponse(err.body(), status_code=413, headers={"Connection": "close"})


def example_instructions() -> list[str]:
    """One example instruction per lesion and instruction type, rendered by the vocab templates."""
    examples = [ils_templates.instruction("global", lesion) for lesion in LESIONS]
    examples += [ils_templates.instruction("basic", lesion, [ILS_LOCATION_LABELS[i % 2]])
                 for i, lesion in enumerate(LESIONS) if not traits(lesion).heart_mask]
    examples.append(ils_templates.instruction("lesion_inference", ils_templates.TENTATIVE_WORD,
                                              [ILS_LOCATION_LABELS[0]]))
    return examples


def create_app(model: IlsModel | None, limits: Limits | None = None, *, checkpoint: str | None = None,
               access: AccessPolicy | None = None) -> FastAPI:
    """The server for ``model`` (None: every prediction answers 503 until ``app.state.cxr.model`` is set).

    ``access``: API key and CORS origins (:mod:`cxrground.serve.access`; default: no key, no CORS).
    """
    state = _ServerState(model, limits or Limits(), checkpoint)
    app = FastAPI(title="cxrground", version=__version__, docs_url=None, redoc_url=None,
                  description="Lesion grounding in chest X-rays: instruction + image → answer + mask.")
    app.state.cxr = state
    app.add_middleware(_BodyLimit, max_bytes=state.limits.max_body_bytes, max_held=state.limits.max_bodies_bytes,
                       wait_s=state.limits.busy_wait_s)
    app.add_middleware(BodyDeadline, timeout=state.limits.body_timeout_s)
    install_access(app, access or AccessPolicy())  # outside the body limit: unauthorised bodies are not read
    _add_error_handlers(app)
    _add_info_routes(app, state)
    _add_predict_routes(app, state)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    _document_bodies(app)
    return app


def _document_bodies(app: FastAPI) -> None:
    """Describe the bodies the two prediction routes read and answer in ``/openapi.json`` (the routes read their
    bodies themselves, under the server's limits, so FastAPI cannot infer them): the schemas of
    :mod:`cxrground.serve.schemas` as components, referenced from each route's request body and responses."""
    from cxrground.serve.schemas import (
        ChatCompletion,
        ChatCompletionRequest,
        ErrorResponse,
        SegmentRequest,
        SegmentResponse,
    )

    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        doc = generate()
        components = doc.setdefault("components", {}).setdefault("schemas", {})

        def ref(model: Any) -> dict[str, str]:
            schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            for name, sub in schema.pop("$defs", {}).items():
                components.setdefault(name, sub)
            components[model.__name__] = schema
            return {"$ref": f"#/components/schemas/{model.__name__}"}

        multipart = {"type": "object", "required": ["image", "instruction"], "properties": {
            "image": {"type": "string", "format": "binary"}, "instruction": {"type": "string"},
            "mask_format": {"type": "string", "enum": ["rle", "png", "both"]}, "overlay": {"type": "boolean"},
            "include_image": {"type": "boolean"}}}
        routes = (("/v1/segment", {"application/json": {"schema": ref(SegmentRequest)},
                                   "multipart/form-data": {"schema": multipart}}, SegmentResponse),
                  ("/v1/chat/completions", {"application/json": {"schema": ref(ChatCompletionRequest)}},
                   ChatCompletion))
        error = ref(ErrorResponse)
        for path, body, answer in routes:
            operation = doc["paths"][path]["post"]
            operation["requestBody"] = {"required": True, "content": body}
            for status, response in operation.setdefault("responses", {}).items():
                schema = ref(answer) if status == "200" else error
                response.setdefault("description", "OK" if status == "200" else "Error")
                response["content"] = {"application/json": {"schema": schema}}
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        headers = {"Retry-After": "1"} if exc.status == 503 else {}
        if exc.close:
            headers["Connection"] = "close"
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers or None)

    @app.exception_handler(BodyTimeout)
    async def _body_timeout(request: Request, exc: BodyTimeout) -> JSONResponse:
        err = ApiError(408, "request_timeout", str(exc))
        return JSONResponse(err.body(), status_code=408, headers={"Connection": "close"})

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, exc: ClientDisconnect) -> Response:
        return Response(status_code=400)  # nobody reads it: the client is gone

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(_validation_error(exc.errors()).body(), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kinds = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed"}
        err = ApiError(exc.status_code, kinds.get(exc.status_code, "http_error"), str(exc.detail))
        return JSONResponse(err.body(), status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        err = ApiError(500, "server_error", f"internal error ({type(exc).__name__}: {exc})")
        return JSONResponse(err.body(), status_code=500)


def _validation_error(errors: Any, status: int = 422, kind: str = "validation_error") -> ApiError:
    """One error for pydantic's validation ``errors``: every field named with its reason, ``param`` the first
    field (422 ``validation_error``; the OpenAI-compatible route passes 400 ``invalid_request_error``, as OpenAI
    and vLLM answer)."""
    parts, fields = [], []
    for e in errors:
        where = ".".join(str(p) for p in e.get("loc", ()) if p != "body")
        parts.append(f"{where or 'body'}: {e.get('msg', 'invalid')}")
        if where:
            fields.append(where)
    return ApiError(status, kind, "; ".join(parts) or "invalid request", param=fields[0] if fields else None)


def _get_and_head(app: FastAPI, path: str, **options: Any) -> Callable[[Any], Any]:
    """Register a GET route that also answers HEAD (RFC 9110; the HEAD twin is left out of the OpenAPI document,
    whose operation ids must be unique)."""
    def register(fn: Any) -> Any:
        app.add_api_route(path, fn, methods=["HEAD"], include_in_schema=False)
        return app.get(path, **options)(fn)

    return register


def _add_info_routes(app: FastAPI, state: _ServerState) -> None:
    @_get_and_head(app, "/health")
    async def health() -> dict[str, Any]:
        """Liveness and what is served."""
        return {"status": "ok" if state.model is not None else "loading", "model": state.model_id,
                "checkpoint": state.checkpoint, "version": __version__, "limits": asdict(state.limits)}

    def model_card() -> dict[str, Any]:
        return {"id": state.model_id, "object": "model", "created": state.started, "owned_by": "cxrground"}

    @_get_and_head(app, "/v1/models")
    async def models() -> dict[str, Any]:
        """The served model in the OpenAI list format."""
        return {"object": "list", "data": [] if state.model is None else [model_card()]}

    @_get_and_head(app, "/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        """The served model in the OpenAI model format, when ``model_id`` names it."""
        if state.model is None or model_id != state.model_id:
            raise ApiError(404, "not_found", f"model {model_id!r} is not served here (GET /v1/models lists it)",
                           param="model")
        return model_card()

    @_get_and_head(app, "/v1/examples")
    async def examples() -> dict[str, Any]:
        """Example instructions for the web page, from the vocab templates."""
        return {"instructions": example_instructions(), "lesions": list(LESIONS)}

    @_get_and_head(app, "/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html",
                            headers={"Content-Security-Policy": PAGE_CSP, "Cache-Control": "no-store"})


def _add_predict_routes(app: FastAPI, state: _ServerState) -> None:
    @app.post("/v1/segment", responses={400: {}, 408: {}, 413: {}, 415: {}, 422: {}, 503: {}})
    async def segment(request: Request) -> JSONResponse:
        """Segment what the instruction asks for; answer text, structured result and mask."""
        t0 = time.perf_counter()
        ctype = request.headers.get("content-type", "")
        query = {k: v for k, v in request.query_params.items() if k in ("mask_format", "overlay", "include_image")}
        if ctype.startswith("multipart/form-data"):
            fields, data = await _read_upload(request)
            work = functools.partial(_segment_work, state, {**query, **fields}, t0, upload=data)
        else:
            work = functools.partial(_segment_work, state, query, t0,
                                     raw_json=await _read_json_body(request, multipart_too=True))
        return await state.gate.run(work, request)

    @app.post("/v1/chat/completions", responses={400: {}, 408: {}, 413: {}, 415: {}, 503: {}})
    async def chat_completions(request: Request) -> JSONResponse:
        """OpenAI-compatible chat completion: answer text plus the ``cxrground`` grounding field."""
        raw = await _read_json_body(request)
        return await state.gate.run(functools.partial(_chat_work, state, raw), request)


async def _read_json_body(request: Request, multipart_too: bool = False) -> bytes:
    """The raw body of a request that must be JSON (415 for another content type; ``multipart_too``: the route
    also takes a multipart form, and the message says so)."""
    ctype = request.headers.get("content-type", "")
    if "json" not in ctype:
        wanted = "application/json or multipart/form-data (fields image, instruction)" if multipart_too else \
            "application/json"
        raise ApiError(415, "unsupported_media_type", f"send {wanted}, not {ctype or 'no content type'}")
    return await request.body()


def _parse_json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:  # ValueError: not JSON, not UTF-8, an integer too long to convert
        kind = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
        raise ApiError(400, "invalid_request", f"body is not valid JSON ({kind})") from None


async def _read_upload(request: Request) -> tuple[dict[str, str], bytes]:
    """The text fields and the ``image`` file of a multipart segment request."""
    async with request.form(max_files=1, max_fields=8) as form:
        upload = form.get("image")
        if upload is None or isinstance(upload, str):
            raise ApiError(400, "invalid_request", "multipart field 'image' must be an uploaded file")
        data = await upload.read()
        fields = {k: v for k, v in form.items() if k != "image" and isinstance(v, str)}
    return fields, data


def _segment_work(state: _ServerState, fields: dict[str, Any], t0: float, *, upload: bytes | None = None,
                  raw_json: bytes | None = None) -> JSONResponse:
    """The answer to a segment request (in a worker thread): options, image, model, encoded response."""
    if upload is not None:
        req = _validate_segment({**fields, "image": ""})
        image = decode_image_bytes(upload, state.limits)
    else:
        payload = _parse_json(raw_json or b"")
        if not isinstance(payload, dict):
            raise ApiError(422, "validation_error", "body must be a JSON object")
        req = _validate_segment({**fields, **payload})
        image = decode_image_string(req.image, state.limits)
    instruction = _check_instruction(req.instruction, state.limits)
    t1 = time.perf_counter()
    output = state.predict(image, instruction)
    t2 = time.perf_counter()
    body = _segment_body(state, req, image, output)
    t3 = time.perf_counter()
    body["timing_ms"] = {"decode": _ms(t1 - t0), "model": _ms(t2 - t1), "encode": _ms(t3 - t2),
                         "total": _ms(t3 - t0)}
    return JSONResponse(body)


def _chat_work(state: _ServerState, raw: bytes) -> JSONResponse:
    """The answer to a chat-completions request (in a worker thread)."""
    try:
        req = ChatCompletionRequest.model_validate(_parse_json(raw))
    except ValidationError as exc:
        raise _validation_error(exc.errors(), 400, "invalid_request_error") from exc
    url, instruction = chat_input(req, state.limits)
    instruction = _check_instruction(instruction, state.limits)
    image = decode_image_string(url, state.limits, data_url_only=True)
    output = state.predict(image, instruction)
    extra = {"structured": output.structured(), "mask": encode_rle(as_mask(output.mask)),
             "image_size": list(image.shape)}
    return JSONResponse(completion_body(state.model_id, output.answer, instruction, extra, max_tokens_of(req)))


def _validate_segment(fields: dict[str, Any]) -> SegmentRequest:
    try:
        return SegmentRequest.model_validate(fields)
    except ValidationError as exc:
        raise _validation_error(exc.errors()) from exc


def _check_instruction(text: str, limits: Limits) -> str:
    text = text.strip()
    if not text:
        raise ApiError(400, "invalid_request", "the instruction is empty")
    if len(text) > limits.max_instruction_chars:
        raise ApiError(400, "invalid_request",
                       f"the instruction has {len(text)} characters; the limit is {limits.max_instruction_chars}")
    return text


def _segment_body(state: _ServerState, req: SegmentRequest, image: CXRImage, output: IlsOutput) -> dict[str, Any]:
    mask = as_mask(output.mask)
    body: dict[str, Any] = {
        "answer": output.answer,
        "structured": output.structured(),
        "image_size": list(image.shape),
        "mask_pixels": int(mask.sum()),
        "model": {"name": state.model_id, "checkpoint": state.checkpoint},
    }
    if req.mask_format in ("rle", "both"):
        body["mask"] = encode_rle(mask)
    if req.mask_format in ("png", "both"):
        body["mask_png"] = _png_base64(mask.astype(np.uint8) * 255)
    if req.overlay:
        body["overlay_png"] = _png_base64(overlay_masks(image.pixels, [mask], [OVERLAY_COLOUR], OVERLAY_ALPHA))
    if req.include_image:
        body["image_png"] = _png_base64(image.pixels)
    return body


def _png_base64(pixels: np.ndarray) -> str:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 2)
