"""The architecture report of a tree, the diff of two, and the call graph of any package.

The use cases gather what a report shows (the analysis, its couplings, the gate plan per
worker) and hand it to `eaglegate.reports`, which only renders it."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eaglegate.app.analysis import analyse
from eaglegate.app.requests import (
    MAX_TEXT,
    TreeArgs,
    check_choice,
    check_output,
    check_text,
    set_checked,
)
from eaglegate.app.tree import locate
from eaglegate.errors import UsageError, UserError

if TYPE_CHECKING:
    from eaglegate.analyzer import source
    from eaglegate.analyzer.analysis import Analysis
    from eaglegate.reports.diff import ReportDiff
    from eaglegate.reports.model import Plan, Report

    Progress = Callable[[int, int], None]


REPORT_FORMATS = ("term", "md", "html", "json", "dot", "mermaid")
DIFF_FORMATS = ("term", "md", "json")
GRAPH_FORMATS = ("json", "dot")


@dataclass(frozen=True)
class ReportRequest:
    """`report`: the format, the output file, and whether the couplings are analysed."""

    fmt: object = "term"
    output: str | None = None
    with_couplings: bool = True

    def __post_init__(self) -> None:
        set_checked(self, "fmt", check_choice("--format", self.fmt, REPORT_FORMATS))
        check_output(self.output)


@dataclass(frozen=True)
class DiffSide:
    """One side of a diff: a version, a directory or a saved report (`arg`), or a directory (`path`)."""

    arg: str | None = None
    path: str | None = None

    def __post_init__(self) -> None:
        set_checked(self, "arg", check_text("version", self.arg, MAX_TEXT))
        set_checked(self, "path", check_text("path", self.path, MAX_TEXT))


@dataclass(frozen=True)
class DiffRequest:
    a: DiffSide
    b: DiffSide
    fmt: object = "term"
    output: str | None = None

    def __post_init__(self) -> None:
        set_checked(self, "fmt", check_choice("--format", self.fmt, DIFF_FORMATS))
        check_output(self.output, {"saved report A": self.a.arg, "saved report B": self.b.arg})
        for name, side in (("A", self.a), ("B", self.b)):
            if not side.arg and not side.path:
                raise UsageError(f"give {name} as a version, a directory, a report .json or --path-{name.lower()}")


@dataclass(frozen=True)
class GraphRequest:
    """`graph`: any Python package or directory, the format, the output file."""

    root: str
    fmt: object = "json"
    output: str | None = None

    def __post_init__(self) -> None:
        set_checked(self, "fmt", check_choice("--format", self.fmt, GRAPH_FORMATS))
        check_output(self.output)
        root = check_text("path", self.root)
        if root is None or not Path(root).is_dir():
            raise UsageError(f"no such directory: {self.root}")
        set_checked(self, "root", root)



def plan_section(analysis: Analysis) -> Plan:
    """The report's plan section, from `eaglegate.patches.plan.worker_plans`: each worker's
    plan under the launch that selects it (the default EAGLE launch, or the one change that
    selects the worker), with no threshold: a report is asked for none, so the threshold's
    value is shown as THRESHOLD (`eaglegate plan --threshold N --flags …` gives the plan for
    one launch). A failing planner is said in the section, as a failing couplings analysis is."""
    from eaglegate.reports.model import Plan

    try:
        return _plan_section(analysis)
    except Exception as exc:  # noqa: BLE001 - reported in the section, like the couplings
        return Plan(False, f"gate plan failed: {type(exc).__name__}: {exc}")


def _plan_section(analysis: Analysis) -> Plan:
    from eaglegate.patches.plan import DEFAULT_THRESHOLD, build_plan, worker_plans
    from eaglegate.reports.model import Plan

    plans = worker_plans(analysis, DEFAULT_THRESHOLD)
    default = next((plan for plan, change in plans.values() if not change), None) \
        or build_plan(analysis, DEFAULT_THRESHOLD)
    detail = _without_threshold(default.to_json())
    lines, others = {}, {}
    for label, (plan, change) in plans.items():
        own = _without_threshold(plan.to_json())
        line = f"{own['family']} ({own['worker']}" + (f", with {change})" if change else ")")
        if own.get("launch_flags"):
            line += ": launch with " + " ".join(str(f) for f in own["launch_flags"])
        lines[label] = line
        if change:
            others[label] = {**own, "selected_by": change}
    summary = f"{detail.get('family')} ({detail.get('worker') or 'no worker'})"
    if detail.get("launch_flags"):
        summary += ": launch with " + " ".join(str(f) for f in detail["launch_flags"])
    summary += "".join(f"; for {label}: {lines[label]}" for label in others)
    return Plan(True, "", summary, {**detail, "other_workers": others, "worker_plans": lines})


def _without_threshold(detail: dict[str, Any]) -> dict[str, Any]:
    """The plan's JSON with the threshold it was built for shown as THRESHOLD."""
    from eaglegate.patches.codemods.server_args import FLAG as THRESHOLD_FLAG
    from eaglegate.reports.model import THRESHOLD

    given = str(detail.get("threshold"))
    flags = detail.get("launch_flags") or []
    detail["launch_flags"] = [THRESHOLD if i and flags[i - 1] == THRESHOLD_FLAG and f == given else f
                              for i, f in enumerate(flags)]
    if detail.get("patch"):
        detail["patch"]["apply"] = detail["patch"]["apply"].replace(f"--threshold {given}", f"--threshold {THRESHOLD}")
    detail["threshold"] = None
    return detail


