"""Who may use the console: a listen address on loopback unless asked otherwise, and a token.

Other local users can reach loopback ports while the store is owner-only, so every request
must carry the token printed at start (as Jupyter does): once as `?token=` in the URL, after
which the answer sets it as an HttpOnly, SameSite=Strict cookie the browser sends back. The
cookie's name holds the port, as cookies are shared by every port of a host: two consoles on
one host keep their own.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import socket
from dataclasses import dataclass
from enum import Enum
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qs

from engine.errors import BadInputError

DEFAULT_LISTEN = "127.0.0.1:8460"
COOKIE_PREFIX = "mqstore-console-"
TOKEN_BYTES = 32


class RemoteAccess(Enum):
    """Whether a non-loopback listen address is allowed (`--allow-remote`)."""

    LOOPBACK_ONLY = "loopback-only"
    ALLOWED = "allowed"


@dataclass(frozen=True)
class ListenAddress:
    host: str
    port: int

    @property
    def url_host(self) -> str:
        return f"[{self.host}]" if ":" in self.host else self.host


def parse_listen(text: str, remote: RemoteAccess) -> ListenAddress:
    """HOST:PORT (IPv6 as [::1]:PORT); a host that is not loopback is refused unless `remote`
    allows it, since the console shows every message body of the store."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise BadInputError("listen", f"{text!r} is not HOST:PORT (e.g. {DEFAULT_LISTEN})")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise BadInputError("listen", f"port {port} is not in 0..65535")
    if remote is RemoteAccess.LOOPBACK_ONLY and not is_loopback(host):
        raise BadInputError("listen", f"{host} is not a loopback address; the console shows every "
                            "message of the store, so it listens on 127.0.0.1 or ::1 unless "
                            "--allow-remote is given")
    return ListenAddress(host, port)


def is_loopback(host: str) -> bool:
    """True when every address `host` names is a loopback one (localhost resolves)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def new_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


def cookie_name(port: int) -> str:
    return f"{COOKIE_PREFIX}{port}"


class TokenCheck:
    """Compares a request's token (query or cookie) with the console's in constant time."""

    def __init__(self, token: str, port: int):
        self.token = token
        self.cookie_name = cookie_name(port)

    def from_query(self, query: str) -> bool:
        values = parse_qs(query).get("token", [])
        return any(self._same(value) for value in values)

    def from_cookie(self, header: str | None) -> bool:
        if not header:
            return False
        try:
            cookie = SimpleCookie(header)
        except CookieError:
            return False
        morsel = cookie.get(self.cookie_name)
        return morsel is not None and self._same(morsel.value)

    def set_cookie_header(self) -> str:
        return f"{self.cookie_name}={self.token}; HttpOnly; SameSite=Strict; Path=/"

    def _same(self, value: str) -> bool:
        return hmac.compare_digest(value.encode(), self.token.encode())
