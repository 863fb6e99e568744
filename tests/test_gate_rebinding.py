"""Without a secret the dashboard is loopback only, so a request naming another host is refused (issue 44: DNS
rebinding let a page on another name, resolving to 127.0.0.1, render the dashboard)."""
from __future__ import annotations

import asyncio

import pytest

from app.gate import SecretGate


async def _inner(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"dashboard"})


def call(headers: dict[str, str], *, kind: str = "http", secret: str | None = None) -> tuple[int | None, list]:
    """The status (or the websocket close) the gate answers a request with these headers."""
    sent = []

    async def receive():
        return {"type": "websocket.connect"} if kind == "websocket" else {"type": "http.request", "body": b""}

    async def send(message):
        sent.append(message)

    scope = {"type": kind, "path": "/", "method": "GET",
             "headers": [(k.encode(), v.encode()) for k, v in headers.items()]}
    asyncio.run(SecretGate(_inner, secret=secret)(scope, receive, send))
    start = next((m for m in sent if m["type"] == "http.response.start"), None)
    return (start["status"] if start else None), sent


@pytest.mark.parametrize("host", ["127.0.0.1:8501", "localhost:8501", "[::1]:8501", "127.0.0.2"])
def test_loopback_names_are_served(host):
    assert call({"host": host, "origin": f"http://{host}"})[0] == 200


@pytest.mark.parametrize("headers", [{"host": "rebind.attacker.example:8501"},
                                     {"host": "127.0.0.1:8501", "origin": "http://rebind.attacker.example:8501"},
                                     {"host": "192.168.1.5:8501"}])
def test_another_name_is_refused_without_a_secret(headers):
    status, sent = call(headers)
    assert status == 403 and b"localhost only" in sent[-1]["body"]
    _, closed = call({**headers, "origin": headers.get("origin", "http://" + headers["host"])}, kind="websocket")
    assert closed[-1] == {"type": "websocket.close", "code": 1008}


def test_with_a_secret_the_cookie_guards_instead():
    status, _ = call({"host": "dash.example.org"}, secret="s" * 24)
    assert status == 401  # the login form, not a 403: the operator chose to serve other names
