"""The Training page at /admin/training: sign in, the runs, a run's own page (API-3).

Plain server-side HTML and a little JavaScript (server/static/, served from the
package: no build step, no CDN, so it works on a server without internet). The
pages carry no data of their own: their scripts ask the admin API with the
session cookie, and follow the runs through server-sent events. A state-changing
request from the page carries the session's CSRF token (meta tag `csrf`).
Sign-in waits after a few wrong keys from one client (store/sessions.py's
SignInTries); sign-out ends the session on every server process.
"""

from __future__ import annotations

import html
import math
import secrets
from pathlib import Path
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from potato_queue.errors import Forbidden, NotFound
from potato_queue.server.deps import store_of
from potato_queue.server.guard import PAGE_PREFIX, admin_key, request_session
from potato_queue.server.session import COOKIE, SESSION_S, client_of, csrf_token, foreign_origin, new_session
from potato_queue.store import RunStore
from potato_queue.store.keys import RUN_ID_RE
from potato_queue.store.sessions import SIGN_IN_MAX_WAIT_S

__all__ = ["page_router", "PAGE_PREFIX", "STATIC"]

STATIC = Path(__file__).parent / "static"
_ASSETS = {
    "page.css": "text/css",
    "training.js": "text/javascript",
    "run.js": "text/javascript",
    "common.js": "text/javascript",
    "hub.js": "text/javascript",
    "rater.js": "text/javascript",
    "insight.js": "text/javascript",
}


def _layout(title: str, body: str, csrf: str = "", scripts: tuple[str, ...] = ()) -> str:
    tags = "".join(f'<script src="{PAGE_PREFIX}/static/{name}" defer></script>' for name in scripts)
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta name="csrf" content="{html.escape(csrf)}"><title>{html.escape(title)}</title>'
        f'<link rel="icon" href="data:,"><link rel="stylesheet" href="{PAGE_PREFIX}/static/page.css">{tags}</head><body>{body}</body></html>'
    )


def _sign_in_page(problem: str = "") -> str:
    alert = f'<p class="problem" role="alert">{html.escape(problem)}</p>' if problem else ""
    return _layout(
        "Sign in: Training",
        f"""
<main class="narrow"><h1>Training</h1>{alert}
<form method="post" action="{PAGE_PREFIX}/sign-in">
<label for="key">Admin key</label>
<input id="key" name="key" type="password" autocomplete="current-password" required autofocus>
<button type="submit">Sign in</button></form>
<p class="hint">The project's admin_api_key (config.yaml), or $POTATO_ADMIN_API_KEY on the server.</p></main>""",
    )


def _nonce(request: Request) -> str | None:
    """The request's session while it is signed in (one Redis call, only for a cookie signed and unexpired)."""
    store = store_of(request)
    nonce = request_session(store, request.headers)
    return nonce if nonce is not None and store.sessions.live(nonce) else None


def _header(csrf: str, title: str) -> str:
    return (
        f'<header><h1><a href="{PAGE_PREFIX}">Training</a>{html.escape(title)}</h1>'
        f'<form method="post" action="{PAGE_PREFIX}/sign-out"><input type="hidden" name="csrf" '
        f'value="{html.escape(csrf)}"><button type="submit" class="quiet">Sign out</button></form></header>'
    )


