"""The embedded solver as a plain OpenAI chat endpoint on loopback, with a fault hook: call number
`fault_at` runs `fault` before it answers (kill the proxy, a container, ...), or, when `fault` is
one of UPSTREAM_FAULTS, misbehaves as a provider does instead of answering (once). Used by the
infrastructure-fault tests and `bench/faults.py`."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from solver_model.server import answer_conversation


# How a provider fails: 429 with and without Retry-After, a 500, a hang past the client's
# timeout, a body cut short (Content-Length promised, connection closed), a connection closed
# with no answer at all.
UPSTREAM_FAULTS = ("429-retry-after", "429", "500", "hang", "truncated", "reset")
HANG_S = 30.0


class SolverEndpoint(BaseHTTPRequestHandler):
    calls = 0
    fault_at: int | None = None
    fault: Callable[[], None] = staticmethod(lambda: None)
    lock = threading.Lock()

    @classmethod
    def arm(cls, at: int | None, fault: Callable[[], None] | str = lambda: None) -> None:
        """Count calls from 0 again; call number `at` (None: none) runs `fault` first, or
        misbehaves as the named upstream fault."""
        cls.calls, cls.fault_at = 0, at
        cls.fault = fault if isinstance(fault, str) else staticmethod(fault)

    def _misbehave(self, kind: str) -> None:
        error = json.dumps({"error": {"message": f"scripted {kind}", "type": "server_error"}}).encode()
        try:
            if kind.startswith("429") or kind == "500":
                self.send_response(int(kind[:3]))
                if kind == "429-retry-after":
                    self.send_header("Retry-After", "1")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(error)))
                self.end_headers()
                self.wfile.write(error)
            elif kind == "hang":
                time.sleep(HANG_S)
            elif kind == "truncated":
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "4096")
                self.end_headers()
                self.wfile.write(b'{"id": "c", "object": "chat.compl')
            self.close_connection = True  # "reset", "truncated", "hang": the connection just ends
        except OSError:
            pass

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.lock:
            type(self).calls += 1
            now = self.calls
        if now == self.fault_at:
            if isinstance(self.fault, str):
                return self._misbehave(self.fault)
            self.fault()
        text = answer_conversation(body["messages"], "low").text
        payload = json.dumps({"id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
                              "choices": [{"index": 0, "finish_reason": "stop",
                                           "message": {"role": "assistant", "content": text}}],
                              "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except OSError:
            pass  # the proxy that asked is gone

    def log_message(self, *args):
        pass


def serve(host: str = "127.0.0.1") -> tuple[str, ThreadingHTTPServer]:
    """Start the endpoint in a daemon thread: (base URL, server). A harness cell's proxy
    container reaches the host on the default bridge's gateway (`sandboxes.networks.host_address`)."""
    server = ThreadingHTTPServer((host, 0), SolverEndpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://{host}:{server.server_port}/v1", server
