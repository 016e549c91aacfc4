"""One bad argument, one message, one exit code, whichever door it comes through.

Every argument of every command and every agent tool is in `BAD`: a bad value of it, as the
command line spells it and as JSON sends it, and the one line the application layer refuses
it with. The command line and `eaglegate tool` print that line and exit 2; over MCP it is the
text of an `isError` answer. Each is refused before any tree is located or analysed.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from eaglegate import cli
from eaglegate.patches.model import MAX_THRESHOLD

from txhelpers import VERSION

THRESHOLD = f"threshold must be an integer batch size from 1 to {MAX_THRESHOLD}"
TREE_COMMANDS = ["locate", "map", "plan", "couplings", "verify", "status", "report",
                 ["patch", "--threshold", "8"], ["apply", "--threshold", "8"], "revert"]
TREE_TOOLS = {"locate": {}, "map_paths": {}, "find_couplings": {}, "explain_symbol": {"symbol": "Scheduler"},
              "plan_gate": {}, "generate_patch": {"threshold": 8}, "apply_patch": {"threshold": 8, "confirm": True},
              "revert_patch": {"confirm": True}, "report": {}}
# How each tree argument is named badly, on the command line and in JSON, and the refusal.
TREE_ARGS = [
    ("--version", "version", "9" * 65, "version is not a plausible value (over 64 characters or a NUL byte)"),
    ("--path", "path", "p" * 401, "path is not a plausible value (over 400 characters or a NUL byte)"),
    ("--git", "git", "g" * 401, "git is not a plausible value (over 400 characters or a NUL byte)"),
    ("--rev", "rev", "-x", "rev must be a tag or commit, not '-x'"),
    ("--python", "python", "p" * 401, "python is not a plausible value (over 400 characters or a NUL byte)"),
]


def _words(command: str | list[str]) -> list[str]:
    return [command] if isinstance(command, str) else list(command)


def _case(cli_args: list[str] | None, tool: str | None, tool_args: dict[str, Any] | None, message: str,
          id: str) -> Any:
    return pytest.param(cli_args, tool, tool_args, message, id=id)


V = ["--version", VERSION]
NOWHERE = "/nonexistent-eaglegate-folder/out"
BAD = [
    # the tree, for every command and tool that reads one
    *[_case([*_words(command), f"{flag}={value}"], None, None, message, id=f"{_words(command)[0]}-{name}")
      for command in TREE_COMMANDS for flag, name, value, message in TREE_ARGS],
    *[_case(None, tool, {**base, name: value}, message, id=f"{tool}-{name}")
      for tool, base in TREE_TOOLS.items() for _, name, value, message in TREE_ARGS],
    # plan / plan_gate
    _case(["plan", *V, "--threshold", "abc"], "plan_gate", {"version": VERSION, "threshold": "abc"},
          f"{THRESHOLD}, not 'abc'", "plan-threshold-text"),
    _case(["plan", *V, "--threshold", "0"], "plan_gate", {"version": VERSION, "threshold": 0},
          f"{THRESHOLD}, not 0", "plan-threshold-zero"),
    _case(["plan", *V, "--threshold", "1.5"], "plan_gate", {"version": VERSION, "threshold": 1.5},
          f"{THRESHOLD}, not 1.5", "plan-threshold-fraction"),
    _case(["plan", *V, "--flags", "-x " * 700], "plan_gate", {"version": VERSION, "flags": "-x " * 700},
          "flags is not a plausible value (over 2000 characters or a NUL byte)", "plan-flags"),
    _case(["plan", *V, "--env", "E=" + "x" * 200], "plan_gate", {"version": VERSION, "env": ["E=" + "x" * 200]},
          "env is not a plausible value (over 200 characters or a NUL byte)", "plan-env"),
    _case(None, "plan_gate", {"version": VERSION, "env": "E=1"},
          "env must be a list of NAME=VALUE strings, not str", "plan_gate-env-type"),
    _case(["plan", *V, "--config-out", NOWHERE], None, None,
          "no such folder: /nonexistent-eaglegate-folder (create it first)", "plan-config-out"),
    _case(["plan", *V, "--depth-table", '{"batch": [8, 8], "depth": [[1], [2], [0]]}'], "plan_gate",
          {"version": VERSION, "depth_table": '{"batch": [8, 8], "depth": [[1], [2], [0]]}'},
          "depth_table is not a depth table: batch: bounds not strictly increasing", "plan-depth-table"),
    _case(["plan", *V, "--depth-table", "/nonexistent-eaglegate-folder/t.json"], "plan_gate",
          {"version": VERSION, "depth_table": "/nonexistent-eaglegate-folder/t.json"},
          "depth_table is not a depth table: cannot read '/nonexistent-eaglegate-folder/t.json': "
          "No such file or directory", "plan-depth-table-missing"),
    _case(None, "plan_gate", {"version": VERSION, "depth_table": 3},
          "depth_table must be a string, not int", "plan_gate-depth-table-type"),
    # couplings / find_couplings
    _case(["couplings", *V, "--category", "bogus"], "find_couplings", {"version": VERSION, "category": "bogus"},
          "category must be one of buffer, cuda_graph, draft_state, mode_check, config_cap, not 'bogus'",
          "couplings-category"),
    _case(["couplings", *V, "--flags", "-x " * 700], "find_couplings", {"version": VERSION, "flags": "-x " * 700},
          "flags is not a plausible value (over 2000 characters or a NUL byte)", "couplings-flags"),
    _case(["couplings", *V, "--env", "E=" + "x" * 200], "find_couplings",
          {"version": VERSION, "env": ["E=" + "x" * 200]},
          "env is not a plausible value (over 200 characters or a NUL byte)", "couplings-env"),
    _case(["couplings", *V, "--all", "--flags", "--tp 2"], "find_couplings",
          {"version": VERSION, "all_findings": True, "flags": "--tp 2"},
          "--all (all_findings=) lists every finding of every launch: give either it or --flags/--env "
          "(flags=, env=)", "couplings-all-and-flags"),
    _case(None, "find_couplings", {"version": VERSION, "all_findings": "yes"},
          "all_findings must be true or false, not 'yes'", "find_couplings-all"),
    _case(None, "find_couplings", {"version": VERSION, "worker": "v3"}, "worker must be v1 or v2, not 'v3'",
          "find_couplings-worker"),
    # patch, apply, revert and their tools
    _case(["patch", *V, "--threshold", "abc"], "generate_patch", {"version": VERSION, "threshold": "abc"},
          f"{THRESHOLD}, not 'abc'", "patch-threshold"),
    _case(["patch", *V, "--threshold", "8", "-o", NOWHERE], None, None,
          "no such folder: /nonexistent-eaglegate-folder (create it first)", "patch-output"),
    _case(["apply", *V, "--threshold", str(MAX_THRESHOLD + 1)], "apply_patch",
          {"version": VERSION, "threshold": MAX_THRESHOLD + 1, "confirm": True},
          f"{THRESHOLD}, not {MAX_THRESHOLD + 1}", "apply-threshold"),
    _case(None, "apply_patch", {"version": VERSION, "threshold": 8, "confirm": "yes"},
          "confirm must be true or false, not 'yes'", "apply_patch-confirm"),
    _case(None, "revert_patch", {"version": VERSION, "confirm": True, "force": 1},
          "force must be true or false, not 1", "revert_patch-force"),
    # the agents' paging and detail
    *[_case(None, tool, {"version": VERSION, **base, "detail": 3},
            "detail must be 0 (compact), 1 (more) or 2 (full), not 3", f"{tool}-detail")
      for tool, base in (("map_paths", {}), ("find_couplings", {}), ("explain_symbol", {"symbol": "Scheduler"}),
                         ("generate_patch", {"threshold": 8}), ("report", {}))],
    *[_case(None, tool, {"version": VERSION, **base, name: 0}, f"{name} must be between 1 and {top}, not 0",
            f"{tool}-{name}")
      for tool, base, name, top in (("map_paths", {}, "page", 100_000), ("map_paths", {}, "page_size", 100),
                                    ("map_paths", {}, "below_page", 100_000),
                                    ("find_couplings", {}, "page", 100_000),
                                    ("explain_symbol", {"symbol": "Scheduler"}, "page_size", 100),
                                    ("generate_patch", {"threshold": 8}, "page", 100_000))],
    _case(None, "map_paths", {"version": VERSION, "worker": "x" * 41},
          "worker is not a plausible value (over 40 characters or a NUL byte)", "map_paths-worker"),
    _case(None, "explain_symbol", {"version": VERSION, "symbol": "a b"},
          "symbol must be a dotted Python name, not 'a b'", "explain_symbol-symbol"),
    _case(None, "explain_symbol", {"version": VERSION},
          "give exactly one of symbol (e.g. EAGLEWorker.forward_batch_generation) or location "
          "(e.g. srt/managers/scheduler.py:2368)", "explain_symbol-neither"),
    _case(None, "explain_symbol", {"version": VERSION, "location": "l" * 401},
          "location is not a plausible value (over 400 characters or a NUL byte)", "explain_symbol-location"),
    # report, diff, graph
    _case(["report", *V, "--format", "bogus"], None, None,
          "--format must be one of term, md, html, json, dot, mermaid, not 'bogus'", "report-format"),
    _case(["report", *V, "-o", NOWHERE], None, None,
          "no such folder: /nonexistent-eaglegate-folder (create it first)", "report-output"),
    _case(["diff", VERSION, VERSION, "--format", "html"], None, None,
          "--format must be one of term, md, json, not 'html'", "diff-format"),
    _case(["diff", VERSION], None, None,
          "give B as a version, a directory, a report .json or --path-b", "diff-b"),
    *[_case(["diff", VERSION, flag, "d" * 401], None, None,
            "path is not a plausible value (over 400 characters or a NUL byte)", f"diff{flag}")
      for flag in ("--path-a", "--path-b")],
    _case(["diff", VERSION, VERSION, "-o", NOWHERE], None, None,
          "no such folder: /nonexistent-eaglegate-folder (create it first)", "diff-output"),
    _case(["graph", ".", "--format", "svg"], None, None, "--format must be one of json, dot, not 'svg'",
          "graph-format"),
    _case(["graph", "/nonexistent-eaglegate-folder"], None, None,
          "no such directory: /nonexistent-eaglegate-folder", "graph-root"),
    _case(["graph", ".", "-o", NOWHERE], None, None,
          "no such folder: /nonexistent-eaglegate-folder (create it first)", "graph-output"),
    # sweep
    *[_case(["sweep", "--url", "localhost:1", flag, value], None, None, message, f"sweep{flag}-{value}")
      for flag, value, message in (
          ("--max-tokens", "0", "--max-tokens must be an integer from 1 on, not 0"),
          ("--max-tokens", "abc", "--max-tokens must be an integer from 1 on, not 'abc'"),
          ("--rounds", "1.5", "--rounds must be an integer from 1 on, not 1.5"),
          ("--min-requests", "0", "--min-requests must be an integer from 1 on, not 0"),
          ("--timeout", "0", "--timeout must be a number above 0, not 0"),
          ("--timeout", "abc", "--timeout must be a number above 0, not 'abc'"),
          ("-c", "0", "bad concurrency list '0': levels must be integers from 1 to 8192, each range from low "
                      "to high"),
          ("--api", "grpc", "--api must be auto, completions, chat or generate, not 'grpc'"),
          ("-o", NOWHERE, "no such folder: /nonexistent-eaglegate-folder (create it first)"),
          ("--prompts", "p" * 401, "--prompts is not a plausible value (over 400 characters or a NUL byte)"),
          ("--model", "m" * 401, "--model is not a plausible value (over 400 characters or a NUL byte)"),
          ("--tag", "t" * 401, "--tag is not a plausible value (over 400 characters or a NUL byte)"))],
    _case(["sweep", "--url", " "], None, None, "--url must name the server (host:port or a URL)", "sweep-url"),
    _case(["sweep", "--url", "ftp://x"], None, None, "not an http(s) URL: 'ftp://x'", "sweep-url-scheme"),
    _case(["sweep", "--url", "http://[::1"], None, None, "not a URL: 'http://[::1' (Invalid IPv6 URL)",
          "sweep-url-malformed"),
    # verify-live
    *[_case(["verify-live", "--url", "localhost:1", "--baseline-url", "localhost:2", flag, value], None, None,
            message, f"verify-live{flag}-{value}")
      for flag, value, message in (
          ("--low", "0", "--low must be an integer from 1 on, not 0"),
          ("--high", "abc", "--high must be an integer from 1 on, not 'abc'"),
          ("--tolerance", "1.5", "--tolerance must be in [0, 1), got 1.5"),
          ("--max-tokens", "0", "--max-tokens must be an integer from 1 on, not 0"),
          ("--rounds", "0", "--rounds must be an integer from 1 on, not 0"),
          ("--timeout", "-1", "--timeout must be a number above 0, not -1"),
          ("--api", "grpc", "--api must be auto, completions, chat or generate, not 'grpc'"),
          ("--baseline-url", " ", "--url must name the server (host:port or a URL)"),
          ("--baseline-url", "http://h:99999", "bad port in URL 'http://h:99999': Port out of range 0-65535"))],
    # calibrate / calibrate_threshold
    _case(["calibrate", "a.jsonl", "b.jsonl", "--margin", "abc"], "calibrate_threshold",
          {"baseline": "a.jsonl", "spec": "b.jsonl", "margin": "abc"}, "--margin must be in [0, 1), got 'abc'",
          "calibrate-margin-text"),
    _case(["calibrate", "a.jsonl", "b.jsonl", "--margin", "1.5"], "calibrate_threshold",
          {"baseline": "a.jsonl", "spec": "b.jsonl", "margin": 1.5}, "--margin must be in [0, 1), got 1.5",
          "calibrate-margin"),
    _case(["calibrate", "a.jsonl"], "calibrate_threshold", {"baseline": "a.jsonl"},
          "give two sweep files (baseline, spec), or --estimate with model parameters", "calibrate-one-file"),
    _case(["calibrate", "a.jsonl", "b.jsonl", "--png", NOWHERE + ".png"], None, None,
          "no such folder: /nonexistent-eaglegate-folder (create it first)", "calibrate-png"),
    _case(None, "calibrate_threshold", {"estimate": "yes"}, "estimate must be true or false, not 'yes'",
          "calibrate_threshold-estimate"),
    # calibrate --depth: the depth gate's table
    *[_case(["calibrate", *args], None, None, message, f"calibrate-depth-{key}")
      for key, args, message in (
          ("shape", ["a.jsonl", "--depth", "x"], "--depth must be DEPTH=FILE with DEPTH from 1 to 16, not 'x'"),
          ("range", ["a.jsonl", "--depth", "17=b.jsonl"],
           "--depth must be DEPTH=FILE with DEPTH from 1 to 16, not '17=b.jsonl'"),
          ("twice", ["a.jsonl", "--depth", "1=b.jsonl", "--depth", "1=c.jsonl"], "--depth 1 is given twice"),
          ("spec", ["a.jsonl", "b.jsonl", "--depth", "1=c.jsonl"],
           "--depth takes the baseline sweep and one sweep per depth: no spec sweep, --estimate or --png"),
          ("alone", ["--table-out", "t.json"],
           "a depth table needs the baseline sweep and --depth DEPTH=FILE for each depth"),
          ("out", ["a.jsonl", "--depth", "1=b.jsonl", "--table-out", NOWHERE],
           "no such folder: /nonexistent-eaglegate-folder (create it first)"))],
    _case(None, "calibrate_threshold", {"baseline": "a.jsonl", "depths": ["1=b.jsonl", "1=c.jsonl"]},
          "--depth 1 is given twice", "calibrate_threshold-depths"),
    *[_case(["calibrate", "--estimate", *cli_args], "calibrate_threshold", {"estimate": True, **json_args},
            message, f"calibrate-estimate-{key}")
      for key, cli_args, json_args, message in (
          ("missing", ["--gpu", "h200"], {"gpu": "h200"}, "--estimate needs --params-b, --draft-tokens, --accept-len"),
          ("params-b", ["--params-b", "abc"], {"params_b": "abc"}, "--params-b must be a number, not 'abc'"),
          ("draft-tokens-text", ["--draft-tokens", "2.5"], {"draft_tokens": 2.5},
           "--draft-tokens must be an integer, not 2.5"),
          ("draft-tokens", ["--params-b", "8", "--draft-tokens", "0", "--accept-len", "2", "--gpu", "h200"],
           {"params_b": 8, "draft_tokens": 0, "accept_len": 2, "gpu": "h200"}, "--draft-tokens must be at least 2"),
          ("accept-len", ["--params-b", "8", "--draft-tokens", "4", "--accept-len", "9", "--gpu", "h200"],
           {"params_b": 8, "draft_tokens": 4, "accept_len": 9, "gpu": "h200"},
           "--accept-len must be between 1 and --draft-tokens (it counts the bonus token)"),
          ("gpu", ["--params-b", "8", "--draft-tokens", "4", "--accept-len", "2", "--gpu", "tpu"],
           {"params_b": 8, "draft_tokens": 4, "accept_len": 2, "gpu": "tpu"}, None),
          ("peak-tflops", ["--peak-tflops", "abc"], {"peak_tflops": "abc"}, "--peak-tflops must be a number, not 'abc'"),
          ("bandwidth-tbs", ["--bandwidth-tbs", "abc"], {"bandwidth_tbs": "abc"},
           "--bandwidth-tbs must be a number, not 'abc'"),
          ("context-len", ["--context-len", "1.5"], {"context_len": 1.5}, "--context-len must be an integer, not 1.5"),
      )],
    *[_case(["calibrate", "--estimate", flag, value], None, None, message, f"calibrate{flag}")
      for flag, value, message in (
          ("--draft-params-b", "abc", "--draft-params-b must be a number, not 'abc'"),
          ("--num-steps", "1.5", "--num-steps must be an integer, not 1.5"),
          ("--kv-kib-per-token", "abc", "--kv-kib-per-token must be a number, not 'abc'"),
          ("--flops-efficiency", "abc", "--flops-efficiency must be a number, not 'abc'"),
          ("--bandwidth-efficiency", "abc", "--bandwidth-efficiency must be a number, not 'abc'"),
          ("--overhead-ms", "abc", "--overhead-ms must be a number, not 'abc'"),
          ("--max-concurrency", "abc", "--max-concurrency must be an integer, not 'abc'"))],
    # the agents' own doors
    _case(["mcp", "--log-level", "LOUD"], None, None,
          "--log-level must be one of DEBUG, INFO, WARNING, ERROR, not 'LOUD'", "mcp-log-level"),
    _case(None, "locate", {"version": VERSION, "bogus": 1},
          "locate takes no argument bogus; it takes git, path, python, rev, version", "tool-unknown-argument"),
]


def _gpu_message() -> str:
    from eaglegate.live.calibrate import GPUS

    return (f"unknown GPU 'tpu': one of {', '.join(sorted(GPUS))}, or pass --peak-tflops and "
            "--bandwidth-tbs")


def _expected(message: str | None) -> str:
    return message if message is not None else _gpu_message()


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str],
            monkeypatch: pytest.MonkeyPatch) -> tuple[object, str]:
    """`eaglegate ARGV` in this process: its exit status and its stderr."""
    monkeypatch.setattr(sys, "argv", ["eaglegate", *argv])
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        cli.main()
    return done.value.code, capsys.readouterr().err


@pytest.mark.parametrize("cli_args, tool, tool_args, message", BAD)
def test_the_command_line_refuses_in_the_one_line_with_exit_2(cli_args, tool, tool_args, message, capsys,
                                                               monkeypatch):
    if cli_args is None:
        pytest.skip("an argument only the agent tools take")
    code, stderr = run_cli(cli_args, capsys, monkeypatch)
    assert (code, stderr.strip()) == (2, f"error: {_expected(message)}")


@pytest.mark.parametrize("cli_args, tool, tool_args, message", BAD)
def test_eaglegate_tool_refuses_in_the_same_line_with_exit_2(cli_args, tool, tool_args, message, capsys,
                                                              monkeypatch):
    if tool is None:
        pytest.skip("an argument no agent tool takes")
    code, stderr = run_cli(["tool", tool, json.dumps(tool_args)], capsys, monkeypatch)
    assert (code, stderr.strip()) == (2, f"error: {_expected(message)}")


@pytest.fixture(scope="module")
def mcp_refusals() -> dict[str, tuple[bool, str]]:
    """Every tool case of `BAD` asked of one MCP server: (isError, its text) by case."""
    pytest.importorskip("mcp")
    from test_agents_mcp import with_server

    answers: dict[str, tuple[bool, str]] = {}

    async def scenario(session: Any) -> None:
        for case in BAD:
            _, tool, tool_args, _ = case.values
            if tool is not None:
                result = await session.call_tool(tool, tool_args, read_timeout_seconds=300)
                answers[case.id] = (bool(result.is_error), result.content[0].text if result.content else "")

    with_server(scenario)
    return answers


@pytest.mark.parametrize("case_id, message", [pytest.param(c.id, c.values[3], id=c.id)
                                               for c in BAD if c.values[1] is not None])
def test_mcp_refuses_in_the_same_line_as_an_error_answer(case_id, message, mcp_refusals):
    assert mcp_refusals[case_id] == (True, _expected(message))


def test_every_argument_of_every_command_is_in_the_table():
    """Each option and argument of each command, and each argument of each agent tool, has a
    bad value in `BAD` (switches, which take no value, and `--json` aside)."""
    import inspect

    import typer.main

    from eaglegate.agents import tools

    group = typer.main.get_command(cli.app)
    asked = {word for case in BAD if case.values[0] for word in case.values[0]}
    asked |= {word.split("=")[0] for word in asked}
    missing = []
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        for param in command.params:
            option = param.param_type_name == "option"
            if option and (param.is_flag or param.count):
                continue  # a switch takes no value to get wrong
            names = param.opts if option else [name]
            if name != "tool" and not any(n in asked for n in names):
                missing.append(f"{name} {param.opts}")
    said = {key for case in BAD if case.values[2] for key in case.values[2]}
    for tool, fn in tools.TOOLS.items():
        for arg in set(inspect.signature(fn).parameters) - {"args", "session"}:
            if arg not in said:
                missing.append(f"{tool}.{arg}")
    assert not missing, missing