def training_page(request: Request) -> Response:
    # The local device (the menu's `local (this machine, cuda:0)`) takes a second or two to ask, in a process of
    # its own: asked now, while the admin types the key or the page loads, the menu does not wait for it.
    probe = getattr(request.app.state, "local_device", None)
    if probe is not None:
        probe(0.0)
    nonce = _nonce(request)
    if nonce is None:
        return HTMLResponse(_sign_in_page())
    csrf = csrf_token(admin_key(store_of(request).config), nonce)
    body = (
        _header(csrf, "")
        + """
<main>
<section aria-labelledby="runs-on"><h2 id="runs-on">Start a run</h2>
<form id="start">
 <div class="row"><label for="backend">Runs on</label><select id="backend" name="backend"></select>
  <button type="button" id="check">Check</button></div>
 <pre id="check-report" aria-live="polite" hidden></pre>
 <div class="row"><label for="trainer">Trainer</label><select id="trainer" name="trainer"></select></div>
 <p id="trainer-hint" class="hint"></p>
 <fieldset id="schemas"><legend>Schemas</legend></fieldset>
 <fieldset id="params"><legend>Params</legend></fieldset>
 <div class="row"><input id="learning-curve" type="checkbox"><label for="learning-curve">Learning curve</label>
  <span class="hint">also fit on 25, 50 and 75 % of the train items: will more labels help?</span></div>
 <button type="submit" id="start-run">Start run</button> <span id="start-problem" class="problem" role="alert"></span>
</form></section>
<section aria-labelledby="runs-title"><h2 id="runs-title">Runs <span id="live" class="hint">connecting</span></h2>
<p id="auto-retrain" class="hint" aria-live="polite" hidden></p>
<p id="budget" class="hint" aria-live="polite" hidden></p>
<div class="row" id="filters"><label for="filter-state">State</label><select id="filter-state"><option value="">any</option>
</select><label for="filter-trainer">Trainer</label><select id="filter-trainer"><option value="">any</option></select>
<label for="filter-backend">Ran on</label><select id="filter-backend"><option value="">any</option></select></div>
<div class="scroll"><table id="runs"><thead><tr><th>Run</th><th>Trainer</th><th>Ran on</th><th>State</th><th>Trigger</th>
<th>Held-out (each kind's measures)</th><th>Duration</th><th>Started</th><th>Step</th><th></th></tr></thead>
<tbody></tbody><tbody id="older-runs"></tbody></table></div>
<p id="history" class="hint" aria-live="polite"></p><button type="button" id="older" class="quiet" hidden>Older runs</button>
</section>
<section id="agents" aria-labelledby="agents-title" hidden><h2 id="agents-title">Agents</h2><div></div></section>
</main>"""
    )
    return HTMLResponse(_layout("Training", body, csrf, ("common.js", "training.js")))


def run_page(run_id: str, request: Request) -> Response:
    nonce = _nonce(request)
    if nonce is None:
        return RedirectResponse(PAGE_PREFIX, status_code=303)
    if not RUN_ID_RE.fullmatch(run_id):
        raise NotFound("no such run")
    csrf = csrf_token(admin_key(store_of(request).config), nonce)
    body = (
        _header(csrf, f" / run {run_id}")
        + f"""
<main id="run" data-run="{html.escape(run_id)}">
<section><h2>Run <span id="state"></span></h2><dl id="facts"></dl>
<div id="step" class="step"></div><button type="button" id="cancel" hidden>Cancel run</button>
<button type="button" id="retry" hidden>Retry from its checkpoint</button>
<button type="button" id="rerun" hidden>Run it again and compare</button>
<span id="retry-problem" class="problem" role="alert"></span></section>
<section id="hub" aria-labelledby="hub-title" hidden><h2 id="hub-title">Publish to the Hugging Face Hub</h2>
<p id="hub-refused" class="problem" role="status" hidden></p>
<form id="hub-form" hidden>
 <div class="row"><label for="hub-repo">Repo id</label><input id="hub-repo" name="repo_id" required maxlength="96"
  placeholder="namespace/name" autocomplete="off" spellcheck="false"></div>
 <div class="row"><label for="hub-private">Private</label><input id="hub-private" name="private" type="checkbox" checked></div>
 <div class="row"><label for="hub-token">Token</label><input id="hub-token" name="token" type="password"
  autocomplete="off" aria-describedby="hub-token-hint"></div>
 <p id="hub-token-hint" class="hint">A Hub write token: not stored; leave empty to use the server's HF_TOKEN.</p>
 <button type="submit" id="hub-publish">Publish</button> <span id="hub-problem" class="problem" role="alert"></span>
</form>
<p id="hub-state" aria-live="polite"></p></section>
<section id="agreement" aria-labelledby="agreement-title" hidden><h2 id="agreement-title">The model beside the annotators</h2>
<div aria-live="polite"></div></section>
<section aria-labelledby="chart-title"><h2 id="chart-title">Training loss and held-out scores</h2>
<div id="chart" role="img" aria-label="metrics over steps"></div></section>
<section id="quality" aria-labelledby="quality-title" hidden><h2 id="quality-title">Good enough to prelabel with?</h2>
<div class="row"><label for="target-precision">Target precision</label>
 <input id="target-precision" type="number" min="0.05" max="1" step="0.01" value="0.9"></div>
<p id="threshold" aria-live="polite"></p><div id="per-label" class="scroll"></div>
<div id="reliability" role="img" aria-label="reliability diagram: accuracy against confidence"></div></section>
<section id="curve" aria-labelledby="curve-title" hidden><h2 id="curve-title">Will more labels help?</h2>
<p id="curve-said"></p><div id="curve-chart" role="img" aria-label="learning curve: macro-F1 against train items"></div></section>
<section id="next" aria-labelledby="next-title" hidden><h2 id="next-title">What to label next</h2>
<p id="next-said" class="hint"></p><div id="next-items" class="scroll"></div>
<button type="button" id="to-potato">Send this order to Potato</button> <span id="to-potato-said" role="status"></span></section>
<section id="compare" aria-labelledby="compare-title" hidden><h2 id="compare-title">Compare with another run</h2>
<div class="row"><label for="compare-with">Run</label><select id="compare-with"></select></div>
<div id="compared" aria-live="polite"></div></section>
<section aria-labelledby="pred-title"><h2 id="pred-title">Predictions</h2><div id="predictions"></div></section>
<section aria-labelledby="log-title"><h2 id="log-title">run.log</h2><pre id="log" tabindex="0"></pre></section>
</main>"""
    )
    return HTMLResponse(
        _layout(f"Run {run_id}", body, csrf, ("common.js", "run.js", "rater.js", "hub.js", "insight.js"))
    )


