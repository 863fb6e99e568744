"""The shared secret in front of every Streamlit route: an ASGI middleware on the dashboard's ``st.App`` (app/main.py).

With a secret set, a request without this server start's signed cookie gets the login form (401) and nothing of
Streamlit: no page, websocket, upload, media, component, static file or metrics. The form posts the secret to
``/_gate/login``; the right one gets an HMAC-signed cookie (a random key per start, HttpOnly, SameSite=Strict,
valid ``COOKIE_MAX_AGE_S``), wrong ones count towards the client address's back-off (app/backoff.py: 429 and a wait).
``/_stcore/health`` stays open for GET and HEAD with Streamlit's headers dropped: it says "ok" or not, nothing else.
With or without a secret, a websocket whose ``Origin`` is not the ``Host`` it connects to is refused here, so
Streamlit's own origin check never looks up this machine's external IP (an HTTP call to an outside address).
Without a secret (loopback only), a request whose ``Host`` or ``Origin`` names anything but this machine's loopback
is refused (403): a page on another name that resolves here (DNS rebinding) gets nothing.

Stdlib only at import (run_app.py uses ``check_secret`` and ``is_loopback``); Streamlit is imported by
``streamlit_middleware`` alone.
"""
from __future__ import annotations

import hashlib
import hmac
import html
import ipaddress
import logging
import math
import secrets
import sys
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

from app.backoff import Backoff, client_key

SECRET_ENV = "COMPATLAB_SECRET"  # declared in storage.settings (SECRET); this module stays stdlib-only at import
MIN_SECRET_CHARS = 16
COOKIE_NAME = "compatlab_gate"
COOKIE_MAX_AGE_S = 12 * 3600
LOGIN_PATH = "/_gate/login"
HEALTH_PATH = "/_stcore/health"
MAX_FORM_BYTES = 4096
HEALTH_HEADERS = (b"content-type", b"content-length", b"cache-control")

_LOG = logging.getLogger(__name__)
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only: ``localhost``, 127.0.0.0/8 or ::1."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_secret(secret: str) -> str:
    """``secret`` if it is long enough to be a secret, else ValueError with one line saying how to make one."""
    if len(secret) < MIN_SECRET_CHARS:
        raise ValueError(f"the shared secret has {len(secret)} characters; use at least {MIN_SECRET_CHARS} "
                         "(for example: python -c \"import secrets; print(secrets.token_urlsafe(24))\")")
    return secret


def check_start(address: str | None, secret: str | None) -> None:
    """ValueError (one line) when the server would listen beyond loopback without a secret, or the secret is short.

    ``address`` is Streamlit's ``server.address``; unset, Streamlit listens on every interface.
    """
    if secret is not None:
        check_secret(secret)
    elif address is None or not is_loopback(address):
        raise ValueError(f"--server.address {address or '(unset: every interface)'} would let anyone on the network "
                         f"use the dashboard; set ${SECRET_ENV} (at least {MIN_SECRET_CHARS} characters) "
                         "or listen on 127.0.0.1")


def streamlit_middleware(*, check_address: bool) -> list[Any]:
    """The gate as ``st.App`` middleware, set up from ``$COMPATLAB_SECRET`` and Streamlit's config.

    Refuses to start (one line on stderr, exit 2) on a short secret, or, with ``check_address``, on a
    non-loopback ``server.address`` without a secret.
    """
    from starlette.middleware import Middleware
    from streamlit import config

    from storage.settings import SECRET, read_setting

    secret = read_setting(SECRET)
    try:
        check_start(config.get_option("server.address") if check_address else "127.0.0.1", secret)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    base = config.get_option("server.baseUrlPath").strip("/")
    return [Middleware(SecretGate, secret=secret, base_path=f"/{base}" if base else "",
                       secure_cookie=bool(config.get_option("server.sslCertFile")))]


