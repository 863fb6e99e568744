"""The shared secret in front of every Streamlit route (app/gate.py), against real servers on 127.0.0.1.

A ``streamlit run app/main.py`` with ``$COMPATLAB_SECRET`` set: without the cookie no route answers with anything
of Streamlit (page, websocket, upload, media, component, static, metrics, agent API), wrong secrets get 401 and
then 429, the right one gets a cookie that opens the page and the websocket. Started without a secret, it refuses
a non-loopback address and listens on 127.0.0.1 by default; a short secret is refused at start. The servers'
``HTTP(S)_PROXY`` point at a local listener, so any outgoing HTTP call (Streamlit's external-IP lookup) is
counted. Every wait is on a condition with a deadline. The unit tests at the end drive the middleware in process
with a fake clock (cookie expiry, the growing back-off).
"""
from __future__ import annotations

import asyncio
import http.client
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from email.message import Message
from pathlib import Path
from urllib.parse import urlencode

import pytest

import run_app
from app import backoff, gate

ROOT = Path(__file__).resolve().parents[1]
GATED_PORT, REFUSED_PORT, DEFAULT_PORT, PROXY_PORT = 8620, 8621, 8622, 8623
SECRET = "correct-horse-battery-staple"
DEADLINE_S = 180  # a loaded 2-core machine: importing streamlit alone takes seconds
STATIC_JS = sorted((Path(__import__("streamlit").__file__).parent / "static" / "static" / "js").glob("*.js"))[0].name
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY",
              "no_proxy")


@dataclass
class Answer:
    status: int
    headers: Message
    body: bytes


def request(port: int, method: str, path: str, *, headers: dict[str, str] | None = None, body: bytes = b"",
            source: str = "127.0.0.1") -> Answer:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60, source_address=(source, 0))
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return Answer(response.status, response.headers, response.read())
    finally:
        conn.close()


def login(port: int, secret: str, *, next_path: str = "/", source: str = "127.0.0.1") -> Answer:
    return request(port, "POST", gate.LOGIN_PATH, body=urlencode({"secret": secret, "next": next_path}).encode(),
                   headers={"Content-Type": "application/x-www-form-urlencoded"}, source=source)


def cookie_of(answer: Answer) -> str:
    """``name=value`` of the gate's cookie in a login answer."""
    return answer.headers["set-cookie"].split(";")[0]


def websocket_status(port: int, *, cookie: str | None = None, origin: str | None = None) -> int:
    """The HTTP status a websocket handshake on ``/_stcore/stream`` gets (101: the websocket is open)."""
    lines = ["GET /_stcore/stream HTTP/1.1", f"Host: 127.0.0.1:{port}", "Upgrade: websocket", "Connection: Upgrade",
             "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13",
             "Sec-WebSocket-Protocol: streamlit"]
    lines += [f"Cookie: {cookie}"] if cookie else []
    lines += [f"Origin: {origin}"] if origin else []
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        status_line = sock.makefile("rb").readline().decode()
    return int(status_line.split()[1])


