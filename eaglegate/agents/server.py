"""`eaglegate mcp`: the agent tools over the Model Context Protocol (stdio).

Built on the official SDK's `MCPServer`. Each tool is a thin wrapper over
`eaglegate.agents.tools`: typed inputs (their JSON Schema bounds `detail`, pages and
types), the TypedDicts of `schemas.py` as structured output, and every refusal turned
into an MCP tool error (`is_error`) with one line for the model; the server keeps
serving after it. Nothing but protocol reaches stdout: the SDK points fd 1 at stderr
while it serves, and our logging goes to stderr. The SDK reads the lines `_Wire` hands it:
those it would drop unanswered are answered there as JSON-RPC 2.0 says, JSON is bounded
before it is parsed, and the end of input waits for the requests in flight.
"""

import io
import json
import logging
import os
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import anyio
import mcp_types
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError, ToolError
from mcp.shared.message import SessionMessage
from mcp.types import ToolAnnotations
from pydantic import Field, ValidationError

from eaglegate import __version__
from eaglegate.agents import tools
from eaglegate.agents.schemas import (
    CalibrateOut,
    ChangeOut,
    CouplingsOut,
    LocateOut,
    MapOut,
    PatchOut,
    PlanOut,
    ReportOut,
    SymbolOut,
)
from eaglegate.analyzer.parse import collecting_frozen
from eaglegate.app import requests
from eaglegate.errors import UserError
from eaglegate.patches.model import MAX_THRESHOLD, THRESHOLD_HELP

log = logging.getLogger("eaglegate.agents")
PLAYBOOK = Path(__file__).with_name("PLAYBOOK.md")
R = TypeVar("R")

# Inputs every tool shares: how the SGLang tree is named (at most one of the four).
Version = Annotated[str | None, Field(
    max_length=requests.TEXT_LIMITS["version"], description="A released SGLang version, fetched once into eaglegate's cache (e.g. 0.5.9).")]
TreePath = Annotated[str | None, Field(
    max_length=tools.MAX_TEXT_ARG, description="A directory holding an SGLang source tree (site-packages, a checkout).")]
Git = Annotated[str | None, Field(
    max_length=tools.MAX_TEXT_ARG, description="An SGLang git checkout.")]
Rev = Annotated[str | None, Field(
    max_length=requests.TEXT_LIMITS["rev"], description="With git: a tag or commit to read.")]
Python = Annotated[str | None, Field(
    max_length=tools.MAX_TEXT_ARG, description="Another Python interpreter (a serving venv) whose installed SGLang to read.")]
Detail = Annotated[int, Field(
    ge=0, le=tools.MAX_DETAIL, strict=True,
    description="0: compact (summary and key file:line facts), 1: conditions and evidence, 2: full records.")]
PageNo = Annotated[int, Field(ge=1, le=tools.MAX_PAGE, strict=True, description="1-based page; answers give next_page.")]
Threshold = Annotated[int, Field(
    ge=1, le=MAX_THRESHOLD, strict=True, description=THRESHOLD_HELP)]
Confirm = Annotated[bool, Field(strict=True, description="Must be true: this call writes SGLang's files.")]

READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
WRITES = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False)


PageSize = Annotated[int, Field(ge=1, le=tools.MAX_PAGE_SIZE, strict=True,
                                description=f"Items per page (at most {tools.MAX_PAGE_SIZE}).")]


