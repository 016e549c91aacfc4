"""The third fault catalogue's live and MCP cases (issue 45, sections 3 to 5), replayed as
written: `sweep` and `verify-live` against real local servers on 127.0.0.1 that stream
other shapes or never finish, `calibrate` on files that hold no measurement, and raw
JSON-RPC lines to `eaglegate mcp` over its stdio. Each ends in one line on stderr and the
README's exit code (or a JSON-RPC answer), never a traceback nor a figure at exit 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest

from eaglegate.agents import tools
from eaglegate.errors import UserError

from fake_server import FakeServer
from test_faults_cli import eaglegate, error_line

# A command that never ends fails here, not at the suite's 15 minutes.
pytestmark = pytest.mark.timeout(120)


# ---------------------------------------------------------------- a server that streams other shapes


def _choice(**fields: Any) -> Callable[[dict[str, Any]], Any]:
    """Every content chunk's choice with `fields` set."""
    return lambda e: {**e, "choices": [{**e["choices"][0], **fields}]} if e.get("choices") else e


def _usage(tokens: Any) -> Callable[[dict[str, Any]], Any]:
    """The usage report with `completion_tokens: tokens`."""
    return lambda e: {**e, "usage": {"completion_tokens": tokens}} if "usage" in e else e


SHAPES = [
    pytest.param(lambda e: {**e, "choices": ["x"]}, "a choice is not an object", id="choices-x"),
    pytest.param(lambda e: [e], "the chunk is not an object", id="bare-list"),
    pytest.param(_usage("many"), "usage.completion_tokens is 'many', not a count", id="tokens-many"),
    pytest.param(_usage(float("nan")), "usage.completion_tokens is nan, not a count", id="tokens-nan"),
    pytest.param(_usage(-5), "usage.completion_tokens is -5, not a count", id="tokens-negative"),
    pytest.param(_usage(10**30), f"reported {10**30} generated tokens for a request of at most 8",
                 id="tokens-beyond-max"),
    pytest.param(_choice(token_ids=["x"]), "a token id is 'x', not a count", id="token-ids"),
    pytest.param(lambda e: {**e, "usage": {**e["usage"], "prompt_tokens": -1}} if "usage" in e else e,
                 "usage.prompt_tokens is -1, not a count", id="prompt-tokens-negative"),
]


@pytest.mark.parametrize("command", ["sweep", "verify-live"])
@pytest.mark.parametrize(("reshape", "message"), SHAPES)
def test_a_stream_of_another_shape_is_one_line_and_no_measurement(tmp_path, command, reshape, message):
    out = tmp_path / "sweep.jsonl"
    with FakeServer(reshape=reshape) as odd, FakeServer() as plain:
        args = (["sweep", "--url", odd.url, "-c", "1", "-o", str(out)] if command == "sweep"
                else ["verify-live", "--url", odd.url, "--baseline-url", plain.url, "--high", "2"])
        line = error_line(eaglegate(*args, "--max-tokens", "8"))
    assert line.startswith("error: ") and message in line, line
    assert not out.exists()  # nothing measured was written


def test_native_token_ids_of_another_shape_are_one_line(tmp_path):
    def native(e: dict[str, Any]) -> Any:
        return {**e, "output_ids": ["x"]} if "output_ids" in e else e

    with FakeServer(reshape=native) as odd:
        line = error_line(eaglegate("sweep", "--url", odd.url, "--api", "generate", "-c", "1",
                                    "-o", str(tmp_path / "s.jsonl")))
    # The chunk follows, cut at 80 characters.
    assert line.startswith(f"error: bad stream chunk from {odd.url}/generate: a token id is 'x', not a count: "
                           """'{"output_ids": ["x"]"""), line


def test_a_level_without_tokens_is_refused_not_written(tmp_path):
    """Empty text and `completion_tokens: 0`: a throughput of 0 tok/s used to be written."""
    out = tmp_path / "sweep.jsonl"
    empty = _choice(text="")
    with FakeServer(reshape=lambda e: empty(e) if e.get("choices") else _usage(0)(e)) as odd:
        line = error_line(eaglegate("sweep", "--url", odd.url, "-c", "1", "--min-requests", "4",
                                    "-o", str(out)))
    assert line == (f"error: sweep stopped at concurrency 1: {odd.url}/v1/completions reported no "
                    "generated tokens in 4 requests; no level finished")
    assert not out.exists()


