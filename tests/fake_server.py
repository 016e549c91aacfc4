"""A fake OpenAI-compatible streaming server on 127.0.0.1 for the live-command tests.

It also answers SGLang's native `/generate` with `input_ids`, as a server started with
`--skip-tokenizer-init` does: chunks carry the cumulative `output_ids` and `meta_info`.

One engine thread steps the batch like a real server: every step takes
`step_time(batch size)` seconds and gives each running request `tokens_per_step` tokens,
so the throughput-vs-concurrency curve is whatever `step_time` makes it. Answers are
deterministic: the tokens depend only on the prompt (`alter` may change them, to play a
server that decodes differently). `die_after` requests, the server drops every connection
and stops listening, to play a crash. `reshape` rewrites every streamed event's JSON value
before it is sent, to play a server that streams other shapes. `stall` answers a completion
with its headers and then nothing ("silent") or an SSE comment every 0.2 s ("pings") until
the server stops, to play a server that never finishes.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

WORDS = (
    " the", " a", " gate", " token", " batch", " draft", " verify", " step", " server",
    " model", " fast", " slow", " and", " of", " to", " in", " is", ".", ",", " GPU",
)


def tokens_for(prompt: str, n: int) -> list[str]:
    """The fake model's greedy answer: a fixed function of the prompt."""
    seed = zlib.crc32(prompt.encode())
    out = []
    for i in range(n):
        seed = (seed * 1103515245 + 12345 + i) & 0x7FFFFFFF
        out.append(WORDS[seed % len(WORDS)])
    return out


class _Listener(ThreadingHTTPServer):
    # socketserver's default backlog of 5 drops bursts of connections (1 s SYN retries).
    request_queue_size = 1024
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients hanging up (and the simulated crash) are expected here


@dataclass
class _Request:
    tokens: list[str]
    prompt_tokens: int  # the fake tokenizer's count: one token per word (per id on /generate)
    sent: int = 0
    chunks: queue.Queue[tuple[list[str], bool] | None] = field(default_factory=queue.Queue)


