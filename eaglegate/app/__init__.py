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

from eaglegate.app.analysis import (
    Couplings,
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
from eaglegate.app.live import (
    Calibrated,
    DepthTabled,
    Swept,
    calibrate,
    calibrate_depths,
    sweep,
    verify_live,
)
from eaglegate.app.patching import (
    Applied,
    Patch,
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
from eaglegate.app.tree import (
    check_inside,
    locate,
    speculative_workers,
    status,
    writable_parent,
    write_file,
)

__all__ = [
    "ARGUMENTS", "MAX_TEXT", "TEXT_LIMITS", "Applied", "CalibrateRequest", "Calibrated", "DepthTabled",
    "Couplings", "CouplingsRequest", "DiffRequest", "DiffSide", "Estimate", "Graph", "GraphRequest", "Launch",
    "Patch", "PlanRequest", "ReportRequest", "SweepRequest", "Swept", "TreeArgs", "VerifyLiveRequest",
    "analyse", "answer_couplings",
    "answer_couplings_json", "apply", "calibrate", "calibrate_depths", "check_arguments", "check_categories",
    "check_couplings_request", "check_inside", "check_launch", "check_launch_settings", "check_output",
    "check_text", "check_threshold", "cli_value", "couplings", "couplings_answer", "couplings_for_launch",
    "couplings_json", "couplings_of", "diff", "graph", "load_report", "locate", "make_patch", "map_answer",
    "patch_files", "plan", "plan_of", "plan_section", "report", "report_of", "revert", "speculative_workers",
    "status", "sweep", "verify", "verify_live", "writable_parent", "write_file",
]