async def _form(request: Request) -> dict[str, str]:
    body = (await request.body()).decode("utf-8", "replace")
    return {k: v[0] for k, v in parse_qs(body).items()}


def _too_many_tries(wait_s: float) -> Response:
    retry_s = math.ceil(wait_s)
    why = (
        f"Too many wrong admin keys from your address: wait {retry_s} s, then sign in with the right key "
        f"(each further wrong key doubles the wait, up to {SIGN_IN_MAX_WAIT_S:g} s)."
    )
    return HTMLResponse(_sign_in_page(why), status_code=429, headers={"Retry-After": str(retry_s)})


def _signed_in(store: RunStore, client: str, nonce: str) -> None:
    store.sign_ins.forgive(client)
    store.sessions.open(nonce, SESSION_S)


async def sign_in(request: Request) -> Response:
    store = store_of(request)
    key = admin_key(store.config)
    if foreign_origin(request.headers) is not None:
        return HTMLResponse(_sign_in_page("Sign-in from another site refused."), status_code=403)
    given = (await _form(request)).get("key", "")
    client = client_of(request.client.host if request.client else None)
    wait_s = await run_in_threadpool(store.sign_ins.take, client)  # counted before the key is compared
    if wait_s > 0:
        return _too_many_tries(wait_s)
    if key is None or not secrets.compare_digest(given.encode(), key.encode()):
        why = "No admin key is configured on the server." if key is None else "That is not the admin key."
        return HTMLResponse(_sign_in_page(why), status_code=401)
    cookie, nonce = new_session(key, store.clock.now_s())
    await run_in_threadpool(_signed_in, store, client, nonce)
    reply = RedirectResponse(PAGE_PREFIX, status_code=303)
    reply.set_cookie(
        COOKIE,
        cookie,
        max_age=SESSION_S,
        path=PAGE_PREFIX,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return reply


async def sign_out(request: Request) -> Response:
    """Ends the session in Redis (every server process refuses its cookie from now on) and in the browser."""
    store = store_of(request)
    nonce = request_session(store, request.headers)
    form = await _form(request)
    if nonce is not None:
        if not secrets.compare_digest(form.get("csrf", ""), csrf_token(admin_key(store.config), nonce)):
            raise Forbidden("cross-site request refused")
        await run_in_threadpool(store.sessions.close, nonce)
    reply = RedirectResponse(PAGE_PREFIX, status_code=303)
    reply.delete_cookie(COOKIE, path=PAGE_PREFIX)
    return reply


def static(name: str) -> FileResponse:
    if name not in _ASSETS:
        raise NotFound("no such file")
    return FileResponse(STATIC / name, media_type=_ASSETS[name], headers={"Cache-Control": "no-cache"})


def page_router() -> APIRouter:
    router = APIRouter(include_in_schema=False)
    router.add_api_route("", training_page, methods=["GET"])
    router.add_api_route("/", training_page, methods=["GET"])
    router.add_api_route("/runs/{run_id}", run_page, methods=["GET"])
    router.add_api_route("/sign-in", sign_in, methods=["POST"])
    router.add_api_route("/sign-out", sign_out, methods=["POST"])
    router.add_api_route("/static/{name}", static, methods=["GET"])
    return router