class FakeServer:
    """Start with `with FakeServer(...) as server:`; `server.url` is its base URL."""

    def __init__(
        self,
        step_time: Callable[[int], float] = lambda n: 0.001,
        tokens_per_step: int = 1,
        alter: Callable[[str, list[str]], list[str]] | None = None,
        die_after: int | None = None,
        models: bool = True,
        reshape: Callable[[dict[str, Any]], Any] | None = None,
        stall: Literal["silent", "pings"] | None = None,
    ) -> None:
        self.step_time = step_time
        self.tokens_per_step = tokens_per_step
        self.alter = alter
        self.die_after = die_after
        self.models = models
        self.reshape = reshape
        self.stall = stall
        self._closing = threading.Event()
        self.admitted = 0
        self.max_batch = 0
        self.dead = False
        self._active: list[_Request] = []
        self._cond = threading.Condition()
        self._stop = False
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def do_GET(self) -> None:  # noqa: N802
                if self.path == "/v1/models" and fake.models:
                    self._json(200, {"object": "list", "data": [{"id": "fake-model"}]})
                else:
                    self._json(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                chat = self.path == "/v1/chat/completions"
                native = self.path == "/generate"
                if self.path not in ("/v1/completions", "/v1/chat/completions", "/generate"):
                    self._json(404, {"error": {"message": f"no route {self.path}"}})
                    return
                if native:
                    if not isinstance(body.get("input_ids"), list):
                        self._json(400, {"error": {"message": "input_ids required (no tokenizer)"}})
                        return
                    sampling = body.get("sampling_params") or {}
                    body = {"prompt": " ".join(map(str, body["input_ids"])),
                            "max_tokens": sampling.get("max_new_tokens", 16),
                            "temperature": sampling.get("temperature", 1.0)}
                if body.get("temperature", 1.0) != 0.0:
                    self._json(400, {"error": {"message": "the fake server is greedy only"}})
                    return
                if fake.stall is not None:
                    self._stream_headers()
                    while not fake._closing.wait(0.2):
                        if fake.stall == "pings":
                            self._write(b": ping\n\n")
                    return
                req = fake._admit(body, chat)
                if req is None:
                    self.close_connection = True
                    return
                self._stream_headers()
                want_lp = body.get("logprobs") is not None and body.get("logprobs") is not False
                ids: list[int] = []
                while True:
                    item = req.chunks.get()
                    if item is None:
                        break
                    if fake.dead:
                        self.close_connection = True
                        return
                    if native:
                        ids += [WORDS.index(t) for t in item[0]]
                        self._event(_native_chunk(ids, req.prompt_tokens, finish=item[1]))
                    else:
                        self._event(_chunk(item[0], chat, want_lp, finish=item[1]))
                if fake.dead:
                    self.close_connection = True
                    return
                if (body.get("stream_options") or {}).get("include_usage"):
                    self._event({"choices": [], "usage": {"prompt_tokens": req.prompt_tokens,
                                                          "completion_tokens": len(req.tokens)}})
                self._write(b"data: [DONE]\n\n")
                self._write(b"")
                self.close_connection = True

            def _stream_headers(self) -> None:
                self.send_response(200)
                self.send_header("Connection", "close")
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()

            def _event(self, data: dict[str, Any]) -> None:
                sent = data if fake.reshape is None else fake.reshape(data)
                self._write(f"data: {json.dumps(sent)}\n\n".encode())

            def _write(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def _json(self, status: int, data: dict[str, Any]) -> None:
                raw = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self._httpd = _Listener(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._threads = [
            threading.Thread(target=self._httpd.serve_forever, daemon=True),
            threading.Thread(target=self._engine, daemon=True),
        ]

    def _admit(self, body: dict[str, Any], chat: bool) -> _Request | None:
        prompt = body["messages"][-1]["content"] if chat else body["prompt"]
        tokens = tokens_for(prompt, int(body.get("max_tokens", 16)))
        if self.alter is not None:
            tokens = self.alter(prompt, tokens)
        req = _Request(tokens, len(prompt.split()))
        with self._cond:
            self.admitted += 1
            if self.dead or (self.die_after is not None and self.admitted > self.die_after):
                self._die()
                return None
            self._active.append(req)
            self._cond.notify()
        return req

    def _die(self) -> None:
        """Crash: abort every stream, stop listening. Called with the lock held."""
        if self.dead:
            return
        self.dead = True
        for req in self._active:
            req.chunks.put(None)
        self._active.clear()
        threading.Thread(target=self._close_listener, daemon=True).start()

    def _close_listener(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def _engine(self) -> None:
        step_end = 0.0
        while True:
            with self._cond:
                while not self._active and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                batch = list(self._active)
            self.max_batch = max(self.max_batch, len(batch))
            duration = self.step_time(len(batch))
            # Steps run back to back on a clock, so this thread's own Python overhead (and
            # waiting for the GIL) is absorbed into the step instead of added to it.
            now = time.perf_counter()
            start = step_end if now - step_end < duration / 2 else now
            step_end = start + duration
            time.sleep(max(0.0, step_end - time.perf_counter()))
            with self._cond:
                for req in batch:
                    if self.dead:
                        break
                    toks = req.tokens[req.sent : req.sent + self.tokens_per_step]
                    req.sent += len(toks)
                    req.chunks.put((toks, req.sent >= len(req.tokens)))
                    if req.sent >= len(req.tokens):
                        req.chunks.put(None)
                        self._active.remove(req)

    def __enter__(self) -> FakeServer:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if not self.dead:
            self._httpd.shutdown()
            self._httpd.server_close()


def _chunk(toks: list[str], chat: bool, logprobs: bool, finish: bool) -> dict[str, Any]:
    text = "".join(toks)
    choice: dict[str, Any] = {"index": 0, "finish_reason": "length" if finish else None}
    if chat:
        choice["delta"] = {"content": text}
        if logprobs:
            choice["logprobs"] = {"content": [{"token": t, "logprob": -0.5} for t in toks]}
    else:
        choice["text"] = text
        if logprobs:
            choice["logprobs"] = {"tokens": toks, "token_logprobs": [-0.5] * len(toks)}
    return {"id": "fake", "object": "chat.completion.chunk" if chat else "text_completion",
            "choices": [choice]}


def _native_chunk(ids: list[int], prompt_tokens: int, finish: bool) -> dict[str, Any]:
    meta = {"prompt_tokens": prompt_tokens, "completion_tokens": len(ids),
            "finish_reason": {"type": "length", "length": len(ids)} if finish else None}
    return {"output_ids": list(ids), "meta_info": meta}


def linear_step(fixed_s: float, per_request_s: float) -> Callable[[int], float]:
    """A step time of `fixed_s + per_request_s * batch`: throughput k*n/(a + b*n)."""
    return lambda n: fixed_s + per_request_s * n
