"""A small streaming client for OpenAI-compatible servers (SGLang, vLLM), stdlib only.

It sends one greedy request, reads the server-sent-event stream and returns what the
live commands need: the text, the tokens when the server returns logprobs, and the
timing of every chunk (time to first token, gaps between chunks). No dependency beyond
`http.client`, so the measurement commands run on a bare GPU box.

`--api generate` talks to SGLang's native `/generate` with `input_ids` instead, for a
server started with `--skip-tokenizer-init` (no tokenizer, so no text prompts): each
prompt becomes a fixed pseudo-random list of token ids (`prompt_ids`).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import random
import reprlib
import socket
import threading
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from eaglegate.errors import UsageError, UserError

Api = Literal["auto", "completions", "chat", "generate"]
# Token ids of generated prompts: above the special tokens of common vocabularies and
# below the smallest vocabulary size in use (32000).
PROMPT_ID_RANGE = (100, 32000)
PROMPT_IDS = 256

# A fixed, varied prompt set: code, maths, prose, lists, translation. Greedy decoding on it
# exercises both well-predicted (high acceptance) and open-ended (low acceptance) text.
BUILTIN_PROMPTS: tuple[str, ...] = (
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Explain in three sentences why the sky is blue.",
    "List the first ten prime numbers, separated by commas.",
    "Translate to French: The weather is nice today and we are going to the park.",
    "Summarize the plot of Romeo and Juliet in one paragraph.",
    "What is 37 multiplied by 43? Show the steps.",
    "Write a haiku about a server running out of memory.",
    "Give three tips for writing clear technical documentation.",
    "Write a SQL query that returns the five customers with the highest total order value.",
    "Describe how a hash table handles collisions.",
    "Continue the sequence and explain the rule: 2, 6, 12, 20, 30,",
    "Write a short email asking a colleague to review a pull request.",
    "Explain the difference between a process and a thread.",
    "Write a bash one-liner that counts the lines of all .py files in a directory tree.",
    "What are the main causes of inflation? Answer briefly.",
    "Write the opening paragraph of a mystery story set in a lighthouse.",
)


class LiveRequestError(UserError):
    """One request to the server failed; the message is one line naming the cause."""


@dataclass(frozen=True)
class Endpoint:
    """Where requests go: `scheme://host:port` plus the completions path."""

    scheme: str
    host: str
    port: int
    path: str
    chat: bool
    native: bool = False  # SGLang's /generate with input_ids

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}{self.path}"

    @property
    def models_path(self) -> str:
        prefix = self.path.rsplit("/chat/completions", 1)[0] if self.chat else self.path
        return prefix.rsplit("/completions", 1)[0] + "/models"


@dataclass
class Generation:
    """One streamed completion.

    `tokens` holds the token strings from logprobs and `token_ids` the ids, each only when
    the server returned them (else empty). `itls_s` are the gaps between content chunks:
    with speculative decoding one chunk may carry several tokens, as in SGLang's
    `bench_serving`. `output_tokens` comes from the server's usage report when present;
    `prompt_tokens` only from it (None when the server did not say).
    """

    text: str = ""
    tokens: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    ttft_s: float = 0.0
    itls_s: list[float] = field(default_factory=list)
    latency_s: float = 0.0
    output_tokens: int = 0
    prompt_tokens: int | None = None
    finish_reason: str | None = None


API_CHOICES = ("auto", "completions", "chat", "generate")


def check_api(value: object) -> Api:
    """How requests are sent: one of `API_CHOICES`."""
    if value not in API_CHOICES:
        raise UsageError(f"--api must be auto, completions, chat or generate, not {value!r}")
    return value  # type: ignore[return-value]


def resolve_endpoint(url: str, api: Api = "auto") -> Endpoint:
    """Turn `host:port`, a base URL or a full completions URL into an endpoint.

    A URL that already ends in `/completions`, `/chat/completions` or `/generate` is used
    as given; otherwise `/v1/completions` (`/v1/chat/completions` with api="chat",
    `/generate` with api="generate") is appended.
    """
    raw = url if "://" in url else f"http://{url}"
    try:
        parts = urlsplit(raw)
    except ValueError as exc:  # e.g. an unclosed IPv6 bracket: http://[::1
        raise UsageError(f"not a URL: {url!r} ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"not an http(s) URL: {url!r}")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise UsageError(f"bad port in URL {url!r}: {exc}") from None
    path = parts.path.rstrip("/")
    if path.endswith("/generate") or api == "generate":
        if not path.endswith("/generate"):
            path += "/generate"
        if api not in ("auto", "generate"):
            raise UsageError(f"URL {url!r} does not match --api {api}")
        return Endpoint(parts.scheme, parts.hostname, port, path, chat=False, native=True)
    if path.endswith("/chat/completions"):
        chat = True
    elif path.endswith("/completions"):
        chat = False
    else:
        chat = api == "chat"
        if not path.endswith("/v1"):
            path += "/v1"
        path += "/chat/completions" if chat else "/completions"
    if api == "chat" and not chat or api == "completions" and chat:
        raise UsageError(f"URL {url!r} does not match --api {api}")
    return Endpoint(parts.scheme, parts.hostname, port, path, chat)


def load_prompts(path: str | Path | None) -> list[str]:
    """The built-in prompt set, or one prompt per line of a file.

    A line may be plain text, a JSON string, or a JSON object with a "prompt" or "text"
    field; blank lines are skipped.
    """
    if path is None:
        return list(BUILTIN_PROMPTS)
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise UserError(f"cannot read prompts file {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:  # binary, UTF-16
        raise UserError(f"prompts file {path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    prompts: list[str] = []
    for line in lines:
        if not line.strip():
            continue
        prompt: Any = line
        if line.lstrip()[:1] in ('"', "{"):
            try:
                value = json.loads(line)
            except (json.JSONDecodeError, RecursionError):  # then it is text
                value = line
            if isinstance(value, dict):
                value = value.get("prompt", value.get("text"))
            prompt = value
        if not isinstance(prompt, str) or not prompt:
            raise UserError(f"{path}: a line has no prompt text: {line[:60]!r}")
        prompts.append(prompt)
    if not prompts:
        raise UserError(f"prompts file {path} holds no prompts")
    return prompts


def _connection(endpoint: Endpoint, timeout: float) -> http.client.HTTPConnection:
    if endpoint.scheme == "https":
        return http.client.HTTPSConnection(endpoint.host, endpoint.port, timeout=timeout)
    return http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=timeout)


class _Deadline:
    """A whole request within `seconds`. A socket timeout bounds one read only, so a server
    that sends a byte now and then would hold a request for ever: when the time is up, a
    timer shuts the request's socket down, which ends the read blocked on it."""

    def __init__(self, seconds: float, bound: str = "--timeout bounds each request") -> None:
        # What a timer and a socket can wait (infinity would overflow both).
        if not 0 < seconds <= threading.TIMEOUT_MAX:
            raise UsageError(f"--timeout must be a number of seconds above 0 and at most "
                             f"{threading.TIMEOUT_MAX:.0f}, not {seconds!r}")
        self.seconds = seconds
        self.bound = bound  # what set `seconds`, for the message
        self.passed = False
        self._sock: socket.socket | None = None
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def watch(self, conn: http.client.HTTPConnection) -> None:
        """Connect `conn` and hold its socket (http.client lets go of it once a response says
        `Connection: close`, while the response still reads from it)."""
        conn.connect()
        self._sock = conn.sock
        if self.passed:  # the timer ran before the socket was here
            self._shutdown()

    def _expire(self) -> None:
        # Set before reading the socket, which `watch` sets before reading this: one of the
        # two shuts it down.
        self.passed = True
        self._shutdown()

    def _shutdown(self) -> None:
        if self._sock is not None:
            with suppress(OSError):  # closed meanwhile: the request is over anyway
                # The plain socket's shutdown, also under TLS: SSLSocket's own would drop
                # the TLS state under the reading thread.
                socket.socket.shutdown(self._sock, socket.SHUT_RDWR)

    def ended(self, exc: BaseException) -> bool:
        """Whether `exc` is the deadline's doing: the timer shut the socket down, or a read
        waited the socket's own timeout, which is the whole request's (the two race). A
        socket timeout has no errno; an OSError with ETIMEDOUT (a TimeoutError too) is the
        network's, whatever time has passed."""
        return self.passed or (isinstance(exc, TimeoutError) and exc.errno is None)

    def error(self, endpoint: Endpoint) -> LiveRequestError:
        return LiveRequestError(
            f"{endpoint.url} did not answer within {self.seconds:g} s ({self.bound})"
        )

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def prompt_ids(prompt: str, length: int = PROMPT_IDS) -> list[int]:
    """A prompt as token ids for a server without a tokenizer: the same ids for the same
    text on every run and machine (seeded by the text's SHA-256)."""
    seed = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:8], "big")
    rng = random.Random(seed)
    return [rng.randrange(*PROMPT_ID_RANGE) for _ in range(length)]