def report_of(analysis: Analysis, with_couplings: bool = True) -> Report:
    """The report of one analysis: its map, its couplings (unless not asked for) and its plan."""
    from eaglegate.reports.model import build_report

    return build_report(analysis, with_couplings, plan_section(analysis))


def report(tree: source.SourceTree, progress: Progress | None = None, with_couplings: bool = True) -> Report:
    """`eaglegate report`: analyse a located tree and build its report."""
    return report_of(analyse(tree, progress), with_couplings)


def load_report(side: DiffSide, on_fetch: Callable[[str], None] | None = None,
                progress: Progress | None = None,
                on_tree: Callable[[source.SourceTree], None] | None = None) -> Report:
    """One side of a diff: a saved report (`.json`), or the report of a version or directory."""
    from eaglegate.reports.model import Report

    arg, path = side.arg, side.path
    if arg and arg.endswith(".json") and Path(arg).is_file():
        try:
            return Report.from_json(json.loads(Path(arg).read_text(encoding="utf-8")))
        except (ValueError, KeyError) as exc:
            raise UserError(f"{arg} is not a saved eaglegate report: {exc}") from exc
    if path is None and arg and Path(arg).is_dir():
        path = arg
    tree = locate(TreeArgs(version=None if path else arg, path=path), on_fetch=on_fetch)
    if on_tree is not None:
        on_tree(tree)
    return report(tree, progress)


def diff(request: DiffRequest, load: Callable[[DiffSide], Report] = load_report) -> ReportDiff:
    """`eaglegate diff`: what changed on the spec path between two trees or saved reports."""
    from eaglegate.reports.diff import diff_reports

    return diff_reports(load(request.a), load(request.b))


@dataclass
class Graph:
    """`eaglegate graph`'s answer: the text to write, its size, and the files that did not parse."""

    text: str
    nodes: int
    edges: int
    failures: list[Any]


def graph(request: GraphRequest, progress: Progress | None = None) -> Graph:
    """The call graph of any Python package or directory, as JSON or DOT."""
    from eaglegate.analyzer.callgraph import CallGraph, export, load_codebase, to_dot

    codebase, parsed, _ = load_codebase(Path(request.root), progress)
    built = CallGraph(codebase).build_all()
    if request.fmt == "json":
        data = export(built)
        data["parse_failures"] = [f.__dict__ for f in parsed.failures]
        text = json.dumps(data, separators=(",", ":")) + "\n"  # compact: 4x faster than indented
    else:
        text = to_dot(built)
    return Graph(text, built.number_of_nodes(), built.number_of_edges(), list(parsed.failures))
