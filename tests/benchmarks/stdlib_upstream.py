"""A minimal OpenAI-style model server on the standard library, for the benchmarks.

    python tests/benchmarks/stdlib_upstream.py --port PORT

The cheapest upstream Python offers (``http.server``, HTTP/1.1 keep-alive, one thread per
connection), so that the benchmarks time the proxy rather than the model server: the fake
server of the e2e tests is itself a hypercorn app and costs as much per request as the
proxy's own server side.

* ``GET /health``: 200;
* ``POST /v1/chat/completions``: reads the whole body (of any size), then answers a small
  JSON completion with ``usage``; with ``"stream": true``, ``max_tokens`` SSE chunks,
  each in its own socket write (as llama-server sends each token) as fast as the socket
  takes them, or ``interval_ms`` apart if the request says so (a model's pace), then a
  chunk with ``usage`` and ``data: [DONE]``;
* ``POST /v1/embeddings``: whatever the request, 40 embeddings of 1024 numbers (about
  850 KB of JSON) and ``usage`` at the end, as a batch of a RAG indexing job gets.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ANSWER = json.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hi"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 8, "total_tokens": 13},
    }
).encode()

_numbers = random.Random(0)
EMBEDDINGS = json.dumps(
    {
        "object": "list",
        "data": [
            {
                "object": "embedding",
                "index": i,
                "embedding": [_numbers.uniform(-1, 1) for _ in range(1024)],
            }
            for i in range(40)
        ],
        "model": "m",
        "usage": {"prompt_tokens": 400, "total_tokens": 400},
    }
).encode()

CHUNK = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","model":"m",'
    b'"choices":[{"index":0,"delta":{"content":"tok"}}]}\n\n'
)
LAST = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","model":"m","choices":[],'
    b'"usage":{"prompt_tokens":5,"completion_tokens":%d}}\n\ndata: [DONE]\n\n'
)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self._answer(200, b"{}")

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.path == "/v1/embeddings":
            self._answer(200, EMBEDDINGS)
            return
        if b'"stream":true' not in body.replace(b" ", b"")[:4096]:
            self._answer(200, ANSWER)
            return
        document = json.loads(body)
        count = int(document.get("max_tokens", 16))
        interval = float(document.get("interval_ms", 0)) / 1000
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        framed = b"%x\r\n%s\r\n" % (len(CHUNK), CHUNK)
        send = self.connection.sendall
        for _ in range(count):
            send(framed)
            if interval:
                time.sleep(interval)
        last = LAST % count
        send(b"%x\r\n%s\r\n0\r\n\r\n" % (len(last), last))

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    port = parser.parse_args().port
    Handler.wbufsize = 1 << 16  # one write per response rather than one per header line
    Handler.disable_nagle_algorithm = True
    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer.request_queue_size = 2048
    with ThreadingHTTPServer(("127.0.0.1", port), Handler) as server:
        print(f"listening on 127.0.0.1:{port}", flush=True)
        server.serve_forever()


if __name__ == "__main__":
    main()
