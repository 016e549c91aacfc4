"""The application layer: every operation the command line and the agent tools offer.

`eaglegate/cli*.py` and `eaglegate/agents/` only build requests (`requests.py`: each
argument checked once, where it is read, with one message for each bad value) and turn the
answers into output (text, JSON, pages); `eaglegate/reports/` only renders what it is
handed. The operations are grouped by area: `tree` (locating, the rules for writing),
`analysis` (map, couplings, plan), `patching`, `live`, `reports`, and `agents` (the one-call
answers the agent tools give). docs/architecture.md, "The application layer", says more.

Every command imports this package: the analysis (networkx), the codemods (LibCST) and the
transactions (GitPython) are imported by the operations that use them, so `locate`,
`status` and a warm `map` do not pay for loading what they never run.
"""

import sys
import types

from eaglegate.app import agents, analysis, live, patching, reports, requests, tree
from eaglegate.app.analysis import (
    _SGLANG_SLOT,
    Couplings,
    _answer_code,
    _filled,
    _json_template,
    _unpickled,
    analyse,
    answer_couplings,
    answer_couplings_json,
    check_couplings_request,
    check_launch_settings,
    couplings,
    couplings_answer,
    couplings_for_launch,
    couplings_json,
    couplings_of,
    map_answer,
    plan,
    plan_of,
)
from eaglegate.app.live import Calibrated, Swept, calibrate, sweep, verify_live
from eaglegate.app.patching import (
    Applied,
    Patch,
    _launch_worker,
    apply,
    make_patch,
    patch_files,
    revert,
    verify,
)
from eaglegate.app.reports import Graph, diff, graph, load_report, plan_section, report, report_of
from eaglegate.app.requests import (
    ARGUMENTS,
    MAX_TEXT,
    TEXT_LIMITS,
    CalibrateRequest,
    CouplingsRequest,
    DiffRequest,
    DiffSide,
    Estimate,
    GraphRequest,
    Launch,
    PlanRequest,
    ReportRequest,
    SweepRequest,
    TreeArgs,
    VerifyLiveRequest,
    check_arguments,
    check_categories,
    check_launch,
    check_output,
    check_text,
    check_threshold,
    cli_value,
)
from eaglegate.app.tree import check_inside, locate, speculative_workers, status, writable_parent

__all__ = [
    "ARGUMENTS", "MAX_TEXT", "TEXT_LIMITS", "_SGLANG_SLOT", "Applied", "CalibrateRequest", "Calibrated",
    "Couplings", "CouplingsRequest", "DiffRequest", "DiffSide", "Estimate", "Graph", "GraphRequest", "Launch",
    "Patch", "PlanRequest", "ReportRequest", "SweepRequest", "Swept", "TreeArgs", "VerifyLiveRequest",
    "_answer_code", "_filled", "_json_template", "_launch_worker", "_unpickled", "analyse", "answer_couplings",
    "answer_couplings_json", "apply", "calibrate", "check_arguments", "check_categories",
    "check_couplings_request", "check_inside", "check_launch", "check_launch_settings", "check_output",
    "check_text", "check_threshold", "cli_value", "couplings", "couplings_answer", "couplings_for_launch",
    "couplings_json", "couplings_of", "diff", "graph", "load_report", "locate", "make_patch", "map_answer",
    "patch_files", "plan", "plan_of", "plan_section", "report", "report_of", "revert", "speculative_workers",
    "status", "sweep", "verify", "verify_live", "writable_parent",
]


class _Package(types.ModuleType):
    """Setting a name on `eaglegate.app` sets it in each of its modules that binds it too, so
    a stand-in (a test's or a benchmark's `monkeypatch.setattr(app, "analyse", ...)`) reaches
    the operations that call it, as it did when the layer was one module."""

    def __setattr__(self, name: str, value: object) -> None:
        for module in (agents, analysis, live, patching, reports, requests, tree):
            if name in vars(module):
                setattr(module, name, value)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
