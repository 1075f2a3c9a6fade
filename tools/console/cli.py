"""`mqstore console`: serve the read-only web console of a store until Ctrl-C or SIGTERM.

    mqstore console --store ./data [--listen 127.0.0.1:8460] [--allow-remote]

It prints the URL with the access token on stdout (one line, `console: http://...`), which is
the only way in; a non-loopback --listen is refused without --allow-remote.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from engine.errors import BadInputError, NotAStoreError
from engine.files.store_dir import StoreKind, inspect_store_dir
from tools.console.access import DEFAULT_LISTEN, RemoteAccess, new_token, parse_listen
from tools.console.api import Api
from tools.console.sampler import StatusSampler
from tools.console.server import ConsoleServer
from workers.exit_codes import CliExit, cli_epilog


def add_console_parser(subparsers) -> None:
    p = subparsers.add_parser("console", help="serve a read-only web console of a store",
                              description="Serve a read-only web console: overview, topics, "
                              "groups and lag, message lookup, recent events. Prints the URL with "
                              "its access token.", epilog=cli_epilog(),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", default="data", help="store directory (default ./data)")
    p.add_argument("--listen", default=DEFAULT_LISTEN,
                   help=f"HOST:PORT to listen on (default {DEFAULT_LISTEN}; port 0 picks a free one)")
    p.add_argument("--allow-remote", action="store_const", dest="remote",
                   const=RemoteAccess.ALLOWED, default=RemoteAccess.LOOPBACK_ONLY,
                   help="allow a non-loopback --listen address (anyone who has the token there "
                   "reads every message)")


def run_console(args: argparse.Namespace) -> int:
    from tools.logging_setup import setup_logging

    setup_logging("console")
    address = parse_listen(args.listen, args.remote)  # refused before anything is opened
    root = Path(args.store)
    kind = inspect_store_dir(root)
    if kind is StoreKind.NEW:
        raise NotAStoreError("no store here: nothing to show", path=str(root))
    token = new_token()
    sampler = StatusSampler(root).start()
    try:
        server = ConsoleServer(address, Api(root, sampler), token)
    except OSError as exc:
        sampler.stop()
        raise BadInputError("listen", f"cannot listen on {args.listen}: {exc.strerror}") from None
    url = f"http://{address.url_host}:{server.port}/?token={token}"
    print(f"console: {url}", flush=True)
    print("(the token is required by every request; Ctrl-C stops the console)", file=sys.stderr)
    signal.signal(signal.SIGTERM, lambda signum, frame: threading.Thread(target=server.shutdown).start())
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        sampler.stop()
    return CliExit.OK