@pytest.mark.parametrize("stall", ["silent", "pings"])
@pytest.mark.parametrize("command", ["sweep", "verify-live"])
def test_timeout_bounds_the_whole_request(tmp_path, command, stall):
    """A server that answers with headers and then never finishes. One that sends an SSE
    comment every 0.2 s resets a per-read timeout for ever: only a whole-request deadline
    ends the command (else it runs into this file's time limit)."""
    with FakeServer(stall=stall) as stuck, FakeServer() as plain:
        args = (["sweep", "--url", stuck.url, "-c", "1", "-o", str(tmp_path / "s.jsonl")] if command == "sweep"
                else ["verify-live", "--url", stuck.url, "--baseline-url", plain.url, "--high", "2"])
        line = error_line(eaglegate(*args, "--timeout", "1"))
    assert line == (f"error: {stuck.url}/v1/completions did not answer within 1 s "
                    "(--timeout bounds each request)")


@pytest.mark.parametrize("command", ["sweep", "verify-live"])
def test_a_timeout_no_timer_can_wait_is_a_usage_error(tmp_path, command):
    with FakeServer() as server:
        args = (["sweep", "--url", server.url, "-c", "1", "-o", str(tmp_path / "s.jsonl")] if command == "sweep"
                else ["verify-live", "--url", server.url, "--baseline-url", server.url])
        line = error_line(eaglegate(*args, "--timeout", "inf"), 2)
    assert line == f"error: --timeout must be a number of seconds above 0 and at most {threading.TIMEOUT_MAX:.0f}, not inf"


@pytest.mark.parametrize(("args", "message"), [
    (["sweep", "-c", "0-8"], "bad concurrency list '0-8': levels must be integers from 1 to 8192, each range from "
                             "low to high"),  # it used to double 0 for ever
    (["sweep", "-c", "1-100000"], "bad concurrency list '1-100000': levels must be integers from 1 to 8192, each "
                                  "range from low to high"),
    (["verify-live", "--baseline-url", "localhost:2", "--high", "100000"],
     "--high must be an integer from 1 to 8192, not 100000"),
], ids=["zero-range", "sweep-too-high", "verify-too-high"])
def test_a_concurrency_out_of_range_is_refused_before_any_request(tmp_path, args, message):
    command, *rest = args
    line = error_line(eaglegate(command, "--url", "localhost:1", *rest, "-o" if command == "sweep" else "--model",
                                str(tmp_path / "s.jsonl") if command == "sweep" else "m"), 2)
    assert line == f"error: {message}"


# ---------------------------------------------------------------- calibrate: files that hold no measurement


GOOD = [{"max_concurrency": 1, "output_throughput": 100}, {"max_concurrency": 8, "output_throughput": 700}]


@pytest.mark.parametrize(("level", "message"), [
    ('{"max_concurrency": 4, "output_throughput": NaN}', "output_throughput is nan, not a finite number above 0"),
    ('{"max_concurrency": 4, "output_throughput": Infinity}', "output_throughput is inf, not a finite number above 0"),
    ('{"max_concurrency": 4, "output_throughput": -1585.2}', "output_throughput is -1585.2, not a finite number above 0"),
    ('{"max_concurrency": 4, "output_throughput": 0}', "output_throughput is 0, not a finite number above 0"),
    ('{"max_concurrency": 4, "output_throughput": true}', "output_throughput is True, not a finite number above 0"),
    ('{"max_concurrency": true, "output_throughput": 50}', "max_concurrency is True, not an integer from 1 on"),
    ('{"max_concurrency": 1.5, "output_throughput": 50}', "max_concurrency is 1.5, not an integer from 1 on"),
    ('{"max_concurrency": NaN, "output_throughput": 50}', "max_concurrency is nan, not an integer from 1 on"),
    ('{"max_concurrency": "4", "output_throughput": 50}', "max_concurrency is '4', not an integer from 1 on"),
    ('{"max_concurrency": ' + "[" * 5000 + "]" * 5000 + ', "output_throughput": 50}',
     "not a measurement: nested too deep to read"),
], ids=["nan", "infinity", "negative", "zero", "bool-throughput", "bool-concurrency", "fraction", "nan-concurrency",
        "string-concurrency", "nested"])
