"""The answers the agent tools give: one TypedDict per tool, published as its JSON Schema.

The MCP server advertises these as each tool's `outputSchema`, and `eaglegate tool NAME`
prints the same objects, so an agent that shells out reads the same shape. Lists whose
items vary with `detail` are `list[dict[str, Any]]`; the keys each tool always sets are
typed here. `typing_extensions.TypedDict` because pydantic needs it on Python < 3.12.
"""

from typing import Any

from typing_extensions import NotRequired, TypedDict

AGENTS_SCHEMA = "eaglegate.agents/1"


class Tree(TypedDict):
    """The located SGLang tree every answer names."""

    version: str
    origin: str
    root: str


class Page(TypedDict):
    """Where a paged list stands: ask again with `page: next_page` for more (null: last page)."""

    page: int
    page_size: int
    total: int
    pages: int
    next_page: int | None


class LocateOut(TypedDict):
    schema: str
    summary: str
    sglang: Tree
    detail: dict[str, str]
    note: str | None
    speculative_workers: list[str]
    patch_state: str


class MapOut(TypedDict):
    schema: str
    summary: str
    sglang: Tree
    scheduler: dict[str, Any]
    workers: list[dict[str, Any]]
    paths: list[dict[str, Any]]
    paths_page: Page
    below: list[Any]  # what the steps do one level deeper, paged by `below_page`
    below_page: Page
    parse_failures: int


class CouplingsOut(TypedDict):
    schema: str
    summary: str
    sglang: Tree
    verdicts: list[dict[str, Any]]
    counts: dict[str, int]
    launch: dict[str, Any]  # what the launch selects and what was left out (scoped: false with all_findings)
    findings: list[dict[str, Any]]
    findings_page: Page
    source_schema: str | None


class SymbolOut(TypedDict):
    schema: str
    summary: str
    sglang: Tree
    definition: dict[str, Any] | None
    candidates: list[str]
    callers: list[dict[str, Any]]
    callees: list[dict[str, Any]]
    calls_page: Page
    excerpt: dict[str, Any] | None


class PlanOut(TypedDict):
    schema: str
    summary: str
    sglang: Tree
    workers: list[dict[str, Any]]
    verdicts: dict[str, Any]
    gate: dict[str, Any]
    plan: dict[str, Any]
    next_steps: list[str]


class PatchOut(TypedDict):
    schema: str
    summary: str
    sglang: Tree
    family: str
    threshold: int
    package_parent: str
    files: list[dict[str, Any]]
    insertion_point: dict[str, Any] | None
    already_applied: bool
    launch_flags: list[str]
    hunks: list[dict[str, Any]]
    hunks_page: Page


class ChangeOut(TypedDict):
    schema: str
    summary: str
    sglang: Tree
    action: str
    changed: list[str]
    message: str
    launch_flags: list[str]
    status: dict[str, Any]


class ReportOut(TypedDict):
    schema: str
    summary: str
    sglang: Tree
    renderer: str
    resources: list[str]
    sections: list[str]
    markdown: NotRequired[str]


class CalibrateOut(TypedDict):
    """Where speculation stops paying (no SGLang tree: two sweeps, or a roofline estimate)."""

    schema: str
    summary: str
    status: str  # crosses, spec-never-wins, spec-always-wins
    crossover: float | None
    threshold: int | None
    threshold_range: list[int | None] | None  # under the spread of levels measured more than once
    hysteresis: int
    resume_at: int | None
    margin: float
    rows: list[dict[str, float]]  # concurrency, baseline, spec, ratio (powers of two for an estimate)
    notes: list[str]
    estimate: dict[str, Any] | None  # the roofline's figures, when estimated
    depth_table: NotRequired[str]  # with depth sweeps: the table as JSON text, as plan_gate takes it