class OutboundRecorder:
    """A listener the servers use as their HTTP(S) proxy: every outgoing HTTP call connects here."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_server(("127.0.0.1", port), backlog=64)
        self.sock.setblocking(False)
        self.url = f"http://127.0.0.1:{port}"

    def calls(self) -> list[str]:
        """The first line of each call made since the last look (the kernel queues them until accepted)."""
        seen = []
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return seen
            with conn:
                conn.settimeout(5)
                try:
                    seen.append(conn.recv(200).split(b"\r\n")[0].decode(errors="replace"))
                except OSError as exc:
                    seen.append(f"(a connection that sent nothing: {exc})")


@pytest.fixture(scope="module")
def outbound():
    recorder = OutboundRecorder(PROXY_PORT)
    yield recorder
    recorder.sock.close()


def start(port: int, tmp: Path, outbound: OutboundRecorder, *flags: str, secret: str | None = None):
    """``streamlit run app/main.py`` on ``port`` (headless), its proxy the recorder; returns (process, log paths)."""
    env = {k: v for k, v in os.environ.items() if k not in (*PROXY_VARS, gate.SECRET_ENV)}
    env.update(PYTHONPATH=str(ROOT), COMPATLAB_DB_URL=f"sqlite:///{tmp / 'lab.db'}",
               **dict.fromkeys(("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"), outbound.url))
    if secret is not None:
        env[gate.SECRET_ENV] = secret
    out, err = tmp / f"streamlit-{port}.out", tmp / f"streamlit-{port}.err"
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app/main.py", "--server.port", str(port),
                                 "--server.headless", "true", *flags], cwd=ROOT, env=env, stdout=o, stderr=e)
    return proc, out, err


def _healthy(port: int) -> bool:
    try:
        return request(port, "GET", "/_stcore/health").status == 200
    except OSError:
        return False


def _logs(*paths: Path) -> str:
    return "\n".join(p.read_text(errors="replace")[-3000:] for p in paths if p.exists())


def wait_ready(proc: subprocess.Popen, port: int, *logs: Path) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not _healthy(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"the server on {port} did not come up (exit {proc.poll()}):\n{_logs(*logs)}")
        time.sleep(0.2)


def wait_refused(proc: subprocess.Popen, port: int, *logs: Path) -> int:
    """The exit code of a server that should refuse to start; fails the test the moment it answers instead."""
    deadline = time.monotonic() + DEADLINE_S
    try:
        while proc.poll() is None:
            if _healthy(port):
                pytest.fail(f"it serves on {port} instead of refusing:\n{_logs(*logs)}")
            if time.monotonic() > deadline:
                pytest.fail(f"neither refused nor served within {DEADLINE_S} s:\n{_logs(*logs)}")
            time.sleep(0.2)
        return proc.returncode
    finally:
        stop(proc)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def gated(tmp_path_factory, outbound):
    """A server with the secret set; yields its port."""
    tmp = tmp_path_factory.mktemp("gated")
    proc, out, err = start(GATED_PORT, tmp, outbound, secret=SECRET)
    try:
        wait_ready(proc, GATED_PORT, out, err)
        yield GATED_PORT
    finally:
        stop(proc)


def _can_use_source(address: str) -> bool:
    try:
        with socket.socket() as sock:
            sock.bind((address, 0))
        return True
    except OSError:
        return False


# ------------------------------------------------------------------------------------------ a real server

ROUTES = [("GET", "/"), ("GET", "/compatibility"), ("GET", "/_stcore/metrics"), ("GET", "/_stcore/host-config"),
          ("PUT", "/_stcore/upload_file/a-session/a-file"), ("GET", "/media/0123456789abcdef.png"),
          ("GET", "/component/some.component/index.html"), ("GET", "/_stcore/bidi-components/c/index.js"),
          ("GET", f"/static/js/{STATIC_JS}"), ("GET", "/favicon.png"), ("GET", "/_stcore/agent/openapi.json"),
          ("POST", "/_stcore/agent/mcp"), ("OPTIONS", "/_stcore/upload_file/a-session/a-file")]


@pytest.mark.slow
@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_without_the_cookie_no_streamlit_route_answers(gated, method, path):
    answer = request(gated, method, path, body=b"x" * 1000 if method in ("PUT", "POST") else b"")
    assert answer.status == 401, f"{method} {path} got {answer.status}: {answer.body[:200]!r}"
    assert f'action="{gate.LOGIN_PATH}"'.encode() in answer.body, "the login form"
    assert b"streamlit" not in answer.body.lower() and b'<div id="root">' not in answer.body, "nothing of Streamlit"
    assert answer.headers.get_all("set-cookie") is None


@pytest.mark.slow
def test_without_the_cookie_the_websocket_is_refused(gated):
    assert websocket_status(gated) == 403
    assert websocket_status(gated, origin=f"http://127.0.0.1:{gated}") == 403
    forged = f"{gate.COOKIE_NAME}=99999999999.{'0' * 64}"
    assert websocket_status(gated, cookie=forged) == 403
    assert request(gated, "GET", "/", headers={"Cookie": forged}).status == 401


@pytest.mark.slow
def test_health_stays_open_and_says_ok_and_nothing_else(gated):
    answer = request(gated, "GET", "/_stcore/health")
    assert (answer.status, answer.body) == (200, b"ok")
    assert {k.lower() for k in answer.headers} <= {"content-type", "content-length", "cache-control", "date",
                                                    "server"}, "no cookie, no CORS header"


@pytest.mark.slow
def test_the_right_secret_gets_a_cookie_that_opens_the_page_and_the_websocket(gated):
    answer = login(gated, SECRET, next_path="/compatibility?tab=1")
    assert answer.status == 303 and answer.headers["location"] == "/compatibility?tab=1"
    attributes = [part.strip() for part in answer.headers["set-cookie"].split(";")]
    assert "HttpOnly" in attributes and "SameSite=Strict" in attributes
    cookie = {"Cookie": cookie_of(answer)}
    page = request(gated, "GET", "/", headers=cookie)
    assert page.status == 200 and b'<div id="root">' in page.body
    metrics = request(gated, "GET", "/_stcore/metrics", headers=cookie)
    assert metrics.status == 200 and b"session_events" in metrics.body
    assert websocket_status(gated, cookie=cookie["Cookie"], origin=f"http://127.0.0.1:{gated}") == 101
    assert websocket_status(gated, cookie=cookie["Cookie"]) == 101
    upload = request(gated, "PUT", "/_stcore/upload_file/a-session/a-file", headers=cookie, body=b"x")
    assert upload.status != 401 and b"XSRF" in upload.body, "past the gate, Streamlit's own checks answer"
    assert login(gated, SECRET, next_path="//evil.example/").headers["location"] == "/", "no open redirect"


def _no_browser() -> str | None:
    if not Path("/usr/bin/chromium").exists():
        return "/usr/bin/chromium not found"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed"
    return None


@pytest.mark.slow
@pytest.mark.skipif(_no_browser() is not None, reason=str(_no_browser()))
def test_a_browser_enters_the_secret_and_gets_the_dashboard(gated):
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page()
            page.goto(f"http://127.0.0.1:{gated}/compatibility")
            page.fill("input[name=secret]", "not-the-secret-at-all")
            page.click("button")
            expect(page.get_by_role("alert")).to_have_text("That is not the secret.")
            page.fill("input[name=secret]", SECRET)
            page.click("button")
            # the page's own script ran over the websocket: the router's sidebar and the page asked for
            expect(page.get_by_test_id("stSidebar").get_by_text("Database:")).to_be_visible(timeout=120_000)
            assert page.url == f"http://127.0.0.1:{gated}/compatibility"
        finally:
            browser.close()


@pytest.mark.slow
def test_a_cross_origin_websocket_is_refused_before_streamlit_looks_up_an_external_ip(gated, outbound):
    outbound.calls()
    assert websocket_status(gated, origin="http://evil.example") == 403
    assert outbound.calls() == [], "the server called out (Streamlit's origin check asks checkip.amazonaws.com)"
    cookie = cookie_of(login(gated, SECRET))
    assert websocket_status(gated, cookie=cookie, origin="http://evil.example") == 403
    assert websocket_status(gated, cookie=cookie, origin="null") == 403
    assert outbound.calls() == []


@pytest.mark.slow
@pytest.mark.skipif(not _can_use_source("127.0.0.2"), reason="needs 127.0.0.2 as a second client address")
def test_wrong_secrets_are_refused_and_then_held_back(gated):
    for _ in range(backoff.FREE_FAILURES):
        answer = login(gated, "not-the-secret-at-all", source="127.0.0.2")
        assert answer.status == 401 and b"That is not the secret." in answer.body
        assert answer.headers.get_all("set-cookie") is None
    held = login(gated, SECRET, source="127.0.0.2")  # even the right secret waits: it is not looked at
    assert held.status == 429 and int(held.headers["retry-after"]) > 0
    assert b"Too many wrong secrets" in held.body and held.headers.get_all("set-cookie") is None
    assert login(gated, SECRET).status == 303, "another address is not held back"


@pytest.mark.slow
def test_a_non_loopback_address_without_a_secret_is_refused(tmp_path, outbound):
    outbound.calls()
    proc, out, err = start(REFUSED_PORT, tmp_path, outbound, "--server.address", "0.0.0.0")
    assert wait_refused(proc, REFUSED_PORT, out, err) == 2
    lines = err.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --server.address 0.0.0.0 would let anyone on the network")
    assert outbound.calls() == [], "the start banner looked up the external IP"


@pytest.mark.slow
def test_a_short_secret_is_refused_at_start(tmp_path, outbound, monkeypatch):
    short = "x" * (gate.MIN_SECRET_CHARS - 1)
    monkeypatch.delenv(gate.SECRET_ENV, raising=False)
    secret_file = tmp_path / "secret"
    secret_file.write_text(short)
    with pytest.raises(ValueError, match=f"the shared secret has {len(short)} characters; use at least"):
        run_app.read_secret(run_app.parse_args(["--secret-file", str(secret_file)]))
    monkeypatch.setenv(gate.SECRET_ENV, "x")
    with pytest.raises(ValueError, match="the shared secret has 1 characters"):
        run_app.read_secret(run_app.parse_args([]))
    proc, out, err = start(REFUSED_PORT, tmp_path, outbound, secret=short)
    assert wait_refused(proc, REFUSED_PORT, out, err) == 2
    lines = err.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: the shared secret has {len(short)} characters")


def _listening(port: int) -> set[str]:
    """The local addresses of this machine's TCP sockets listening on ``port`` (Linux's socket table)."""
    found = set()
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, local_port = local.split(":")
            if state == "0A" and int(local_port, 16) == port:  # 0A: LISTEN
                raw = b"".join(bytes.fromhex(address[i:i + 8])[::-1] for i in range(0, len(address), 8))
                found.add(socket.inet_ntop(family, raw))
    return found


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's socket table")
def test_streamlit_run_without_an_address_listens_on_loopback_only(tmp_path, outbound):
    outbound.calls()
    proc, out, err = start(DEFAULT_PORT, tmp_path, outbound)
    try:
        wait_ready(proc, DEFAULT_PORT, out, err)
        assert _listening(DEFAULT_PORT) == {"127.0.0.1"}
        assert outbound.calls() == [], "the start banner looked up the external IP"
    finally:
        stop(proc)


# ------------------------------------------------------------------------------------------ the middleware alone


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _inner(scope, receive, send) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.accept"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"set-cookie", b"inner=1")]})
    await send({"type": "http.response.body", "body": b"inner"})


def drive(app, method: str, path: str, *, cookie: str | None = None, body: bytes = b"", client="10.0.0.1",
          kind: str = "http", origin: str | None = None, host: str = "lab.example:8501") -> tuple[int, dict[bytes, bytes], bytes]:
    """One request through ``app`` in process: (status, headers, body); a websocket gives 101 or 403."""
    headers = [(b"host", host.encode())]
    headers += [(b"cookie", cookie.encode())] if cookie else []
    headers += [(b"origin", origin.encode())] if origin else []
    scope = {"type": kind, "method": method, "path": path, "query_string": b"", "headers": headers,
             "client": (client, 40000)}
    incoming = [{"type": "websocket.connect"} if kind == "websocket" else
                {"type": "http.request", "body": body, "more_body": False}]
    sent = []

    async def receive():
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    if kind == "websocket":
        return (101 if sent[0]["type"] == "websocket.accept" else 403), {}, b""
    return sent[0]["status"], dict(sent[0]["headers"]), b"".join(m.get("body", b"") for m in sent[1:])


def _login(app, secret: str, client: str = "10.0.0.1") -> tuple[int, dict[bytes, bytes], bytes]:
    return drive(app, "POST", gate.LOGIN_PATH, body=urlencode({"secret": secret}).encode(), client=client)


def test_the_cookie_lasts_its_max_age_and_one_server_start_only():
    clock = Clock()
    app = gate.SecretGate(_inner, secret=SECRET, clock=clock)
    status, headers, _ = _login(app, SECRET)
    cookie = headers[b"set-cookie"].decode().split(";")[0]
    assert status == 303 and drive(app, "GET", "/", cookie=cookie)[2] == b"inner"
    clock.now += gate.COOKIE_MAX_AGE_S - 1
    assert drive(app, "GET", "/", cookie=cookie)[0] == 200
    assert drive(app, "GET", "/_stcore/stream", cookie=cookie, kind="websocket")[0] == 101
    clock.now += 2
    assert drive(app, "GET", "/", cookie=cookie)[0] == 401
    assert drive(app, "GET", "/_stcore/stream", cookie=cookie, kind="websocket")[0] == 403
    restarted = gate.SecretGate(_inner, secret=SECRET, clock=Clock())  # a new start signs with a new key
    assert drive(restarted, "GET", "/", cookie=_login(app, SECRET)[1][b"set-cookie"].decode().split(";")[0])[0] == 401


def test_the_wait_after_wrong_secrets_doubles_and_the_right_secret_resets_it():
    clock = Clock()
    app = gate.SecretGate(_inner, secret=SECRET, clock=clock)
    for _ in range(backoff.FREE_FAILURES):
        assert _login(app, "wrong")[0] == 401
    for wait in (60, 120, 240):
        status, headers, _ = _login(app, SECRET)
        assert status == 429 and headers[b"retry-after"] == str(wait).encode()
        assert _login(app, SECRET, client="10.0.0.2")[0] == 303, "another address is not held back"
        clock.now += wait
        assert _login(app, "wrong")[0] == 401  # the one try after the wait, wrong again: the wait doubles
    clock.now += 480
    assert _login(app, SECRET)[0] == 303
    for _ in range(backoff.FREE_FAILURES):
        assert _login(app, "wrong")[0] == 401
    assert backoff.lock_s(10**6) == backoff.MAX_WAIT_S


def test_the_failure_table_stays_bounded(monkeypatch):
    monkeypatch.setattr(backoff, "MAX_TRACKED", 50)
    table = backoff.Backoff(Clock())
    for i in range(500):
        for _ in range(backoff.FREE_FAILURES):
            table.failed(f"10.1.{i // 256}.{i % 256}")
    assert len(table._failures) <= 50 and table.wait_s("10.1.1.243") == backoff.FIRST_WAIT_S


def test_an_ipv6_client_counts_by_its_64_network():
    assert backoff.client_key("2001:db8:1:2::5") == backoff.client_key("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert backoff.client_key("::ffff:192.0.2.7") == "192.0.2.7" and backoff.client_key(None) == "unknown"


@pytest.mark.parametrize("next_path", ["//evil.example/", "/\\evil.example", "https://evil.example/",
                                       "/x\r\nSet-Cookie: a=b", "evil", "/caf\u00e9"])
def test_the_login_returns_only_to_a_path_on_this_server(next_path):
    app = gate.SecretGate(_inner, secret=SECRET)
    body = urlencode({"secret": SECRET, "next": next_path}).encode()
    status, headers, _ = drive(app, "POST", gate.LOGIN_PATH, body=body)
    assert status == 303 and headers[b"location"] == b"/"


def test_the_gate_answers_login_forms_and_health_itself():
    app = gate.SecretGate(_inner, secret=SECRET)
    assert drive(app, "POST", gate.LOGIN_PATH, body=b"secret=" + b"x" * gate.MAX_FORM_BYTES)[0] == 413
    assert drive(app, "GET", gate.LOGIN_PATH)[0] == 200
    status, headers, body = drive(app, "GET", gate.HEALTH_PATH)
    assert (status, body) == (200, b"inner") and b"set-cookie" not in headers
    assert drive(app, "POST", gate.HEALTH_PATH)[0] == 401
    for garbage in ("garbage", "\u00b2.x", "1.\u00e9\u00e9", "", "99."):
        assert drive(app, "GET", "/", cookie=f"{gate.COOKIE_NAME}={garbage}".encode().decode("latin-1"))[0] == 401


def test_a_base_url_path_moves_the_login_and_health_with_it():
    app = gate.SecretGate(_inner, secret=SECRET, base_path="/lab")
    assert drive(app, "GET", "/lab/")[0] == 401 and drive(app, "GET", "/lab/_stcore/health")[2] == b"inner"
    body = urlencode({"secret": SECRET, "next": "/lab/compatibility"}).encode()
    status, headers, _ = drive(app, "POST", "/lab/_gate/login", body=body)
    assert status == 303 and headers[b"location"] == b"/lab/compatibility" and b"Path=/lab/;" in headers[b"set-cookie"]
    body = urlencode({"secret": SECRET, "next": "/elsewhere"}).encode()
    assert drive(app, "POST", "/lab/_gate/login", body=body)[1][b"location"] == b"/lab/"


def test_without_a_secret_loopback_passes_but_other_names_and_cross_origin_websockets_do_not():
    app = gate.SecretGate(_inner, secret=None)
    local = "127.0.0.1:8501"
    assert drive(app, "GET", "/_stcore/metrics", host=local)[2] == b"inner"
    assert drive(app, "GET", "/_stcore/stream", kind="websocket", origin=f"http://{local}", host=local)[0] == 101
    assert drive(app, "GET", "/_stcore/stream", kind="websocket", host=local)[0] == 101
    assert drive(app, "GET", "/_stcore/stream", kind="websocket", origin="http://evil.example", host=local)[0] == 403
    assert drive(app, "GET", "/_stcore/metrics")[0] == 403  # another name (DNS rebinding): loopback only


def test_the_start_checks():
    gate.check_start("127.0.0.1", None)
    gate.check_start("::1", None)
    gate.check_start("0.0.0.0", SECRET)
    for address in ("0.0.0.0", "::", "192.168.1.4", None):
        with pytest.raises(ValueError, match="would let anyone on the network"):
            gate.check_start(address, None)
    with pytest.raises(ValueError, match="has 15 characters"):
        gate.check_start("127.0.0.1", "x" * 15)
    with pytest.raises(ValueError, match="has 3 characters"):
        gate.SecretGate(_inner, secret="abc")