def test_calibrate_refuses_a_level_that_is_no_measurement(tmp_path, level, message):
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_text("".join(json.dumps(x) + "\n" for x in GOOD))
    bad.write_text(good.read_text() + level + "\n")
    proc = eaglegate("calibrate", str(good), str(bad), "--json")
    assert error_line(proc) == f"error: {bad}:3: {message}"
    assert proc.stdout == ""  # no status, no threshold


def test_calibrate_answers_nothing_for_an_all_nan_file(tmp_path):
    """It used to answer "spec-always-wins"."""
    nan = tmp_path / "nan.jsonl"
    nan.write_text("".join(f'{{"max_concurrency": {c}, "output_throughput": NaN}}\n' for c in (1, 8, 64)))
    proc = eaglegate("calibrate", str(nan), str(nan), "--json")
    assert error_line(proc) == f"error: {nan}:1: output_throughput is nan, not a finite number above 0"
    assert proc.stdout == ""


@pytest.mark.parametrize(("flags", "message", "code"), [
    (["--kv-kib-per-token", "nan"], "--kv-kib-per-token must be a finite number, not nan", 2),
    (["--peak-tflops", "inf", "--bandwidth-tbs", "inf"], "--peak-tflops must be a finite number, not inf", 2),
    (["--draft-params-b", "-1"], "--draft-params-b must be positive", 2),
    # Finite figures whose throughput is not: a model of 1e308 billion parameters.
    (["--params-b", "1e308"], "baseline (estimate): throughput 0.0 at concurrency 1 is not a finite number above 0", 1),
], ids=["nan", "infinity", "negative", "zero-throughput"])
def test_calibrate_estimate_takes_only_finite_figures(flags, message, code):
    model = ["--params-b", "8", "--draft-tokens", "4", "--accept-len", "2.5", "--gpu", "h200"]
    assert error_line(eaglegate("calibrate", "--estimate", *model, *flags), code) == f"error: {message}"


# ---------------------------------------------------------------- MCP as JSON-RPC 2.0 says


