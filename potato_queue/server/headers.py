"""Security headers on every response: no framing, no sniffing, no referrer to other sites, and a
Content-Security-Policy.

The Training page runs only its own files (server/static/: no inline script,
style or event handler), so its policy allows nothing else: an injected
`<script>` or `onerror=` does not run, and no other site may frame the page
to trick a click. The policy goes on every response, JSON included, since a
browser may be led to open any of them. FastAPI's API docs (/docs, /redoc)
are the exception: they load Swagger UI from its CDN with an inline script,
and the page's session cookie is never sent to them (its path is the page's).
"""

from __future__ import annotations

from collections.abc import Iterable

from potato_queue.server.guard import ASGIApp, Message, Receive, Scope, Send

__all__ = ["SecurityHeaders", "CONTENT_SECURITY_POLICY", "SECURITY_HEADERS"]

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; frame-ancestors 'none'; base-uri 'none'; "
    "form-action 'self'"
)
# same-origin, not no-referrer: under no-referrer a browser sends `Origin: null` with the page's own form posts
# (sign-in, sign-out), and the cross-site check refuses those. Another site gets no referrer either way.
SECURITY_HEADERS = {"X-Frame-Options": "DENY", "Referrer-Policy": "same-origin", "X-Content-Type-Options": "nosniff"}


def _raw(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]


class SecurityHeaders:
    """The middleware: adds the headers to every HTTP response; `unpoliced` paths get all but the policy."""

    def __init__(self, app: ASGIApp, unpoliced: Iterable[str] = ()) -> None:
        self.app, self.unpoliced = app, frozenset(unpoliced)
        self.plain = _raw(SECURITY_HEADERS)
        self.policed = _raw({**SECURITY_HEADERS, "Content-Security-Policy": CONTENT_SECURITY_POLICY})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        extra = self.plain if scope["path"] in self.unpoliced else self.policed

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *extra]
            await send(message)

        await self.app(scope, receive, with_headers)
