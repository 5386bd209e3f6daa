"""Who may call the server: an optional API key and CORS (off unless origins are given).

* **API key** (``cxrground serve --api-key-env NAME``: the key is read from the environment variable
  ``NAME``, never from the command line, so it does not show in process lists). When set, every
  request except ``GET /health`` must carry it as ``Authorization: Bearer <key>`` (what the OpenAI
  clients send for their ``api_key``) or as an ``api-key: <key>`` header (the Azure OpenAI clients').
  The key is compared with :func:`hmac.compare_digest`. A request without it, or with another, gets
  **401** ``invalid_api_key`` (JSON error body, ``WWW-Authenticate: Bearer``) before its body is read.
  The web page and its static files are routes too: with a key, a browser reaches them only through a
  proxy that adds the header.
* **CORS**: no ``Access-Control-*`` header is ever sent unless origins are given
  (``--cors-origin ORIGIN``, repeatable); then Starlette's ``CORSMiddleware`` answers preflights for
  exactly those origins (methods GET/POST, headers ``Authorization``, ``api-key``, ``Content-Type``).
  Preflight requests carry no credentials, so they are answered before the key is checked.
"""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass, field
from typing import Final

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from cxrground.errors import ConfigError
from cxrground.serve.limits import ApiError

__all__ = ["OPEN_PATHS", "AccessPolicy", "ApiKeyGate", "install_access", "read_api_key"]

#: Paths answered without the key.
OPEN_PATHS: Final[frozenset[str]] = frozenset({"/health"})
#: Request headers a browser may send cross-origin when CORS is on.
#: Request headers a cross-origin browser call may send: any (``*``). Credentials travel in headers (a key), never in
#: cookies, so no header can carry an ambient credential; the official OpenAI JavaScript client adds its own
#: ``X-Stainless-*`` headers, whose set changes between its versions.
CORS_HEADERS: Final[tuple[str, ...]] = ("*",)


@dataclass(frozen=True)
class AccessPolicy:
    """The API key (None: no key needed), the variable it came from, and the CORS origins allowed."""

    api_key: str | None = field(default=None, repr=False)
    api_key_env: str | None = None
    cors_origins: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("the API key must not be empty")
        object.__setattr__(self, "cors_origins", tuple(self.cors_origins))


def read_api_key(env_name: str) -> str:
    """The API key held by environment variable ``env_name`` (stripped); ConfigError when unset or blank."""
    value = os.environ.get(env_name, "").strip()
    if not value:
        raise ConfigError(f"environment variable {env_name} (named by --api-key-env) is unset or empty; "
                          "export the API key in it")
    return value


def _presented_key(headers: dict[bytes, bytes]) -> bytes | None:
    auth = headers.get(b"authorization", b"")
    scheme, _, token = auth.partition(b" ")
    if scheme.lower() == b"bearer" and token.strip():
        return token.strip()
    return headers.get(b"api-key")


class ApiKeyGate:
    """ASGI middleware: refuse every HTTP request but :data:`OPEN_PATHS` without the right key (401)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._key = api_key.encode("utf-8")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        presented = _presented_key(dict(scope.get("headers") or []))
        if presented is not None and hmac.compare_digest(presented, self._key):
            await self.app(scope, receive, send)
            return
        reason = "no API key was sent" if presented is None else "the API key is not valid"
        err = ApiError(401, "invalid_api_key",
                       f"{reason}; send it as 'Authorization: Bearer <key>' or an 'api-key' header")
        await JSONResponse(err.body(), status_code=401, headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)


def install_access(app: ASGIApp, policy: AccessPolicy) -> None:
    """Add the key check and (when origins are given) CORS to a FastAPI ``app``; call after its other middleware."""
    if policy.api_key is not None:
        app.add_middleware(ApiKeyGate, api_key=policy.api_key)  # type: ignore[attr-defined]
    if policy.cors_origins:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(policy.cors_origins),  # type: ignore[attr-defined]
                           allow_methods=["GET", "POST"], allow_headers=list(CORS_HEADERS))
