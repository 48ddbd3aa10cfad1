"""Hostile and careless requests against the real server (issue 7): auth before the body, caps, bounds,
and no 5xx for small mistakes. `potato-queue serve` runs as a user starts it; requests are raw HTTP."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import httpx
import pytest

from potato_queue.clock import ManualClock
from potato_queue.server.headers import CONTENT_SECURITY_POLICY
from potato_queue.server.session import COOKIE
from potato_queue.store.sessions import SIGN_IN_FREE_TRIES
from potato_queue.validate import load_checked
from tests.lifecycle_helpers import ADMIN_KEY, Services, make_project, run_paths, started

PAGE = "/admin/training"
ADMIN = PAGE + "/api"
A_RUN = {"trainer": "majority-baseline", "schemas": ["sentiment"]}


@pytest.fixture
def svc(tmp_path: Path, redis_server_url: str) -> Iterator[Services]:
    with started(tmp_path, redis_server_url, executors=0) as services:
        yield services


def raw_request(url: str, head: str, body: bytes = b"", read_timeout_s: float = 20) -> tuple[int, str]:
    """Send `head` (and `body`) on a fresh connection; the status and body of the answer."""
    parts = urllib.parse.urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=read_timeout_s) as sock:
        sock.sendall(head.encode() + b"\r\n\r\n" + body)
        data = b""
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _length(data):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, data.split(b"\r\n\r\n", 1)[1].decode(errors="replace")


def _length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


def test_a_body_is_refused_before_it_is_read_without_the_key(svc: Services) -> None:
    # Headers announce 24 MB and no byte of it is sent: only a server that answers before reading replies.
    head = f"POST {ADMIN}/runs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {24 << 20}"
    status, body = raw_request(svc.url, head)
    assert status == 401 and "X-API-Key" in body
    status, body = raw_request(svc.url, head + f"\r\nX-API-Key: {ADMIN_KEY}")
    assert status == 413 and "more than this route takes (1048576)" in body


def test_a_chunked_body_over_the_cap_is_refused(svc: Services) -> None:
    chunk = b"x" * (600 << 10)
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(2)) + b"0\r\n\r\n"
    head = (
        f"POST {ADMIN}/runs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Transfer-Encoding: chunked\r\nX-API-Key: {ADMIN_KEY}"
    )
    status, text = raw_request(svc.url, head, body)
    assert status == 413 and "1048576 bytes" in text


def test_params_nested_too_deep_are_refused_and_the_listing_stays_whole(svc: Services) -> None:
    deep: dict = {}
    node = deep
    for _ in range(600):
        node["x"] = {}
        node = node["x"]
    status, reply = svc.api("POST", "/runs", {"trainer": "sklearn-text", "schemas": ["sentiment"], "params": deep})
    assert status == 400 and reply["detail"] == (
        "params nests more than 20 levels deep; at most 20 are accepted; fix: "
        "pass the trainer's settings, not data (the data comes from the project)"
    )
    ok = svc.start_run(trainer="sklearn-text", schemas=["sentiment"], params={"n": [1, [2, [3]]], "f": 1e400})
    assert svc.api("GET", f"/runs/{ok}")[1]["params"] == {"n": [1, [2, [3]]], "f": "inf"}
    run_paths(svc, ok).run_json.write_text("{ not json")
    status, runs = svc.api("GET", "/runs")
    assert status == 200 and runs[0]["run_id"] == ok and runs[0]["state"] == "broken"
    assert "run.json cannot be read" in runs[0]["error"]


@pytest.mark.parametrize("query", ["offset=-1", "offset=1e30", f"offset={2**63}", f"offset={2**40 + 1}", "offset=abc"])
def test_a_bad_log_offset_is_a_4xx(svc: Services, query: str) -> None:
    run_id = svc.start_run(trainer="sklearn-text", schemas=["sentiment"])
    status, reply = svc.api("GET", f"/runs/{run_id}/log?{query}")
    assert status == 422 and reply["detail"][0]["loc"] == ["query", "offset"], reply


def test_an_offset_past_the_end_of_the_log_is_empty(svc: Services) -> None:
    run_id = svc.start_run(trainer="sklearn-text", schemas=["sentiment"])
    assert svc.api("GET", f"/runs/{run_id}/log?offset={2**40}") == (200, "")


def test_limit_zero_and_numbers_json_cannot_hold_are_4xx(svc: Services) -> None:
    assert svc.api("GET", "/runs?limit=0")[0] == 422
    head = f"POST {ADMIN}/runs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-API-Key: {ADMIN_KEY}"
    body = b'{"trainer": 1e400, "schemas": ["sentiment"]}'
    status, text = raw_request(svc.url, head + f"\r\nContent-Length: {len(body)}", body)
    assert status == 422 and json.loads(text)["detail"][0]["loc"] == ["body", "trainer"]


def test_the_openapi_document_names_every_status(svc: Services) -> None:
    import urllib.request

    with urllib.request.urlopen(f"{svc.url}/openapi.json", timeout=30) as reply:
        doc = json.loads(reply.read())
    post_runs = doc["paths"][f"{ADMIN}/runs"]["post"]["responses"]
    assert {"202", "400", "401", "409", "413", "422"} <= set(post_runs)
    assert {"200", "401", "404"} <= set(doc["paths"][f"{ADMIN}/runs/{{run_id}}"]["get"]["responses"])
    assert {"200", "404", "409"} <= set(doc["paths"][f"{ADMIN}/runs/{{run_id}}/cancel"]["post"]["responses"])


def test_a_refused_key_or_token_is_answered_late(svc: Services) -> None:
    # A client looping on refused requests is held to a few a second (bench_hostile measures the effect).
    from potato_queue.server.guard import AGENT_PREFIX, REFUSAL_DELAY_S

    wrong_key = f"GET {ADMIN}/runs HTTP/1.1\r\nHost: x\r\nX-API-Key: not-the-key"
    wrong_token = f"GET {AGENT_PREFIX}/runs/r-none/job HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nope"
    for head, expected in ((wrong_key, "X-API-Key"), (wrong_token, "run token")):
        started_s = time.monotonic()
        status, body = raw_request(svc.url, head)
        assert status == 401 and expected in body
        assert time.monotonic() - started_s >= REFUSAL_DELAY_S


def test_the_tarpit_holds_a_bounded_number_of_refusals() -> None:
    # Past its cap a refusal is answered at once: held connections never pile up without bound.
    from potato_queue.server.guard import Tarpit

    async def three_held_of_five() -> tuple[int, int]:
        tarpit = Tarpit(delay_s=30, max_held=3)
        waits = [asyncio.ensure_future(tarpit.wait()) for _ in range(5)]
        await asyncio.sleep(0.05)
        done = sum(wait.done() for wait in waits)
        held = tarpit.held
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
        return done, held

    assert asyncio.run(three_held_of_five()) == (2, 3)


# -- the Training page's sign-in, sign-out and headers (issue 21) ----------------------------------------
def sign_in(url: str) -> tuple[dict[str, str], str]:
    """Sign in as the page's form does: the session cookie (as a header) and the page's CSRF token."""
    reply = httpx.post(f"{url}{PAGE}/sign-in", data={"key": ADMIN_KEY})
    assert reply.status_code == 303, reply.text
    session = {"Cookie": f"{COOKIE}={reply.cookies[COOKIE]}"}
    found = re.search(r'<meta name="csrf" content="([^"]+)"', httpx.get(f"{url}{PAGE}", headers=session).text)
    assert found is not None, "the signed-in page carries its CSRF token"
    return session, found.group(1)


def test_sign_out_ends_the_session_on_every_server(svc: Services) -> None:
    # Two server processes of one project, as behind a load balancer: signed out at one, the cookie is
    # refused by both, with its CSRF token too, and a stream it opened ends.
    first, second = svc.url, svc.serve()
    session, csrf = sign_in(first)
    start = {**session, "X-CSRF-Token": csrf}
    assert httpx.post(f"{second}{ADMIN}/runs", json=A_RUN, headers=start).status_code == 202
    with httpx.stream("GET", f"{second}{ADMIN}/stream", headers=session, timeout=10) as stream:
        lines = stream.iter_lines()
        assert next(lines) == "retry: 1000"
        assert httpx.post(f"{first}{PAGE}/sign-out", data={"csrf": csrf}, headers=session).status_code == 303
        rest = list(lines)  # ends within a tick of the sign-out; a stream left open times out here
    assert any(line.startswith("event: runs") for line in rest)
    for url in (first, second):
        listed = httpx.get(f"{url}{ADMIN}/runs", headers=session)
        assert listed.status_code == 401 and "session has ended" in listed.json()["detail"]
        started_run = httpx.post(f"{url}{ADMIN}/runs", json=A_RUN, headers=start)
        assert started_run.status_code == 401 and "sign in again" in started_run.json()["detail"]
        assert 'id="key"' in httpx.get(f"{url}{PAGE}", headers=session).text, "the sign-in form, not the runs"
    assert len(svc.api("GET", "/runs")[1]) == 1, "only the run started before the sign-out"


def test_wrong_keys_make_a_client_wait_longer_each_time_up_to_a_cap(tmp_path: Path, redis_server_url: str) -> None:
    from fastapi.testclient import TestClient

    from potato_queue.server.app import create_app

    clock = ManualClock()
    app = create_app(load_checked(make_project(tmp_path)), redis_server_url, enqueue=lambda run_id: None, clock=clock)

    def try_key(address: str, key: str) -> httpx.Response:
        # Not `with TestClient`: that would run the app's lifespan, which ClaimDoor does not take (it reads a
        # path from every scope); uvicorn's lifespan="auto" hides that from the server.
        with closing(TestClient(app, client=(address, 40000), follow_redirects=False)) as client:
            return client.post(f"{PAGE}/sign-in", data={"key": key})

    guesser = "2001:db8::1"
    for _ in range(SIGN_IN_FREE_TRIES):
        assert try_key(guesser, "wrong").status_code == 401
    waits = []
    for _ in range(8):
        held = try_key(guesser, ADMIN_KEY)  # while it waits, not even the right key is looked at
        assert held.status_code == 429
        waits.append(int(held.headers["retry-after"]))
        clock.advance(waits[-1])
        assert try_key(guesser, "wrong").status_code == 401
    assert waits == [1, 2, 4, 8, 16, 32, 60, 60]
    held = try_key("2001:db8::2", ADMIN_KEY)  # the same /64: no fresh start
    assert held.status_code == 429 and "wait 60 s, then sign in with the right key" in held.text
    assert try_key("198.51.100.9", ADMIN_KEY).status_code == 303, "another client is not held back"
    clock.advance(60)
    assert try_key(guesser, ADMIN_KEY).status_code == 303
    assert [try_key(guesser, "wrong").status_code for _ in range(2)] == [401, 401], "the right key forgave the rest"


def test_every_reply_carries_the_security_headers(svc: Services) -> None:
    session, _ = sign_in(svc.url)
    run_id = svc.start_run(**A_RUN)
    pages = [
        httpx.get(f"{svc.url}{PAGE}"),
        httpx.get(f"{svc.url}{PAGE}", headers=session),
        httpx.get(f"{svc.url}{PAGE}/runs/{run_id}", headers=session),
    ]
    others = [
        httpx.get(f"{svc.url}{PAGE}/static/training.js"),
        httpx.get(f"{svc.url}{ADMIN}/runs"),
        httpx.get(f"{svc.url}/healthz"),
    ]
    for reply in pages + others:
        assert reply.headers["content-security-policy"] == CONTENT_SECURITY_POLICY, reply.url
        assert (
            reply.headers["x-frame-options"],
            reply.headers["referrer-policy"],
            reply.headers["x-content-type-options"],
        ) == ("DENY", "same-origin", "nosniff"), reply.url
    assert "script-src 'self';" in CONTENT_SECURITY_POLICY and "unsafe" not in CONTENT_SECURITY_POLICY
    for reply in pages:  # nothing the policy would stop: every script is a file, no style or handler inline
        assert re.findall(r"<script(?![^>]*\bsrc=)|<style|\sstyle=|\son\w+=", reply.text) == [], reply.url
