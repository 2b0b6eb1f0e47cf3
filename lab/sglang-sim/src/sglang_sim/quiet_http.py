"""The simulator's HTTP servers drop a client that goes away as uvicorn does (lab equipment)."""

from __future__ import annotations

import sys
from http.server import ThreadingHTTPServer


class DisconnectQuietHTTPServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer that says nothing when a client resets or drops its connection mid-request.

    SGLang serves HTTP with uvicorn, which notes a lost connection at debug (trace in later releases) level only
    (encode/uvicorn ``uvicorn/protocols/http/h11_impl.py``, ``H11Protocol.connection_lost``): no traceback. Python's
    socketserver prints one to stderr for any exception of a request (``BaseServer.handle_error``), a
    ``ConnectionResetError`` included, and the deploy's health check reads "Traceback (most recent call last)" in the
    engine's journal as an engine error (``sglang_server_journal_error_patterns``): one client that timed out would
    fail a healthy server's next proof. Every other exception is printed as before.
    """

    def handle_error(self, request, client_address) -> None:
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)
