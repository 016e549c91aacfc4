"""The application layer: every operation the command line and the agent tools offer.

`eaglegate/cli*.py` and `eaglegate/agents/` only build requests (`requests.py`: each
argument checked once, where it is read, with one message for each bad value) and turn the
answers into output (text, JSON, pages); `eaglegate/reports/` only renders what it is
handed. The operations are grouped by area: `tree` (locating, the rules for writing),
`analysis` (map, couplings, plan), `patching`, `live`, `reports`, and `agents` (the one-call
answers the agent tools give). docs/architecture.md, "The application layer", says more.

Every command imports this package, so it loads only what every command uses: the
requests, the tree and the analyses. The patching, live and reports areas (their requests
live beside their operations) load when one of their names is first used, and the analysis
(networkx), the codemods (LibCST) and the transactions (GitPython) are imported by the
operations that use them: `locate`, `status` and a warm `map` or `couplings` do not pay for
loading what they never run.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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
from eaglegate.app.requests import (
    ARGUMENTS,
    MAX_TEXT,
    TEXT_LIMITS,
    CouplingsRequest,
    Launch,
    PlanRequest,
    TreeArgs,
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

# The areas a `map` or `couplings` never uses, and their names: each area loads when one of
# its names is first read (`app.sweep`, `from eaglegate.app import report`).
LAZY_AREAS = {
    "live": ("CalibrateRequest", "Calibrated", "DepthTabled", "Estimate", "SweepRequest", "Swept",
             "VerifyLiveRequest", "calibrate", "calibrate_depths", "sweep", "verify_live"),
    "patching": ("Applied", "Patch", "apply", "make_patch", "patch_files", "revert", "verify"),
    "reports": ("DiffRequest", "DiffSide", "Graph", "GraphRequest", "ReportRequest", "diff", "graph",
                "load_report", "plan_section", "report", "report_of"),
}
_AREA_OF = {name: area for area, names in LAZY_AREAS.items() for name in names}

if TYPE_CHECKING:  # what type checkers see of the lazy names
    from eaglegate.app.live import (
        Calibrated,
        CalibrateRequest,
        DepthTabled,
        Estimate,
        SweepRequest,
        Swept,
        VerifyLiveRequest,
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
    from eaglegate.app.reports import (
        DiffRequest,
        DiffSide,
        Graph,
        GraphRequest,
        ReportRequest,
        diff,
        graph,
        load_report,
        plan_section,
        report,
        report_of,
    )


def __getattr__(name: str) -> Any:
    """A lazy area's name: its module loads now, once (PEP 562)."""
    area = _AREA_OF.get(name)
    if area is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{area}"), name)


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

