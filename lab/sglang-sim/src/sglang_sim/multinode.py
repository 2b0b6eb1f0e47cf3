"""Multi-node tensor parallel (``--nnodes > 1``) as sglang 0.5.9 does it, without GPUs.

* Rendezvous (``model_executor/model_runner.py: init_distributed_environment`` with
  ``distributed_init_method=f"tcp://{dist_init_addr}"``, world ``tp*pp``): torch's TCPStore listens on the
  ``--dist-init-addr`` port in the process of global rank 0 (node 0); every other rank connects to it, retrying
  until the process-group timeout (``--dist-timeout``, else torch's default of 30 minutes), and
  ``init_process_group`` returns only when the whole world has joined. So node 0 is never ready while a node is
  missing, and a node that is up waits for node 0. Without ``--dist-init-addr`` each node uses
  ``tcp://127.0.0.1:<its own port>``: the nodes never meet.
* After the join, a node of rank >= 1 runs no tokenizer manager and no detokenizer
  (``entrypoints/engine.py: _launch_subprocesses``: ``if server_args.node_rank >= 1``): once its schedulers
  are ready it starts ``launch_dummy_health_check_server`` (``srt/utils/common.py``), which answers only
  ``/health``, ``/health_generate`` and ``/ping`` with 200 (no generation behind it, no API key) and 404 for
  everything else, then joins its schedulers forever. No SIGTERM handler is installed there (the tokenizer
  manager installs it on node 0; uvicorn runs in a daemon thread, so it captures no signal): SIGTERM ends the
  process at once.
* A node that leaves after the join stalls the others' collectives: node 0's requests get no further token
  (the simulator marks its engine hung), as NCCL hangs.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler

from .log import log
from .quiet_http import DisconnectQuietHTTPServer

DEFAULT_TIMEOUT_S = 1800.0  # torch.distributed default_pg_timeout (30 minutes)


class RendezvousError(RuntimeError):
    pass


def init_addr(args) -> tuple[str, int]:
    if args.dist_init_addr:
        host, _, port = str(args.dist_init_addr).rpartition(":")
        if not host or not port.isdigit():
            raise RendezvousError(
                f"ValueError: --dist-init-addr must be host:port of the head node, got {args.dist_init_addr!r}"
            )
        return host.strip("[]"), int(port)
    # no --dist-init-addr: tcp://127.0.0.1:<dist port> of this node (a free port), which no other node reaches
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return "127.0.0.1", s.getsockname()[1]


class Rendezvous:
    """The TCPStore of node 0 and the clients of the other nodes, one connection per node."""

    def __init__(self, args, on_peer_lost):
        self.args = args
        self.nnodes = int(args.nnodes or 1)
        self.rank = int(args.node_rank or 0)
        self.timeout = float(args.dist_timeout) if args.dist_timeout else DEFAULT_TIMEOUT_S
        self.on_peer_lost = on_peer_lost
        self.peers: list[socket.socket] = []
        self.listener: socket.socket | None = None

    def join(self) -> None:
        host, port = init_addr(self.args)
        log(f"Init torch distributed begin. dist_init_method=tcp://{host}:{port} node_rank={self.rank}")
        if self.rank == 0:
            self._serve(port)
        else:
            self._connect(host, port)
        log(f"Init torch distributed ends. nnodes={self.nnodes} node_rank={self.rank}")

    def _serve(self, port: int) -> None:
        lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            lst.bind(("0.0.0.0", port))
        except OSError as e:
            raise RendezvousError(
                "torch.distributed.DistNetworkError: The server socket has failed to listen on any local "
                f"network address. port: {port}, useIpv6: False, code: -{e.errno}, name: {e.strerror}"
            ) from e
        lst.listen(64)
        self.listener = lst
        joined: dict[int, socket.socket] = {}
        deadline = time.monotonic() + self.timeout
        while len(joined) < self.nnodes - 1:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RendezvousError(
                    f"torch.distributed.DistStoreError: Timed out after {int(self.timeout)} seconds waiting for "
                    f"clients. {len(joined) + 1}/{self.nnodes} nodes joined."
                )
            lst.settimeout(min(left, 1.0))
            try:
                conn, _ = lst.accept()
            except TimeoutError:
                continue
            conn.settimeout(5)
            try:
                hello = json.loads(conn.makefile().readline() or "{}")
            except (OSError, ValueError):
                conn.close()
                continue
            rank = int(hello.get("node_rank", -1))
            if hello.get("nnodes") != self.nnodes or not 0 < rank < self.nnodes:
                log(f"Rendezvous: refused a node with {hello} (nnodes={self.nnodes})")
                conn.close()
                continue
            if rank in joined:
                joined[rank].close()
            joined[rank] = conn
        for conn in joined.values():
            conn.sendall(b"go\n")
            conn.settimeout(None)
            self.peers.append(conn)
            threading.Thread(target=self._watch, args=(conn,), daemon=True).start()

    def _connect(self, host: str, port: int) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            conn = None
            try:
                conn = socket.create_connection((host, port), timeout=2)
                conn.sendall((json.dumps({"node_rank": self.rank, "nnodes": self.nnodes}) + "\n").encode())
                conn.settimeout(max(1.0, deadline - time.monotonic()))
                if conn.makefile().readline().strip() == "go":
                    conn.settimeout(None)
                    self.peers.append(conn)
                    return
            except OSError:
                pass
            if conn is not None:
                conn.close()
            if time.monotonic() >= deadline:
                raise RendezvousError(
                    f"torch.distributed.DistStoreError: Timed out after {int(self.timeout)} seconds connecting "
                    f"to the store at {host}:{port} (node_rank {self.rank})"
                )
            time.sleep(1.0)

    def _watch(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while conn.recv(64):
                pass
        self.on_peer_lost()


class _DummyHealthHandler(BaseHTTPRequestHandler):
    server_version = "uvicorn"
    sys_version = ""

    def log_message(self, format, *args):  # noqa: A002 - log_level="warning": no access log
        return

    def _answer(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in ("/health", "/health_generate", "/ping"):
            body, code = b"", 200
        else:
            body, code = b'{"detail":"Not Found"}', 404
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.send_header("X-Gpufleet-Simulator", "sglang-sim")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_POST = do_HEAD = _answer  # noqa: N815


def launch_dummy_health_check_server(host: str, port: int) -> None:
    """srt/utils/common.py launch_dummy_health_check_server: uvicorn in a daemon thread (log level warning)."""
    try:
        httpd = DisconnectQuietHTTPServer((host, port), _DummyHealthHandler)
    except OSError as e:
        log(f"ERROR:    [Errno {e.errno}] error while attempting to bind on address ('{host}', {port}): {e.strerror}")
        return
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
