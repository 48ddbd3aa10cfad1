"""The Training page's sign-in: a signed, expiring session cookie, and the check against cross-site requests.

The admin signs in once with the admin key; the cookie then stands for the key
(HttpOnly: no script reads it; SameSite=Strict: no other site's page sends it).
It holds an expiry and a nonce, signed with HMAC-SHA256 under a secret derived
from the admin key (each function takes it: guard.admin_key), so it survives a server restart (the page reconnects) and
dies when the key changes. Redis keeps the sessions that are signed in
(store/sessions.py): a sign-out ends the cookie on every server process. A state-changing request made with the cookie must
also carry the session's CSRF token (the page has it; another site cannot read
it) and, when the browser names one, its own Origin. The JSON API's X-API-Key
header works as before, without either.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Mapping

__all__ = [
    "COOKIE",
    "SESSION_S",
    "new_session",
    "session_nonce",
    "csrf_token",
    "cross_site_problem",
    "cookie_value",
    "foreign_origin",
    "client_of",
]

COOKIE = "pq_session"
SESSION_S = 12 * 3600
UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _secret(key: str | None) -> bytes | None:
    return None if key is None else hashlib.sha256(b"potato-queue page session\0" + key.encode()).digest()


def _sign(secret: bytes, text: str) -> str:
    return hmac.new(secret, text.encode(), hashlib.sha256).hexdigest()


def new_session(key: str | None, now_s: float) -> tuple[str, str]:
    """A fresh cookie value, `<expiry>.<nonce>.<signature>`, and its nonce."""
    secret = _secret(key)
    assert secret is not None, "no admin key: nobody can sign in"
    nonce = secrets.token_urlsafe(16)
    body = f"{int(now_s + SESSION_S)}.{nonce}"
    return f"{body}.{_sign(secret, body)}", nonce


def session_nonce(key: str | None, value: str | None, now_s: float) -> str | None:
    """The nonce of a valid, unexpired cookie value; None for anything else."""
    secret = _secret(key)
    parts = (value or "").split(".")
    if secret is None or len(parts) != 3 or not parts[0].isdigit():
        return None
    expiry, nonce, signature = parts
    if not hmac.compare_digest(signature, _sign(secret, f"{expiry}.{nonce}")):
        return None
    return nonce if int(expiry) > now_s else None


def csrf_token(key: str | None, nonce: str) -> str:
    """The page's token for the session: the header X-CSRF-Token of its state-changing requests."""
    secret = _secret(key)
    assert secret is not None
    return _sign(secret, "csrf\0" + nonce)


def cookie_value(headers: Mapping[str, str]) -> str | None:
    """The session cookie from a request's (lower-cased) headers."""
    for part in headers.get("cookie", "").split(";"):
        name, _, value = part.strip().partition("=")
        if name == COOKIE:
            return value
    return None


def foreign_origin(headers: Mapping[str, str]) -> str | None:
    """The request's Origin when the browser named one that is not this server (lower-cased headers)."""
    origin = headers.get("origin")
    return origin if origin is not None and origin.split("://", 1)[-1] != headers.get("host", "") else None


def cross_site_problem(key: str | None, method: str, headers: Mapping[str, str], nonce: str) -> str | None:
    """Why a cookie-authenticated request is refused as possibly cross-site, or None."""
    if method not in UNSAFE:
        return None
    origin = foreign_origin(headers)
    if origin is not None:
        return f"cross-site request refused: Origin {origin} is not this server ({headers.get('host', '')})"
    given = headers.get("x-csrf-token", "")
    if not hmac.compare_digest(given, csrf_token(key, nonce)):
        return "cross-site request refused: the page's X-CSRF-Token is missing or wrong (reload the page)"
    return None


def client_of(host: str | None) -> str:
    """Whom sign-in tries are counted for: the client's IPv4 address, or its IPv6 /64 (a machine often holds
    a whole /64, and counting its addresses one by one would give it 2^64 fresh starts)."""
    try:
        address = ipaddress.ip_address(host or "")
    except ValueError:
        return host or "unknown"  # a unix socket's client has no address
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)
