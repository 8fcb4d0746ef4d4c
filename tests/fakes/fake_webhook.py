"""A webhook receiver on 127.0.0.1 for the notice tests (issue 40): records each POST
(its JSON body and headers) and answers the status the test sets. It can be stopped and
started again on the same port (a webhook that is down for a while)."""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class FakeWebhook:
    port: int = field(default_factory=free_port)
    status: int = 200
    received: list[dict[str, Any]] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> None:
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                with hook._lock:
                    hook.received.append({"raw": raw, "body": json.loads(raw),
                                          "headers": dict(self.headers.items()),
                                          "status": hook.status})
                    status = hook.status
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                return

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True,
                         name="fake-webhook").start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def ids(self, status: int = 200) -> list[str]:
        """The notice ids received (answered with `status`), in arrival order."""
        with self._lock:
            return [r["body"]["id"] for r in self.received if r["status"] == status]