def first_model(endpoint: Endpoint, timeout: float = 10.0) -> str | None:
    """The first model id from `GET /v1/models`; None when the server has no such route.

    Also the reachability check: a refused or timed-out connection is a UserError.
    """
    conn = _connection(endpoint, timeout)
    models_path = (
        endpoint.path.rsplit("/generate", 1)[0] + "/v1/models"
        if endpoint.native
        else endpoint.models_path
    )
    with _Deadline(timeout, f"the model list is asked within {timeout:g} s, whatever --timeout says; "
                   "--model names the model without asking") as deadline:
        try:
            deadline.watch(conn)
            conn.request("GET", models_path, headers={"Accept": "application/json"})
            resp = conn.getresponse()
            body = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            if deadline.ended(exc):
                raise deadline.error(endpoint) from None
            raise LiveRequestError(
                f"cannot reach {endpoint.scheme}://{endpoint.host}:{endpoint.port}: {_describe(exc)}"
            ) from None
        finally:
            conn.close()
    if resp.status != 200:
        return None
    try:
        data = json.loads(body)
        model = data["data"][0]["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    return model if isinstance(model, str) else None


def request_body(
    endpoint: Endpoint,
    prompt: str,
    model: str | None,
    max_tokens: int,
    *,
    logprobs: bool,
    ignore_eos: bool,
) -> dict[str, Any]:
    """The JSON body of one greedy streaming request."""
    if endpoint.native:
        sampling: dict[str, Any] = {"max_new_tokens": max_tokens, "temperature": 0.0}
        if ignore_eos:
            sampling["ignore_eos"] = True
        native: dict[str, Any] = {
            "input_ids": prompt_ids(prompt),
            "sampling_params": sampling,
            "stream": True,
        }
        if logprobs:
            native["return_logprob"] = True
        return native
    body: dict[str, Any] = {
        "model": model or "default",
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if endpoint.chat:
        body["messages"] = [{"role": "user", "content": prompt}]
        if logprobs:
            body["logprobs"] = True
            body["top_logprobs"] = 0
    else:
        body["prompt"] = prompt
        if logprobs:
            body["logprobs"] = 0
    if ignore_eos:
        # SGLang and vLLM extension: every request then generates exactly max_tokens.
        body["ignore_eos"] = True
    return body


def _error_message(data: Any) -> str | None:
    if not isinstance(data, dict):
        return None
    error = data.get("error")
    if isinstance(error, dict):
        return str(error.get("message", error))
    if error:
        return str(error)
    if data.get("object") == "error":
        return str(data.get("message", data))
    return None


class _Malformed(ValueError):
    """A stream chunk that is JSON but not of the shape the API streams; the message names
    the field, for the one line the user sees."""


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Malformed(f"{what} is not an object")
    return value


def _array(value: Any, what: str) -> list[Any]:
    """A list; absent (null) is empty."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise _Malformed(f"{what} is not a list")
    return value


def _text(value: Any, what: str) -> str:
    """A string; absent (null) is empty."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _Malformed(f"{what} is not a string")
    return value


def _count(value: Any, what: str) -> int:
    """A whole number from 0 on: not a bool, NaN, a fraction or a string."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _Malformed(f"{what} is {reprlib.repr(value)}, not a count")
    return value


def _absorb(gen: Generation, choice: dict[str, Any], chat: bool) -> bool:
    """Add one stream choice to the generation; True when it carried content."""
    if chat:
        delta = choice.get("delta")
        text = _text(_object(delta, "delta").get("content") if delta is not None else None, "delta.content")
    else:
        text = _text(choice.get("text"), "text")
    gen.text += text
    got = bool(text)
    lp = choice.get("logprobs")
    if isinstance(lp, dict):  # else absent, or a form the comparison does not read
        if chat:
            for item in _array(lp.get("content"), "logprobs.content"):
                gen.tokens.append(_text(_object(item, "a logprobs.content item").get("token"), "token"))
                got = True
        else:
            tokens = [_text(t, "a logprobs token") for t in _array(lp.get("tokens"), "logprobs.tokens")]
            gen.tokens.extend(tokens)
            got = got or bool(tokens)
    ids = [_count(i, "a token id") for i in _array(choice.get("token_ids"), "token_ids")]
    gen.token_ids.extend(ids)
    got = got or bool(ids)
    if choice.get("finish_reason"):
        gen.finish_reason = str(choice["finish_reason"])
    return got


def _absorb_native(gen: Generation, data: dict[str, Any]) -> bool:
    """Add one `/generate` stream chunk; True when it carried new tokens.

    SGLang streams `output_ids` whole by default and as deltas with
    `--incremental-streaming-output`; `meta_info.completion_tokens` tells which."""
    meta = data.get("meta_info")
    meta = {} if meta is None else _object(meta, "meta_info")
    done_before = gen.output_tokens
    total = meta.get("completion_tokens")
    if total is not None:
        total = _count(total, "meta_info.completion_tokens")
    if data.get("output_ids") is not None:
        ids = [_count(i, "a token id") for i in _array(data["output_ids"], "output_ids")]
        if len(ids) == total:
            gen.token_ids = ids
        else:
            gen.token_ids.extend(ids)
    gen.output_tokens = len(gen.token_ids) if total is None else total
    if meta.get("prompt_tokens") is not None:
        gen.prompt_tokens = _count(meta["prompt_tokens"], "meta_info.prompt_tokens")
    finish = meta.get("finish_reason")
    if finish:
        gen.finish_reason = str(finish.get("type", finish) if isinstance(finish, dict) else finish)
    if isinstance(data.get("text"), str):
        gen.text = data["text"]
    return gen.output_tokens > done_before


def _absorb_chunk(gen: Generation, data: Any, endpoint: Endpoint) -> bool:
    """Add one decoded stream chunk of any API; True when it carried content."""
    chunk = _object(data, "the chunk")
    if endpoint.native:
        return _absorb_native(gen, chunk)
    usage = chunk.get("usage")
    if usage is not None:
        usage = _object(usage, "usage")
        if usage.get("completion_tokens") is not None:
            gen.output_tokens = _count(usage["completion_tokens"], "usage.completion_tokens")
        if usage.get("prompt_tokens") is not None:
            gen.prompt_tokens = _count(usage["prompt_tokens"], "usage.prompt_tokens")
    got = False
    for choice in _array(chunk.get("choices"), "choices"):
        got = _absorb(gen, _object(choice, "a choice"), endpoint.chat) or got
    return got


def generate(
    endpoint: Endpoint,
    prompt: str,
    *,
    model: str | None = None,
    max_tokens: int = 128,
    logprobs: bool = False,
    ignore_eos: bool = False,
    timeout: float = 300.0,
) -> Generation:
    """Stream one greedy completion within `timeout` seconds in all; raise LiveRequestError
    on any failure.

    A stream that stops before `[DONE]` and before a finish reason (the server died or
    dropped the connection) is a failure, not a short answer; so is a chunk of another
    shape than the API's, and a count of tokens above `max_tokens`.
    """
    body = json.dumps(
        request_body(endpoint, prompt, model, max_tokens, logprobs=logprobs, ignore_eos=ignore_eos)
    ).encode()
    gen = Generation()
    chunks = 0
    done = False
    conn = _connection(endpoint, timeout)
    start = time.perf_counter()
    last = start
    with _Deadline(timeout) as deadline:
        try:
            deadline.watch(conn)
            conn.request(
                "POST",
                endpoint.path,
                body=body,
                headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
            )
            resp = conn.getresponse()
            if resp.status != 200:
                detail = resp.read(2000).decode("utf-8", "replace")
                try:
                    detail = _error_message(json.loads(detail)) or detail
                except ValueError:
                    pass
                detail = " ".join(detail.split())[:200]
                raise LiveRequestError(f"HTTP {resp.status} from {endpoint.url}: {detail}")
            while True:
                raw = resp.readline()
                if not raw:
                    break
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    done = True
                    resp.read()  # the rest of the body, so closing does not reset the connection
                    break
                try:
                    data = json.loads(payload)
                    message = _error_message(data)
                    if message:
                        raise LiveRequestError(f"server error from {endpoint.url}: {message[:200]}")
                    got = _absorb_chunk(gen, data, endpoint)
                except (ValueError, RecursionError) as exc:  # not JSON, or JSON of another shape
                    why = f"{exc}: " if isinstance(exc, _Malformed) else ""
                    raise LiveRequestError(
                        f"bad stream chunk from {endpoint.url}: {why}{payload[:80]!r}"
                    ) from None
                if got:
                    now = time.perf_counter()
                    if chunks == 0:
                        gen.ttft_s = now - start
                    else:
                        gen.itls_s.append(now - last)
                    last = now
                    chunks += 1
        except LiveRequestError:
            raise
        except (OSError, http.client.HTTPException) as exc:  # TimeoutError is an OSError
            if deadline.ended(exc):
                raise deadline.error(endpoint) from None
            raise LiveRequestError(f"request to {endpoint.url} failed: {_describe(exc)}") from None
        finally:
            conn.close()
    if not done and gen.finish_reason is None:
        if deadline.passed:  # the shut-down socket reads as the end of the stream
            raise deadline.error(endpoint)
        raise LiveRequestError(f"stream from {endpoint.url} ended before the answer was complete")
    gen.latency_s = time.perf_counter() - start
    if not gen.output_tokens:
        gen.output_tokens = len(gen.token_ids) or len(gen.tokens) or chunks
    if gen.output_tokens > max_tokens:
        raise LiveRequestError(
            f"{endpoint.url} reported {gen.output_tokens} generated tokens for a request of at "
            f"most {max_tokens}"
        )
    return gen