def _call(fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
    """Run one tool function; a refusal or failure becomes a tool error the model can read."""
    try:
        with collecting_frozen():  # the server outlives each analysis it drops
            return fn(*args, **kwargs)
    except UserError as exc:
        raise ToolError(str(exc)) from exc
    except (OSError, ValueError, RecursionError) as exc:
        log.exception("tool %s failed", fn.__name__)
        raise ToolError(f"{fn.__name__} failed: {type(exc).__name__}: {exc}") from exc


class _Server(MCPServer):
    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        # Checked as `eaglegate tool` checks them, before the schema's own checks: the SDK
        # would drop an argument the tool does not declare, and word a bad value its own way.
        if name in tools.TOOLS:
            try:
                tools.check_arguments(name, arguments)
            except UserError as exc:
                raise ToolError(str(exc)) from None
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            refusal = exc.__cause__
            if isinstance(refusal, ToolError) and isinstance(refusal.__cause__, UserError):
                # A refusal (`_call`): the application layer's line, without the SDK's
                # "Error executing tool" before it, as the CLI and `eaglegate tool` print it.
                raise ToolError(str(refusal)) from refusal.__cause__
            if not isinstance(refusal, ValidationError):
                raise
            # pydantic's report spans lines; the model gets one per refused argument.
            first = refusal.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise ToolError(f"{name}: {where}: {first['msg']}, not {first.get('input')!r}") from exc


def build_server(session: tools.Session | None = None) -> MCPServer:
    """The eaglegate MCP server with its tools, report resources and playbook prompt."""
    session = session or tools.SESSION
    server: MCPServer = _Server(
        name="eaglegate",
        version=__version__,
        instructions=(
            "eaglegate reads SGLang's source (never imports it) to map how the Scheduler drives the "
            "EAGLE speculative workers (v1 EAGLEWorker, v2 EAGLEWorkerV2), find what blocks switching "
            "speculation off under load, and install a batch-size gate. Start with plan_gate: one call "
            "answers where the gate goes and what blocks it, with file:line. Name the tree with one of "
            "version, path, git or python; with none, the installed SGLang (or release 0.5.9) is used. "
            "The prompt `investigate_eagle_gate` is the full playbook."
        ),
        log_level="WARNING",
    )

    def tree(version: str | None, path: str | None, git: str | None, rev: str | None,
             python: str | None) -> tools.TreeArgs:
        return tools.TreeArgs(version=version, path=path, git=git, rev=rev, python=python)

    @server.tool(annotations=READ_ONLY)
    def locate(version: Version = None, path: TreePath = None, git: Git = None, rev: Rev = None,
               python: Python = None) -> LocateOut:
        """Find the SGLang source: its version, root, speculative worker classes and gate-patch state."""
        return _call(tools.locate, tree(version, path, git, rev, python), session=session)

    @server.tool(annotations=READ_ONLY)
    def map_paths(version: Version = None, path: TreePath = None, git: Git = None, rev: Rev = None,
                  python: Python = None, detail: Detail = 0, page: PageNo = 1,
                  page_size: PageSize = 10,
                  worker: Annotated[str | None, Field(max_length=requests.TEXT_LIMITS["worker"], description="v1 or v2 (or a class name) to see one worker.")] = None,
                  below_page: PageNo = 1,
                  ) -> MapOut:
        """How the Scheduler's event loops reach each EAGLE worker (v1 EAGLEWorker, v2 EAGLEWorkerV2):
        every hop with file:line and the condition it sits under, where the worker class is chosen, and its
        draft/verify/draft-extend steps. Paths of all event loops are paged (page). `below` lists what each
        step does one level deeper (model calls with forward mode and graph replay or eager, KV-slot
        allocation and free, decode preparation, result processing, the calls beside the worker's entry),
        paged by below_page."""
        return _call(tools.map_paths, tree(version, path, git, rev, python), detail=detail, page=page,
                     page_size=page_size, worker=worker, below_page=below_page, session=session)

    @server.tool(annotations=READ_ONLY)
    def find_couplings(version: Version = None, path: TreePath = None, git: Git = None, rev: Rev = None,
                       python: Python = None, detail: Detail = 0, page: PageNo = 1,
                       page_size: PageSize = 15,
                       category: Annotated[str | None, Field(max_length=requests.TEXT_LIMITS["category"], description="buffer, cuda_graph, draft_state, mode_check or config_cap.")] = None,
                       worker: Annotated[str | None, Field(max_length=requests.TEXT_LIMITS["worker"], description="v1 or v2: findings affecting that worker path.")] = None,
                       flags: Annotated[str, Field(max_length=requests.MAX_FLAGS_TEXT, description="The server's launch flags, as for plan_gate, e.g. '--speculative-algorithm EAGLE3 --attention-backend triton'.")] = "",
                       env: Annotated[list[Annotated[str, Field(max_length=requests.MAX_ENV_TEXT)]] | None, Field(max_length=requests.MAX_ENV_ENTRIES, description="Environment settings NAME=VALUE.")] = None,
                       all_findings: Annotated[bool, Field(strict=True, description="Every finding of every launch, one per site, instead of the launch's mechanisms.")] = False,
                       ) -> CouplingsOut:
        """What ties SGLang's runtime to speculation being on (buffers, CUDA graphs, draft state, mode
        checks, config caps), each with file:line and why it blocks switching; and the verdict per worker
        path (can a plain decode step run, by which route). Scoped to the launch (flags/env; the version's
        default launch without them): one row per mechanism with its sites, blocking ones and those the
        verdicts rest on first; paged."""
        return _call(tools.find_couplings, tree(version, path, git, rev, python), detail=detail, page=page,
                     page_size=page_size, category=category, worker=worker, flags=flags, env=env,
                     all_findings=all_findings, session=session)

    @server.tool(annotations=READ_ONLY)
    def explain_symbol(version: Version = None, path: TreePath = None, git: Git = None, rev: Rev = None,
                       python: Python = None,
                       symbol: Annotated[str | None, Field(max_length=requests.TEXT_LIMITS["symbol"], description="A function or class: qualified, Class.method, or a unique name.")] = None,
                       location: Annotated[str | None, Field(max_length=tools.MAX_TEXT_ARG, description="file:line inside the tree, as the other tools print it (srt/managers/scheduler.py:2368).")] = None,
                       detail: Detail = 0, page: PageNo = 1, page_size: PageSize = 12,
                       ) -> SymbolOut:
        """A function or class of the located SGLang: its definition, callers and callees (each call site
        with file:line), its role on the speculative path, and a source excerpt. Give symbol or location."""
        return _call(tools.explain_symbol, tree(version, path, git, rev, python), symbol=symbol,
                     location=location, detail=detail, page=page, page_size=page_size, session=session)

    @server.tool(annotations=READ_ONLY)
    def plan_gate(version: Version = None, path: TreePath = None, git: Git = None, rev: Rev = None,
                  python: Python = None,
                  threshold: Annotated[int | None, Field(ge=1, le=MAX_THRESHOLD, strict=True, description="The batch size to gate at (default 32).")] = None,
                  flags: Annotated[str, Field(max_length=requests.MAX_FLAGS_TEXT, description="The server's launch flags, e.g. '--speculative-algorithm EAGLE3 --disable-overlap-schedule'.")] = "",
                  env: Annotated[list[Annotated[str, Field(max_length=requests.MAX_ENV_TEXT)]] | None, Field(max_length=requests.MAX_ENV_ENTRIES, description="Environment settings NAME=VALUE, e.g. SGLANG_ENABLE_SPEC_V2=1.")] = None,
                  depth_table: Annotated[str | None, Field(max_length=requests.MAX_FLAGS_TEXT, description="A depth table for the overlap worker's depth gate, inline JSON or a file path: checked with the gate's parser, and its launch flags planned.")] = None,
                  ) -> PlanOut:
        """One call for "where is the batch-size gate inserted and what blocks it": both worker paths with
        file:line, the couplings verdict per path, the plan for these flags (which worker runs, the route,
        cap changes, launch flags) and the gate's insertion point."""
        return _call(tools.plan_gate, tree(version, path, git, rev, python), threshold=threshold,
                     flags=flags, env=env, depth_table=depth_table, session=session)

    @server.tool(annotations=READ_ONLY)
    def generate_patch(threshold: Threshold, version: Version = None, path: TreePath = None, git: Git = None,
                       rev: Rev = None, python: Python = None, detail: Detail = 0, page: PageNo = 1,
                       page_size: PageSize = 4) -> PatchOut:
        """The gate patch for this tree (writes nothing): files, the insertion point, the launch flags, and
        with detail>=1 the unified diff paged by hunk."""
        return _call(tools.generate_patch, tree(version, path, git, rev, python), threshold, detail=detail,
                     page=page, page_size=page_size, session=session)

    @server.tool(annotations=WRITES)
    def apply_patch(threshold: Threshold, confirm: Confirm = False, version: Version = None,
                    path: TreePath = None, git: Git = None, rev: Rev = None, python: Python = None) -> ChangeOut:
        """Install the gate patch into the located SGLang tree, atomically with a manifest for revert.
        Refused unless confirm is true; never writes eaglegate's cached releases (copy one, pass path)."""
        return _call(tools.apply_patch, tree(version, path, git, rev, python), threshold, confirm=confirm,
                     session=session)

    @server.tool(annotations=WRITES)
    def revert_patch(confirm: Confirm = False,
                     force: Annotated[bool, Field(strict=True, description="Restore the originals even over edits made since the patch.")] = False,
                     version: Version = None, path: TreePath = None, git: Git = None, rev: Rev = None,
                     python: Python = None) -> ChangeOut:
        """Restore every byte the gate patch changed and remove the files it added. Refused unless confirm is true."""
        return _call(tools.revert_patch, tree(version, path, git, rev, python), confirm=confirm, force=force,
                     session=session)

    @server.tool(annotations=READ_ONLY)
    def report(version: Version = None, path: TreePath = None, git: Git = None, rev: Rev = None,
               python: Python = None, detail: Detail = 0) -> ReportOut:
        """Build the architecture report (paths, couplings, plan) and keep it as the resources
        eaglegate://report/latest.md and eaglegate://report/latest.json; detail>=1 returns the Markdown too."""
        return _call(tools.report, tree(version, path, git, rev, python), detail=detail, session=session)

    @server.tool(annotations=READ_ONLY)
    def calibrate_threshold(
        baseline: Annotated[str | None, Field(max_length=requests.TEXT_LIMITS["baseline"], description="Sweep file of the server without speculation (eaglegate sweep's JSONL, or bench_serving's).")] = None,
        spec: Annotated[str | None, Field(max_length=requests.TEXT_LIMITS["spec"], description="Sweep file of the same server with speculation.")] = None,
        margin: Annotated[float, Field(description="Gain below which speculation is not worth resuming (sets the hysteresis).")] = 0.05,
        estimate: Annotated[bool, Field(strict=True, description="No sweeps: a roofline estimate from params_b, draft_tokens, accept_len and gpu (or peak_tflops and bandwidth_tbs).")] = False,
        params_b: Annotated[float | None, Field(description="Estimate: target parameters, billions.")] = None,
        draft_tokens: Annotated[int | None, Field(strict=True, description="Estimate: --speculative-num-draft-tokens.")] = None,
        accept_len: Annotated[float | None, Field(description="Estimate: mean accepted tokens per step, bonus included.")] = None,
        gpu: Annotated[str | None, Field(max_length=requests.TEXT_LIMITS["gpu"], description="Estimate: the GPU by name, e.g. h200.")] = None,
        peak_tflops: Annotated[float | None, Field(description="Estimate: dense BF16 TFLOP/s (overrides gpu).")] = None,
        bandwidth_tbs: Annotated[float | None, Field(description="Estimate: memory bandwidth, TB/s (overrides gpu).")] = None,
        context_len: Annotated[int | None, Field(strict=True, description="Estimate: mean tokens in context per request (default 1024).")] = None,
        depths: Annotated[list[Annotated[str, Field(max_length=requests.MAX_TEXT + 8)]] | None, Field(description="Depth gate: DEPTH=FILE, a sweep of the server at static depth DEPTH (--speculative-num-steps), one per depth; with baseline, answers the depth table (depth_table) per batch and context band, for plan_gate.")] = None,
    ) -> CalibrateOut:
        """Where speculation stops paying and the gate's threshold and hysteresis, from two sweeps of
        the server (without and with speculation, e.g. from `eaglegate sweep`) or a roofline estimate;
        or, with depths, the depth gate's table (depth per batch and context band, each choice's lead).
        Reads no SGLang tree: pass the threshold to plan_gate and generate_patch, the table to plan_gate's depth_table."""
        return _call(tools.calibrate_threshold, baseline=baseline, spec=spec, margin=margin, estimate=estimate,
                     params_b=params_b, draft_tokens=draft_tokens, accept_len=accept_len, gpu=gpu,
                     peak_tflops=peak_tflops, bandwidth_tbs=bandwidth_tbs, context_len=context_len,
                     depths=depths, session=session)

    def latest(kind: str) -> str:
        if session.latest_report is None:
            raise ResourceNotFoundError("no report yet: call the report tool first")
        return session.latest_report[kind]

    @server.resource(tools.REPORT_URIS[0], name="latest-report-markdown", mime_type="text/markdown",
                     description="The latest report built by the report tool, as Markdown.")
    def latest_markdown() -> str:
        return latest("markdown")

    @server.resource(tools.REPORT_URIS[1], name="latest-report-json", mime_type="application/json",
                     description="The latest report built by the report tool, as JSON.")
    def latest_json() -> str:
        return latest("json")

    @server.prompt(name="investigate_eagle_gate", title="Map SGLang's EAGLE-3 path and place a batch-size gate",
                   description="The playbook: map how SGLang's scheduler drives EAGLE-3 and where to add a "
                               "batch-size gate, with the tools to call and how to read their answers.")
    def investigate_eagle_gate(
        version: Annotated[str, Field(description="An SGLang release (e.g. 0.5.9); empty: the installed one.")] = "",
        path: Annotated[str, Field(description="Or a directory holding the SGLang tree.")] = "",
    ) -> str:
        target = (f'version: "{version}"' if version else f'path: "{path}"' if path
                  else "no tree argument (the installed SGLang)")
        return PLAYBOOK.read_text(encoding="utf-8").replace("{{TREE}}", target)

    return server


# JSON-RPC 2.0's error codes for what never reaches a handler.
PARSE_ERROR, INVALID_REQUEST, INVALID_PARAMS = -32700, -32600, -32602


def read_line(line: str) -> tuple[Any, dict[str, Any] | None]:
    """A wire line's JSON value, and the JSON-RPC error answer to it when the SDK cannot
    take it as a message (None: the SDK takes it).

    The SDK drops such a line without a word (one whose id is no string or integer it takes
    for a notification), and a client waiting on its id hangs: every request gets an answer,
    with id null when its id cannot be read or is invalid, as JSON-RPC 2.0 says. A
    notification (no id) gets none."""
    try:
        tools.check_nesting(line, "the message")
    except UserError as exc:  # before parsing, which recurses (tools.MAX_JSON_DEPTH)
        return None, _error(None, INVALID_REQUEST, f"Invalid Request: {exc}")
    try:
        message = json.loads(line)
    except ValueError as exc:
        return None, _error(None, PARSE_ERROR, f"Parse error: {exc}")
    if not isinstance(message, dict):
        return message, _error(None, INVALID_REQUEST, "Invalid Request: a message must be a JSON object")
    ident = message.get("id")
    valid_id = isinstance(ident, (str, int)) and not isinstance(ident, bool)
    if "id" in message and not valid_id:
        return message, _error(None, INVALID_REQUEST,
                               f"Invalid Request: an id is a string or an integer, not {json.dumps(ident)[:40]}")
    try:
        mcp_types.jsonrpc_message_adapter.validate_python(message, by_name=False)
        return message, None
    except ValidationError:
        pass
    if not valid_id:
        if isinstance(message.get("method"), str):
            return message, None  # a notification: JSON-RPC answers none
        return message, _error(None, INVALID_REQUEST, "Invalid Request: no valid id")
    if isinstance(message.get("method"), str) and "params" in message \
            and not isinstance(message["params"], dict):
        return message, _error(ident, INVALID_PARAMS, "Invalid params: MCP takes params as an object")
    return message, _error(ident, INVALID_REQUEST, "Invalid Request: not a JSON-RPC 2.0 request")


def _error(ident: str | int | None, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": ident, "error": {"code": code, "message": message}}


class _Wire:
    """Between stdin and the SDK. The lines the SDK can take go on; the others are answered
    here, through the SDK's own writer, so answers never interleave mid-line. The end of
    input is passed on only once every request read has its answer: the SDK cancels the
    handlers still running when its input ends, and their requests would go unanswered."""

    def __init__(self, lines: Any) -> None:
        self.lines = lines
        self.write_stream: Any = None
        self.ready = anyio.Event()
        self.unanswered: Counter[str | int] = Counter()
        self.answered = anyio.Event()

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[str]:
        async for line in self.lines:
            if not line.strip():
                continue
            message, answer = read_line(line)
            if answer is not None:
                await self.ready.wait()
                await self.write_stream.send(SessionMessage(mcp_types.jsonrpc_message_adapter.validate_python(answer)))
                continue
            if "method" in message and "id" in message:
                self.unanswered[message["id"]] += 1
            elif message.get("method") == "notifications/cancelled":
                params = message.get("params")
                cancelled = params.get("requestId") if isinstance(params, dict) else None
                if isinstance(cancelled, (str, int)):  # a cancelled request is answered no more
                    self.unanswered.pop(cancelled, None)
            yield line
        while self.unanswered:
            self.answered = anyio.Event()
            await self.answered.wait()

    def settle(self, ident: str | int) -> None:
        """The request `ident` has its answer."""
        self.unanswered[ident] -= 1
        if self.unanswered[ident] <= 0:
            del self.unanswered[ident]
        self.answered.set()

    def counting(self, stream: Any) -> "_CountedAnswers":
        """`stream`, the SDK's writer, counting the answers the server sends through it."""
        return _CountedAnswers(self, stream)


class _CountedAnswers:
    def __init__(self, wire: _Wire, stream: Any) -> None:
        self.wire = wire
        self.stream = stream

    async def send(self, item: SessionMessage) -> None:
        await self.stream.send(item)
        message = item.message
        if isinstance(message, (mcp_types.JSONRPCResponse, mcp_types.JSONRPCError)) and message.id is not None:
            self.wire.settle(message.id)

    async def aclose(self) -> None:
        await self.stream.aclose()

    async def __aenter__(self) -> "_CountedAnswers":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def _serve_stdio(server: MCPServer) -> None:
    from mcp.server.stdio import stdio_server

    # The wire stays on a private descriptor; fd 0 reads the null device, so no handler
    # or child (pip, git, another interpreter) can take a line meant for the server.
    wire = os.dup(0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    try:
        text = io.TextIOWrapper(os.fdopen(wire, "rb", closefd=False), encoding="utf-8", errors="replace")
        lines = _Wire(anyio.wrap_file(text))
        async with stdio_server(stdin=lines) as (read_stream, write_stream):  # type: ignore[arg-type]
            lines.write_stream = write_stream
            lines.ready.set()
            lowlevel = server._lowlevel_server
            await lowlevel.run(read_stream, lines.counting(write_stream), lowlevel.create_initialization_options())
    finally:
        os.dup2(wire, 0)
        os.close(wire)


def serve(log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "WARNING") -> None:
    """Serve over stdio until the client closes the pipe."""
    logging.getLogger().setLevel(log_level)
    anyio.run(_serve_stdio, build_server())
