"""The report as JSON: schema `eaglegate.report/1` (docs/schema-report.json).

Stable ordering: keys in a fixed order, lists sorted by the model, no timings, so two runs
over the same tree give the same bytes and diff cleanly.
"""

from __future__ import annotations

import json

from eaglegate.reports.model import Report


def render_json(report: Report) -> str:
    return json.dumps(report.to_json(), indent=2, ensure_ascii=False) + "\n"