def _mcp(*messages: dict[str, Any] | str) -> list[dict[str, Any]]:
    """Every answer `eaglegate mcp` writes to the handshake and `messages` (raw lines where
    given as text) before it exits at the end of its input, the handshake's left out."""
    init = {"jsonrpc": "2.0", "id": "init", "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "test", "version": "1"}}}
    ready = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    lines = [m if isinstance(m, str) else json.dumps(m) for m in (init, ready, *messages)]
    proc = subprocess.run([sys.executable, "-m", "eaglegate", "mcp"], input="\n".join(lines) + "\n",
                          capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert answers[0]["id"] == "init" and "result" in answers[0]
    return answers[1:]


def test_mcp_answers_a_request_whose_id_is_invalid():
    bad_ids = [1.5, None, {"a": 1}, [1], True]
    answers = _mcp(*({"jsonrpc": "2.0", "id": ident, "method": "tools/list"} for ident in bad_ids),
                   {"jsonrpc": "2.0", "id": 7, "method": "tools/list"})
    refusals = [a for a in answers if a["id"] is None]
    assert [a["error"]["code"] for a in refusals] == [-32600] * len(bad_ids)
    assert [a["error"]["message"] for a in refusals] == [
        f"Invalid Request: an id is a string or an integer, not {json.dumps(i)}" for i in bad_ids]
    (listed,) = [a for a in answers if a["id"] == 7]  # still serving
    assert listed["result"]["tools"]


def _locate_with(version: str) -> str:
    """A tools/call line whose `version` argument is `version`, raw JSON."""
    call = {"jsonrpc": "2.0", "id": 0, "method": "tools/call", "params": {"name": "locate", "arguments": {}}}
    return json.dumps(call).replace('"arguments": {}', f'"arguments": {{"version": {version}}}')


def test_mcp_bounds_nesting_with_a_clear_error():
    """Within the bound the tool answers as ever; beyond it (200 to 400 levels got no answer,
    about 990 ended the server with a RecursionError) a -32600 with id null, and the server
    keeps serving."""
    within = tools.MAX_JSON_DEPTH - 3  # the call's own object, params and arguments
    answers = _mcp(_locate_with("[" * within + "]" * within).replace('"id": 0', '"id": 1'),
                   *(_locate_with("[" * d + "]" * d).replace('"id": 0', f'"id": {d}') for d in (200, 400, 990, 5000)),
                   {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
    by_id: dict[Any, list[dict[str, Any]]] = {}
    for answer in answers:
        by_id.setdefault(answer["id"], []).append(answer)
    (tool,) = by_id[1]
    assert tool["result"]["isError"] and tool["result"]["content"][0]["text"] == "version must be a string, not list"
    deep = by_id[None]
    assert [a["error"] for a in deep] == [{"code": -32600, "message": "Invalid Request: JSON nested deeper than "
                                           f"{tools.MAX_JSON_DEPTH} levels in the message"}] * 4
    assert by_id[2][0]["result"]["tools"]


def test_mcp_answers_the_requests_in_flight_before_it_exits_at_the_end_of_input():
    """Three tool calls and then the end of stdin at once: each is answered, with its result
    (they used to be dropped when the SDK cancelled its handlers)."""
    estimate = {"estimate": True, "params_b": 8, "draft_tokens": 4, "accept_len": 2.5, "gpu": "h200"}
    answers = _mcp(*({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                      "params": {"name": "calibrate_threshold", "arguments": estimate}} for i in (1, 2, 3)))
    assert sorted(a["id"] for a in answers) == [1, 2, 3]
    for answer in answers:
        assert not answer["result"]["isError"], answer
        assert answer["result"]["structuredContent"]["status"] == "crosses"


def test_tool_arguments_are_bounded_before_they_are_parsed():
    """`tools.load_arguments`, the parser for `eaglegate tool`'s JSON argument: any depth is
    measured, none recursed."""
    within = "[" * (tools.MAX_JSON_DEPTH - 1) + "]" * (tools.MAX_JSON_DEPTH - 1)  # in an object
    assert tools.load_arguments(f'{{"a": {within}, "b": "[[[\\"[["}}') == {
        "a": json.loads(within), "b": '[[["[['}
    for depth in (tools.MAX_JSON_DEPTH + 1, 990, 100_000):
        with pytest.raises(UserError, match=f"^JSON nested deeper than {tools.MAX_JSON_DEPTH} levels in the "
                                            "arguments$"):
            tools.load_arguments("[" * depth + "]" * depth)
    with pytest.raises(UserError, match="^arguments are not JSON: "):
        tools.load_arguments("{not json")


@pytest.mark.parametrize("depth", [990, 30_000])  # an argument's text stays under the kernel's 128 KiB
def test_eaglegate_tool_refuses_deeply_nested_arguments_in_one_line(depth):
    proc = eaglegate("tool", "locate", "[" * depth + "]" * depth)
    assert error_line(proc, 2) == f"error: JSON nested deeper than {tools.MAX_JSON_DEPTH} levels in the arguments"
    assert proc.stdout == ""


def test_a_read_that_waited_the_sockets_timeout_is_the_deadline_not_a_failure():
    """The socket's timeout is the whole request's, so a silent server's read can time out a
    moment before the deadline's timer fires: the same answer either way (under load, the
    old check said `request ... failed: TimeoutError`)."""
    from eaglegate.live.client import _Deadline

    deadline = _Deadline(5)
    assert deadline.ended(TimeoutError("timed out")) and not deadline.passed
    assert not deadline.ended(ConnectionResetError("reset by peer"))
    deadline.passed = True  # the timer shut the socket down: whatever the read raised
    assert deadline.ended(ConnectionResetError("reset by peer"))