class SecretGate:
    """ASGI middleware: the secret before any route, the login form, the signed cookie, same-origin websockets."""

    def __init__(self, app: ASGIApp, *, secret: str | None, base_path: str = "", secure_cookie: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.app = app
        self.secret = None if secret is None else check_secret(secret)
        self.login_path = base_path + LOGIN_PATH
        self.health_path = base_path + HEALTH_PATH
        self.home = base_path + "/"
        self.secure_cookie = secure_cookie
        self.clock = clock
        self.backoff = Backoff(clock)
        self._key = secrets.token_bytes(32)  # per start: a restart signs everyone out

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.secret is None and scope["type"] in ("http", "websocket") and not _loopback_host(scope):
            # no secret means loopback only: a page whose name resolves here (DNS rebinding) is not this dashboard
            if scope["type"] == "websocket":
                await receive()
                await send({"type": "websocket.close", "code": 1008})
            else:
                await _plain(send, 403, "This dashboard answers to localhost only (start it with --host and a secret "
                                        "to serve other names).")
            return
        if scope["type"] == "websocket":
            if not _same_origin(scope) or not self._signed_in(scope):
                await receive()  # websocket.connect
                await send({"type": "websocket.close", "code": 1008})  # before accept: the server answers 403
                return
        elif scope["type"] == "http" and self.secret is not None:
            if scope["path"] == self.login_path:
                await self._login(scope, receive, send)
                return
            if not self._signed_in(scope):
                if scope["path"] == self.health_path and scope["method"] in ("GET", "HEAD"):
                    await self.app(scope, receive, _only_headers(send, HEALTH_HEADERS))
                else:
                    await self._page(send, 401, self._next(scope), "", head=scope["method"] == "HEAD")
                return
        await self.app(scope, receive, send)

    def _signed_in(self, scope: Scope) -> bool:
        if self.secret is None:
            return True
        value = _cookie(scope, COOKIE_NAME)
        expires, _, mac = (value or "").partition(".")
        if not (expires.isascii() and expires.isdigit()):
            return False
        if not hmac.compare_digest(mac.encode("latin-1"), self._sign(expires).encode("ascii")):
            return False
        return int(expires) > self.clock()

    def _sign(self, expires: str) -> str:
        return hmac.new(self._key, f"compatlab-gate:{expires}".encode(), hashlib.sha256).hexdigest()

    async def _login(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "POST":
            if self._signed_in(scope):
                await _redirect(send, self.home, [])
            else:
                await self._page(send, 200, self.home, "", head=scope["method"] == "HEAD")
            return
        body = await _read_body(receive, MAX_FORM_BYTES)
        if body is None:
            await _plain(send, 413, "the form is too large")
            return
        try:
            form = parse_qs(body.decode("utf-8", "replace"), max_num_fields=4)
        except ValueError:
            await _plain(send, 400, "not a login form")
            return
        given, next_path = form.get("secret", [""])[0], self._safe_next(form.get("next", [""])[0])
        key = client_key((scope.get("client") or (None,))[0])
        wait = self.backoff.wait_s(key)  # checked and recorded with no await between: parallel guesses count too
        if wait > 0:
            await self._page(send, 429, next_path, f"Too many wrong secrets from your address; try again in "
                             f"{math.ceil(wait)} s.", extra=[(b"retry-after", str(math.ceil(wait)).encode())])
            return
        if not hmac.compare_digest(given.encode("utf-8"), self.secret.encode("utf-8")):
            wait = self.backoff.failed(key)
            later = f" Wait {math.ceil(wait)} s before the next try." if wait else ""
            if wait:
                _LOG.warning("wrong shared secrets from %s: held back %d s", key, math.ceil(wait))
            await self._page(send, 401, next_path, "That is not the secret." + later)
            return
        self.backoff.succeeded(key)
        expires = str(int(self.clock() + COOKIE_MAX_AGE_S))
        cookie = (f"{COOKIE_NAME}={expires}.{self._sign(expires)}; Path={self.home}; HttpOnly; SameSite=Strict"
                  + ("; Secure" if self.secure_cookie else ""))
        await _redirect(send, next_path, [(b"set-cookie", cookie.encode("latin-1"))])

    def _next(self, scope: Scope) -> str:
        """Where the login form returns to: the path asked for, with its query."""
        path = scope.get("raw_path") or scope["path"].encode("utf-8")
        query = scope.get("query_string", b"")
        return self._safe_next((path + (b"?" + query if query else b"")).decode("latin-1"))

    def _safe_next(self, path: str) -> str:
        """``path`` when it is a path on this server (printable ASCII; no scheme, host or backslash), else home."""
        if (not path.startswith(self.home) or path.startswith("//") or "\\" in path
                or not all(32 < ord(c) < 127 for c in path) or urlsplit(path).netloc):
            return self.home
        return path

    async def _page(self, send: Send, status: int, next_path: str, message: str, *, head: bool = False,
                    extra: list[tuple[bytes, bytes]] | None = None) -> None:
        body = LOGIN_PAGE.format(action=html.escape(self.login_path), next=html.escape(next_path),
                                 message=html.escape(message)).encode("utf-8")
        await _respond(send, status, b"" if head else body, b"text/html; charset=utf-8", extra or [])


LOGIN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Compatibility Lab</title>
<style>body{{font-family:system-ui,sans-serif;margin:0;display:grid;place-items:center;min-height:100vh;
background:#f6f7f9}}
main{{background:#fff;padding:2rem 2.5rem;border-radius:.75rem;box-shadow:0 1px 4px #0002;max-width:24rem}}
input{{display:block;width:100%;box-sizing:border-box;margin:.5rem 0 1rem;padding:.5rem;font-size:1rem}}
button{{padding:.5rem 1.25rem;font-size:1rem}} .error{{color:#b00020}}</style></head>
<body><main><h1>Compatibility Lab</h1>
<form method="post" action="{action}"><input type="hidden" name="next" value="{next}">
<label for="secret">Shared secret (ask the person who started the dashboard)</label>
<input id="secret" type="password" name="secret" autocomplete="current-password" required autofocus>
<button type="submit">Enter</button></form>
<p class="error" role="alert">{message}</p></main></body></html>
"""
SECURITY_HEADERS = [
    (b"cache-control", b"no-store"),
    (b"content-security-policy",
     b"default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _cookie(scope: Scope, name: str) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == b"cookie":
            for part in value.decode("latin-1").split(";"):
                cookie_name, _, cookie_value = part.strip().partition("=")
                if cookie_name == name:
                    return cookie_value
    return None


def _loopback_host(scope: Scope) -> bool:
    """Whether the request names this machine's loopback in ``Host`` (and in ``Origin`` when a browser sends one): a
    request without ``Host`` is not a browser's and passes."""
    for name in (b"host", b"origin"):
        value = _header(scope, name)
        if value is None or (name == b"origin" and value == "null"):
            continue
        hostname = urlsplit(value if name == b"origin" else f"//{value}").hostname or ""
        if not is_loopback(hostname):
            return False
    return True


def _same_origin(scope: Scope) -> bool:
    """A websocket without ``Origin`` (not a browser) or whose ``Origin`` is the host it connects to."""
    origin = _header(scope, b"origin")
    if origin is None:
        return True
    return urlsplit(origin).netloc.lower() == (_header(scope, b"host") or "").lower()


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The request body, or None once it passes ``limit`` bytes (or the client left)."""
    body = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        body += message.get("body", b"")
        if len(body) > limit:
            return None
        if not message.get("more_body"):
            return body


def _only_headers(send: Send, keep: tuple[bytes, ...]) -> Send:
    """``send`` with every response header but ``keep`` dropped (no cookies, no CORS)."""
    async def bare(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [(k, v) for k, v in message.get("headers", []) if k.lower() in keep]}
        await send(message)
    return bare


async def _respond(send: Send, status: int, body: bytes, content_type: bytes,
                   extra: list[tuple[bytes, bytes]]) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode()),
               *SECURITY_HEADERS, *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _plain(send: Send, status: int, text: str) -> None:
    await _respond(send, status, text.encode("utf-8"), b"text/plain; charset=utf-8", [])


async def _redirect(send: Send, location: str, extra: list[tuple[bytes, bytes]]) -> None:
    await _respond(send, 303, b"", b"text/plain; charset=utf-8", [(b"location", location.encode("latin-1")), *extra])
