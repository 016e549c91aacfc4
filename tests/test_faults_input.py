"""The input fault catalogue, cases 2 to 5, replayed on real SGLang 0.5.9: a needed file that does not parse,
input that used to end in a traceback, MCP requests that got no answer, and launches SGLang
would refuse. Each ends in one line on stderr and exit 1 (or a JSON-RPC error, or an MCP
tool error), never a traceback nor a wrong answer; a tree it must not touch keeps its hash.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from eaglegate.patches.model import MAX_THRESHOLD

from test_faults_cli import break_class, eaglegate, error_line
from txhelpers import VERSION, copy_full, tree_hash


@pytest.fixture
def site(release_tree, tmp_path) -> Path:
    return copy_full(release_tree(VERSION).root, tmp_path / "site")


# ---------------------------------------------------------------- 2: every needed file checked


@pytest.mark.parametrize("rel, cls", [("sglang/srt/managers/schedule_batch.py", "ScheduleBatch"),
                                      ("sglang/srt/speculative/eagle_info.py", "EagleVerifyInput")])
def test_a_file_the_map_imports_from_that_does_not_parse_stops_every_answer(site, rel, cls):
    file = site / rel
    lineno = break_class(file, cls)
    before = tree_hash(site)
    expected = re.compile(rf"error: {re.escape(str(file))}:{lineno}: .+; srt/[\w/]+\.py imports from it on "
                          "the map's paths, so the map, the couplings verdict and the patch rest on it: "
                          "fix or restore that file")
    for args in (["map"], ["couplings"], ["plan"], ["apply", "--threshold", "32"]):
        line = error_line(eaglegate(*args, "--path", str(site)))
        assert expected.fullmatch(line), (args, line)
    assert tree_hash(site) == before  # apply wrote nothing


def test_a_pep_263_latin_1_module_is_read_as_python_reads_it(site, release_tree):
    rel = "sglang/srt/speculative/eagle_info.py"
    original = (site / rel).read_bytes()
    (site / rel).write_bytes(b"# -*- coding: latin-1 -*-\n# caf\xe9\n" + original)
    proc = eaglegate("map", "--path", str(site), "--json")
    assert proc.returncode == 0, proc.stderr
    mapped = json.loads(proc.stdout)
    reference = json.loads(eaglegate("map", "--version", VERSION, "--json").stdout)
    assert mapped["parse_failures"] == []
    def shape(data: dict) -> list[tuple[int, ...]]:
        return [tuple(len(w[k] or []) for k in ("paths", "steps", "decode_preparation", "result_processing"))
                for w in data["workers"]]

    assert shape(mapped) == shape(reference)
    assert "eagle_info.py" in proc.stdout  # its sites are on the map, read from the latin-1 text


def test_verify_with_a_worker_that_is_not_utf8_is_one_line(site):
    assert eaglegate("apply", "--path", str(site), "--threshold", "32").returncode == 0
    worker = site / "sglang/srt/speculative/eagle_worker.py"
    worker.write_bytes(worker.read_bytes().replace(b"# eaglegate: batch-size gate", b"# eaglegate: \xe9", 1))
    line = error_line(eaglegate("verify", "--path", str(site)))
    assert line.startswith(f"error: {worker}:0: not utf-8: invalid continuation byte"), line


# ---------------------------------------------------------------- 3: no traceback on any input


@pytest.fixture
def odd_files(tmp_path) -> dict[str, Path]:
    binary = tmp_path / "binary.dat"
    binary.write_bytes(bytes(range(256)) * 4)
    utf16 = tmp_path / "results-utf16.jsonl"
    utf16.write_text('{"max_concurrency": 1, "output_throughput": 10}\n', encoding="utf-16")
    return {"binary": binary, "utf16": utf16}


def test_calibrate_with_a_binary_or_utf16_results_file_is_one_line(odd_files):
    for kind in ("binary", "utf16"):
        path = odd_files[kind]
        line = error_line(eaglegate("calibrate", str(path), str(path)))
        assert line.startswith(f"error: results file {path} is not UTF-8 text ("), line


def test_prompts_from_a_binary_file_are_one_line(odd_files):
    path = odd_files["binary"]
    for args in (["sweep", "--url", "localhost:1", "-c", "1"],
                 ["verify-live", "--url", "localhost:1", "--baseline-url", "localhost:2"]):
        line = error_line(eaglegate(*args, "--prompts", str(path)))
        assert line.startswith(f"error: prompts file {path} is not UTF-8 text ("), (args, line)


UNBALANCED = "--speculative-algorithm 'EAGLE3"


@pytest.mark.parametrize("command", ["plan", "couplings"])
def test_flags_with_an_unbalanced_quote_are_one_line(command):
    line = error_line(eaglegate(command, "--version", VERSION, "--flags", UNBALANCED))
    assert line == f"error: --flags is not a valid command line (No closing quotation): {UNBALANCED}"


def test_tool_plan_gate_refuses_an_unbalanced_quote():
    proc = eaglegate("tool", "plan_gate", json.dumps({"version": VERSION, "flags": UNBALANCED}))
    assert error_line(proc) == f"error: --flags is not a valid command line (No closing quotation): {UNBALANCED}"
    assert proc.stdout == ""


# ---------------------------------------------------------------- 5: plan validates as SGLang would


def test_plan_refuses_what_sglang_would_refuse(tmp_path):
    line = error_line(eaglegate("plan", "--version", VERSION, "--flags", "--speculative-algorithm FOO"))
    # The choices are 0.5.9's own declaration, read from its server_args.py.
    assert line == ("error: --speculative-algorithm 'FOO' is not one of this SGLang's choices: "
                    "EAGLE, EAGLE3, NEXTN, STANDALONE, NGRAM")
    line = error_line(eaglegate("plan", "--version", VERSION, "--env", "=1"))
    assert line == "error: --env '=1': '' is not a valid environment variable name"
    config = tmp_path / "adaptive.json"
    line = error_line(eaglegate("plan", "--version", VERSION, "--config-out", str(config)))
    assert line.startswith(f"error: --config-out: the plan for SGLang {VERSION} under these flags is "
                           "v1-code-patch, which has no adaptive config"), line
    assert not config.exists()
    # A literal the version declares is still accepted, and so is a name plugins may extend.
    proc = eaglegate("plan", "--version", VERSION, "--json",
                     "--flags", "--speculative-algorithm EAGLE --attention-backend triton")
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------- 4: MCP always answers


def _mcp_exchange(lines: list[str]) -> list[dict]:
    """Send raw lines to `eaglegate mcp` after the handshake; one answer per line with an id."""
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "test", "version": "1"}}}
    ready = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    proc = subprocess.Popen([sys.executable, "-m", "eaglegate", "mcp"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(json.dumps(init) + "\n" + json.dumps(ready) + "\n")
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline())["id"] == 0
        answers = []
        for line in lines:  # one at a time: a missing answer would block here, not pass
            proc.stdin.write(line + "\n")
            proc.stdin.flush()
            answers.append(json.loads(proc.stdout.readline()))
    finally:
        proc.stdin.close()
        proc.wait(60)
    assert "Traceback" not in (proc.stderr.read() if proc.stderr else "")
    return answers


def test_mcp_answers_every_request():
    call = {"jsonrpc": "2.0", "method": "tools/call"}
    answers = _mcp_exchange([
        json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": []}),
        "{not json",
        json.dumps({"jsonrpc": "2.0", "id": 8}),
        json.dumps([1, 2]),
        json.dumps({**call, "id": 9, "params": {"name": "locate", "arguments": {"version": VERSION, "bogus": 1}}}),
        json.dumps({**call, "id": 10, "params": {"name": "generate_patch",
                                                 "arguments": {"version": VERSION, "threshold": MAX_THRESHOLD + 1}}}),
        json.dumps({**call, "id": 11, "params": {"name": "plan_gate",
                                                 "arguments": {"version": VERSION, "flags": UNBALANCED}}}),
        json.dumps({"jsonrpc": "2.0", "id": 12, "method": "tools/list"}),
    ])
    assert [(a.get("id"), a.get("error", {}).get("code")) for a in answers[:4]] == [
        (7, -32602), (None, -32700), (8, -32600), (None, -32600)]
    refusals = [a["result"] for a in answers[4:7]]
    assert all(r["isError"] and "\n" not in r["content"][0]["text"] for r in refusals), refusals
    # The same words as `eaglegate tool`, which refuses the same arguments.
    tool = error_line(eaglegate("tool", "locate", json.dumps({"version": VERSION, "bogus": 1})), 2)
    assert tool == f"error: {refusals[0]['content'][0]['text']}"
    tool = error_line(eaglegate("tool", "generate_patch",
                                json.dumps({"version": VERSION, "threshold": MAX_THRESHOLD + 1})), 2)
    assert tool.endswith(refusals[1]["content"][0]["text"])
    assert tool == f"error: threshold must be an integer batch size from 1 to {MAX_THRESHOLD}, not {MAX_THRESHOLD + 1}"
    assert "No closing quotation" in refusals[2]["content"][0]["text"]
    assert answers[7]["result"]["tools"]  # still serving


def test_one_threshold_bound_for_the_whole_product():
    line = error_line(eaglegate("plan", "--version", VERSION, "--threshold", str(MAX_THRESHOLD + 1)), 2)
    assert str(MAX_THRESHOLD) in line
    # The largest allowed value is accepted everywhere.
    proc = eaglegate("tool", "plan_gate", json.dumps({"version": VERSION, "threshold": MAX_THRESHOLD}))
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------- one message from every entry point


# The same bad argument to a command, to `eaglegate tool` and to MCP: (command line, tool,
# its arguments, the application layer's one line, the command line's exit code).
BAD_ARGUMENTS = [
    pytest.param(["plan", "--version", VERSION, "--threshold", "0"], "plan_gate", {"version": VERSION, "threshold": 0},
                 f"threshold must be an integer batch size from 1 to {MAX_THRESHOLD}, not 0", 2, id="threshold"),
    pytest.param(["plan", "--version", "9" * 65], "plan_gate", {"version": "9" * 65},
                 "version is not a plausible value (over 64 characters or a NUL byte)", 2, id="version"),
    pytest.param(["plan", "--git", "/nonexistent", "--rev=-x"], "plan_gate", {"git": "/nonexistent", "rev": "-x"},
                 "rev must be a tag or commit, not '-x'", 2, id="rev"),
    pytest.param(["plan", "--version", VERSION, "--flags", "-x " * 700], "plan_gate",
                 {"version": VERSION, "flags": "-x " * 700},
                 "flags is not a plausible value (over 2000 characters or a NUL byte)", 2, id="flags-length"),
    pytest.param(["plan", "--version", VERSION, "--flags", "--bogus-flag 1"], "plan_gate",
                 {"version": VERSION, "flags": "--bogus-flag 1"},
                 "this SGLang does not declare --bogus-flag", 1, id="flags-undeclared"),
    pytest.param(["couplings", "--version", VERSION, "--category", "bogus"], "find_couplings",
                 {"version": VERSION, "category": "bogus"},
                 "category must be one of buffer, cuda_graph, draft_state, mode_check, config_cap, not 'bogus'", 2,
                 id="category"),
]


def _mcp_refusal(tool: str, arguments: dict) -> str:
    from test_agents_mcp import refused, with_server

    said: list[str] = []

    async def scenario(session) -> None:
        said.append(await refused(session, tool, arguments))

    with_server(scenario)
    return said[0]


@pytest.mark.parametrize("entry", ["cli", "tool", "mcp"])
@pytest.mark.parametrize("cli_args, tool, tool_args, message, code", BAD_ARGUMENTS)
def test_a_bad_argument_gets_one_message_from_every_entry_point(entry, cli_args, tool, tool_args, message, code):
    if entry == "cli":
        assert error_line(eaglegate(*cli_args), code) == f"error: {message}"
    elif entry == "tool":  # a bad argument exits 2 from `eaglegate tool` too; a refused launch 1
        assert error_line(eaglegate("tool", tool, json.dumps(tool_args)), code) == f"error: {message}"
    else:
        pytest.importorskip("mcp")
        assert _mcp_refusal(tool, tool_args) == message


# The live commands (no agent tool measures servers): each input checked once, by the
# application layer, whose words the command line prints.
LIVE_ARGUMENTS = [
    pytest.param(["sweep", "--url", "localhost:1", "--rounds", "0"], "sweep", {"url": "localhost:1", "rounds": 0},
                 id="sweep-rounds"),
    pytest.param(["sweep", "--url", "localhost:1", "--api", "grpc"], "sweep", {"url": "localhost:1", "api": "grpc"},
                 id="sweep-api"),
    pytest.param(["sweep", "--url", "localhost:1", "-c", "0,1"], "sweep", {"url": "localhost:1", "concurrency": "0,1"},
                 id="sweep-levels"),
    pytest.param(["verify-live", "--url", "localhost:1", "--baseline-url", "localhost:2", "--tolerance", "1.5"],
                 "verify_live", {"url": "localhost:1", "baseline_url": "localhost:2", "tolerance": 1.5},
                 id="verify-live-tolerance"),
    pytest.param(["verify-live", "--url", "localhost:1", "--baseline-url", "localhost:2", "--timeout", "0"],
                 "verify_live", {"url": "localhost:1", "baseline_url": "localhost:2", "timeout": 0},
                 id="verify-live-timeout"),
    pytest.param(["calibrate", "a.jsonl"], "calibrate", {"baseline": "a.jsonl"}, id="calibrate-one-file"),
]


@pytest.mark.parametrize("cli_args, operation, app_args", LIVE_ARGUMENTS)
def test_live_inputs_are_checked_once_in_the_application_layer(cli_args, operation, app_args):
    from eaglegate import app
    from eaglegate.errors import UsageError

    request = {"sweep": app.SweepRequest, "verify_live": app.VerifyLiveRequest,
               "calibrate": app.CalibrateRequest}[operation]
    with pytest.raises(UsageError) as refused:
        request(**app_args)  # refused as the request is built, before any request is sent
    assert error_line(eaglegate(*cli_args), 2) == f"error: {refused.value}"
