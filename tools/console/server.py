"""The console's HTTP server: the standard library's ThreadingHTTPServer, read-only (GET only),
serving one static page and the JSON endpoints of tools.console.api.

Every request needs the token (tools.console.access), or it is answered 403 with nothing
else; the static files ship inside the package (tools/console/static) and the page loads
nothing from elsewhere, which the Content-Security-Policy header also enforces.
"""

from __future__ import annotations

import json
import logging
import mimetypes
import socket
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

from engine.errors import BadInputError, StoreError
from tools.console.access import ListenAddress, TokenCheck
from tools.console.api import Api, NotFound

STATIC_DIR = Path(__file__).resolve().parent / "static"
INDEX_PAGE = "index.html"
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self'; connect-src 'self'; frame-ancestors 'none'; "
                               "base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",  # the first URL carries the token
    "Cache-Control": "no-store",
}

log = logging.getLogger(__name__)


def static_files() -> dict[str, Path]:
    """URL path -> file of every shipped static asset; nothing else is served from disk."""
    files = {f"/static/{p.name}": p for p in STATIC_DIR.iterdir() if p.is_file()}
    files["/"] = STATIC_DIR / INDEX_PAGE
    return files


class ConsoleServer(ThreadingHTTPServer):
    """One console: its token, its API and its static files."""

    daemon_threads = True

    def __init__(self, address: ListenAddress, api: Api, token: str):
        self.address_family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
        self.api = api
        self.static = static_files()
        super().__init__((address.host, address.port), ConsoleHandler)
        self.tokens = TokenCheck(token, self.port)  # the port is known once bound (--listen :0)

    @property
    def port(self) -> int:
        return self.server_address[1]


class ConsoleHandler(BaseHTTPRequestHandler):
    server: ConsoleServer
    server_version = "mqstore-console"
    sys_version = ""

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        tokens = self.server.tokens
        by_query = tokens.from_query(url.query)
        if not by_query and not tokens.from_cookie(self.headers.get("Cookie")):
            self._reply(HTTPStatus.FORBIDDEN, b"403: this console needs the token printed when "
                        b"it started (open the URL it printed)\n", "text/plain; charset=utf-8")
            return
        extra = {"Set-Cookie": tokens.set_cookie_header()} if by_query else {}
        if url.path.startswith("/api/"):
            self._api(url.path, url.query, extra)
        elif url.path in self.server.static:
            path = self.server.static[url.path]
            kind = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
            if kind.startswith("text/") or kind.endswith("javascript"):
                kind += "; charset=utf-8"
            self._reply(HTTPStatus.OK, path.read_bytes(), kind, extra)
        else:
            self._reply(HTTPStatus.NOT_FOUND, b"404: no such page\n", "text/plain; charset=utf-8",
                        extra)

    def _api(self, path: str, query: str, extra: dict) -> None:
        try:
            status, data = HTTPStatus.OK, self.server.api.answer(path, query)
        except NotFound:
            status, data = HTTPStatus.NOT_FOUND, {"error": f"no endpoint {path}"}
        except BadInputError as exc:
            status, data = HTTPStatus.BAD_REQUEST, {"error": str(exc), "field": exc.field}
        except StoreError as exc:  # the store is not readable now (not a store, permissions)
            status, data = HTTPStatus.SERVICE_UNAVAILABLE, {"error": str(exc)}
        body = json.dumps(data, default=str).encode()
        self._reply(status, body, "application/json", extra)

    def _reply(self, status: HTTPStatus, body: bytes, content_type: str,
               extra: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in {**SECURITY_HEADERS, **(extra or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:
        """Requests go to the log at DEBUG, without the query: it may hold the token."""
        log.debug("%s %s %s", self.address_string(), self.command, urlsplit(self.path).path)
