"""What the coupling detectors report: findings with evidence chains, and the report.

A `Finding` is one place where the runtime is tied to speculation being on. Its
evidence is a chain of `Step`s: the speculative parameter it starts from, each copy
(local, attribute, parameter binding) it travelled through, and the expression where
it arrived. Every line number comes from the parsed source.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

COUPLINGS_SCHEMA_VERSION = 1

CATEGORIES = ("buffer", "cuda_graph", "draft_state", "mode_check", "config_cap")

# Severities, strongest first. The first three are the issue's; the last two say that a
# coupling does not stand in the way (`compatible`: spec-sized, a plain step still fits;
# `enables-runtime-switch`: the code itself can run without drafting).
SEVERITIES = (
    "blocks-runtime-switch",
    "degrades-acceptance",
    "needs-config-change",
    "compatible",
    "enables-runtime-switch",
)


@dataclass(frozen=True)
class Step:
    """One hop of an evidence chain: an expression and where it is."""

    text: str
    path: str
    line: int

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    def render(self) -> str:
        return f"{self.text} ({self.where})"


Chain = tuple[Step, ...]


@dataclass
class Finding:
    category: str  # one of CATEGORIES
    kind: str  # the detector's finer label (capture_mode, alloc, early_return, ...)
    symbol: str  # qualified name of the function, or Class.field
    path: str  # file relative to the sglang package root
    line: int
    evidence: Chain
    reason: str
    worker_path: str  # v1 | v2 | both
    severity: str  # one of SEVERITIES
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def source(self) -> str:
        """The speculative parameter the evidence starts from."""
        return self.evidence[0].text if self.evidence else ""

    @property
    def key(self) -> tuple[str, str, str, int, str]:
        return (self.category, self.kind, self.path, self.line, self.symbol)

    def to_json(self) -> dict[str, Any]:
        return {
            "category": self.category,
            "kind": self.kind,
            "symbol": self.symbol,
            "site": self.where,
            "path": self.path,
            "line": self.line,
            "worker_path": self.worker_path,
            "severity": self.severity,
            "reason": self.reason,
            "evidence": [s.render() for s in self.evidence],
            "detail": self.detail,
        }


@dataclass
class Verdict:
    """Can a plain (non-speculative) decode step run in this worker at runtime?"""

    worker: str  # the worker's label, v1 | v2
    cls: str | None
    status: str  # feasible | feasible-natively | blocked | absent
    route: str  # how (plain decode through DECODE-mode graphs, adaptive steps=0, none)
    cost: str
    reasons: list[str]
    findings: list[Finding]

    def to_json(self) -> dict[str, Any]:
        return {
            "worker_path": self.worker,
            "class": self.cls,
            "status": self.status,
            "route": self.route,
            "cost": self.cost,
            "reasons": self.reasons,
            "findings": [{"category": f.category, "kind": f.kind, "site": f.where, "symbol": f.symbol}
                         for f in self.findings],
        }


@dataclass
class CouplingReport:
    version: str
    root: str
    findings: list[Finding]
    verdicts: list[Verdict]
    scope: dict[str, Any]  # what the analysis read: modules parsed, functions analysed
    timing: dict[str, float]
    # The version's settings, read once with the report (cached with it): scoping to a
    # launch then costs no re-read of the argument modules.
    settings: Any = field(default=None, repr=False)

    def by_category(self, category: str) -> list[Finding]:
        return [f for f in self.findings if f.category == category]

    def kinds(self, kind: str) -> list[Finding]:
        return [f for f in self.findings if f.kind == kind]

    def verdict(self, worker: str) -> Verdict | None:
        return next((v for v in self.verdicts if v.worker == worker), None)

    def counts(self) -> dict[str, int]:
        return {c: len(self.by_category(c)) for c in CATEGORIES}

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": f"eaglegate.couplings/{COUPLINGS_SCHEMA_VERSION}",
            "sglang": {"version": self.version, "root": self.root},
            "counts": self.counts(),
            "findings": [f.to_json() for f in self.findings],
            "verdicts": [v.to_json() for v in self.verdicts],
            "scope": self.scope,
            "timing_s": {k: round(v, 3) for k, v in self.timing.items()},
        }
