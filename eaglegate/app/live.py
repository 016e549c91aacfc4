"""Measuring live servers: sweep, calibrate, verify-live. Each takes a checked request."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eaglegate.app.requests import (
    ESTIMATE_FIGURES,
    TEXT_LIMITS,
    check_count,
    check_depth_sweeps,
    check_figure,
    check_fraction,
    check_given,
    check_output,
    check_png,
    check_positive,
    check_text,
    same_file,
    set_checked,
)
from eaglegate.errors import UsageError, UserError
from eaglegate.live.calibrate import Roofline

if TYPE_CHECKING:
    from eaglegate.live.calibrate import Calibration, Curve, DepthBands
    from eaglegate.live.client import Endpoint
    from eaglegate.live.sweep import Point, SweepProgress
    from eaglegate.live.verify_live import VerifyReport as LiveReport


@dataclass(frozen=True)
class SweepRequest:
    url: object
    concurrency: object = "1-256"
    prompts: object = None
    output: object = "sweep.jsonl"
    api: object = "auto"
    model: object = None
    max_tokens: object = 256
    rounds: object = 2
    min_requests: object = 8
    ignore_eos: bool = True
    timeout: object = 300.0
    tag: object = None
    endpoint: Any = field(default=None, init=False)  # the server, resolved from url and api

    def __post_init__(self) -> None:
        from eaglegate.live.client import check_api, resolve_endpoint
        from eaglegate.live.sweep import parse_levels

        set_checked(self, "max_tokens", check_count("--max-tokens", self.max_tokens))
        set_checked(self, "rounds", check_count("--rounds", self.rounds))
        set_checked(self, "min_requests", check_count("--min-requests", self.min_requests))
        set_checked(self, "timeout", check_positive("--timeout", self.timeout))
        check_output(self.output)
        set_checked(self, "url", _url(self.url))
        set_checked(self, "api", check_api(self.api))
        set_checked(self, "endpoint", resolve_endpoint(str(self.url), self.api))  # type: ignore[arg-type]
        set_checked(self, "concurrency", parse_levels(check_text("--concurrency", self.concurrency) or ""))
        set_checked(self, "prompts", check_text("--prompts", self.prompts))
        set_checked(self, "model", check_text("--model", self.model))
        set_checked(self, "tag", check_text("--tag", self.tag))


def _url(url: object) -> str:
    text = check_text("--url", url)
    if text is None:
        raise UsageError("--url must name the server (host:port or a URL)")
    return text


@dataclass(frozen=True)
class VerifyLiveRequest:
    url: object
    baseline_url: object
    low: object = 1
    high: object = 128
    tolerance: object = 0.1
    prompts: object = None
    max_tokens: object = 128
    rounds: object = 2
    logprobs: bool = True
    api: object = "auto"
    model: object = None
    timeout: object = 300.0
    gated: Any = field(default=None, init=False)  # the servers, resolved from the urls and api
    plain: Any = field(default=None, init=False)

    def __post_init__(self) -> None:
        from eaglegate.live.client import check_api, resolve_endpoint

        set_checked(self, "low", check_count("--low", self.low))
        set_checked(self, "high", check_count("--high", self.high))
        set_checked(self, "tolerance", check_fraction("--tolerance", self.tolerance))
        set_checked(self, "max_tokens", check_count("--max-tokens", self.max_tokens))
        set_checked(self, "rounds", check_count("--rounds", self.rounds))
        set_checked(self, "timeout", check_positive("--timeout", self.timeout))
        set_checked(self, "url", _url(self.url))
        set_checked(self, "baseline_url", _url(self.baseline_url))
        set_checked(self, "api", check_api(self.api))
        set_checked(self, "gated", resolve_endpoint(str(self.url), self.api))  # type: ignore[arg-type]
        set_checked(self, "plain", resolve_endpoint(str(self.baseline_url), self.api))  # type: ignore[arg-type]
        set_checked(self, "prompts", check_text("--prompts", self.prompts))
        set_checked(self, "model", check_text("--model", self.model))


@dataclass(frozen=True)
class Estimate:
    """`calibrate --estimate`'s model of the server (docs/calibrate.md): what the roofline
    needs, the GPU by name or by its peak figures."""

    params_b: float | None = None
    draft_tokens: int | None = None
    accept_len: float | None = None
    gpu: str | None = None
    peak_tflops: float | None = None
    bandwidth_tbs: float | None = None
    draft_params_b: float | None = None
    num_steps: int | None = None
    # The model's own defaults, so the two cannot drift apart.
    context_len: int = Roofline.context_len
    kv_kib_per_token: float | None = None
    flops_efficiency: float = Roofline.flops_efficiency
    bandwidth_efficiency: float = Roofline.bandwidth_efficiency
    overhead_ms: float = Roofline.overhead_ms
    max_concurrency: int = 1024

    def roofline(self) -> Roofline:
        """The roofline this estimate describes, its figures checked as it is built."""
        from eaglegate.live import calibrate as cal

        for name in ESTIMATE_FIGURES:
            check_figure(name, getattr(self, name))
        check_text("gpu", self.gpu, TEXT_LIMITS["gpu"])
        missing = [n for n, v in (("--params-b", self.params_b), ("--draft-tokens", self.draft_tokens),
                                  ("--accept-len", self.accept_len)) if v is None]
        if missing:
            raise UsageError(f"--estimate needs {', '.join(missing)}")
        assert self.params_b is not None and self.draft_tokens is not None and self.accept_len is not None
        check_count("--context-len", self.context_len)
        check_count("--max-concurrency", self.max_concurrency, 2)
        flops, bw = cal.roofline_for_gpu(self.gpu, self.peak_tflops, self.bandwidth_tbs)
        return cal.Roofline(
            params_b=self.params_b, draft_tokens=self.draft_tokens, accept_len=self.accept_len,
            peak_tflops=flops, bandwidth_tbs=bw, draft_params_b=self.draft_params_b,
            num_steps=self.num_steps, context_len=self.context_len,
            kv_kib_per_token=self.kv_kib_per_token, flops_efficiency=self.flops_efficiency,
            bandwidth_efficiency=self.bandwidth_efficiency, overhead_ms=self.overhead_ms,
        )


@dataclass(frozen=True)
class CalibrateRequest:
    """`calibrate`: two sweep files, or a roofline estimate; the margin; a PNG to draw. Or,
    for the depth gate, the baseline and one sweep per static depth (`depths`), and where to
    write the depth table (`table_out`)."""

    baseline: object = None
    spec: object = None
    margin: object = 0.05
    estimate: Estimate | None = None
    png: object = None
    depths: object = None  # checked: {depth: sweep file}
    table_out: object = None
    model: Roofline | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        set_checked(self, "baseline", check_text("baseline", self.baseline, TEXT_LIMITS["baseline"]))
        set_checked(self, "spec", check_text("spec", self.spec, TEXT_LIMITS["spec"]))
        set_checked(self, "margin", check_fraction("--margin", self.margin))
        set_checked(self, "png", check_png(self.png))
        check_output(self.png, {"baseline sweep": self.baseline, "spec sweep": self.spec})
        depths = check_depth_sweeps(self.depths)
        set_checked(self, "depths", depths)
        set_checked(self, "table_out", check_given("--table-out", self.table_out))
        depth_sweeps = {f"sweep of depth {d}": path for d, path in depths.items()}
        check_output(self.table_out, {"baseline sweep": self.baseline, **depth_sweeps})
        baseline_twin = next((name for name, path in depth_sweeps.items()
                              if self.baseline and same_file(Path(str(self.baseline)), Path(path))), None)
        if baseline_twin:
            raise UsageError(f"the baseline sweep is also the {baseline_twin}: the baseline is plain decoding's own sweep")
        if self.depths or self.table_out:
            if self.estimate is not None or self.spec or self.png:
                raise UsageError("--depth takes the baseline sweep and one sweep per depth: no spec sweep, "
                                 "--estimate or --png")
            if not self.baseline or not self.depths:
                raise UsageError("a depth table needs the baseline sweep and --depth DEPTH=FILE for each depth")
        elif self.estimate is not None:
            if self.baseline or self.spec:
                raise UsageError("--estimate takes no sweep files")
            set_checked(self, "model", self.estimate.roofline())
        elif not self.baseline or not self.spec:
            raise UsageError("give two sweep files (baseline, spec), or --estimate with model parameters")


@dataclass
class Swept:
    """The server a sweep measured and one record per concurrency level."""

    endpoint: Endpoint
    records: list[dict[str, Any]]


def sweep(request: SweepRequest, progress: SweepProgress | None = None) -> Swept:
    """Measure output tokens/s, TTFT and inter-token latency at each concurrency level,
    appending one JSON line per finished level to the request's output."""
    from eaglegate.live.client import load_prompts
    from eaglegate.live.sweep import run_sweep

    endpoint = request.endpoint
    prompts = load_prompts(request.prompts)  # type: ignore[arg-type]
    records = run_sweep(endpoint, request.concurrency, prompts, str(request.output),  # type: ignore[arg-type]
                        model=request.model, max_tokens=request.max_tokens,  # type: ignore[arg-type]
                        rounds=request.rounds, min_requests=request.min_requests,  # type: ignore[arg-type]
                        ignore_eos=bool(request.ignore_eos), timeout=request.timeout,  # type: ignore[arg-type]
                        tag=request.tag, progress=progress)  # type: ignore[arg-type]
    return Swept(endpoint, records)


@dataclass
class Calibrated:
    """Both curves, where speculation stops paying, the rows to show, and the estimate's
    figures (when estimated)."""

    base: Curve
    spec: Curve
    result: Calibration
    rows: list[dict[str, float]]
    estimate: dict[str, Any] | None = None


def calibrate(request: CalibrateRequest) -> Calibrated:
    """Find where speculation stops paying and recommend the gate's threshold and
    hysteresis: from two sweep files, or from the request's roofline estimate. With a PNG
    asked for, draws it."""
    from eaglegate.live import calibrate as cal
    from eaglegate.live.sweep import points_of, read_rows

    figures: dict[str, Any] | None = None
    spread: cal.Spread | None = None
    model, estimate = request.model, request.estimate
    if model is not None and estimate is not None:
        base_curve, spec_curve = cal.estimate_curves(model, estimate.max_concurrency)
        figures = {
            "peak_tflops": model.peak_tflops, "bandwidth_tbs": model.bandwidth_tbs,
            "draft_params_b": model.draft_b, "num_steps": model.steps,
            "kv_kib_per_token": model.kv_bytes / 1024, "context_len": estimate.context_len,
            "overhead_ms": estimate.overhead_ms,
        }
    else:
        base_file, spec_file = str(request.baseline), str(request.spec)
        base_rows, spec_rows = read_rows(base_file), read_rows(spec_file)
        lengths = sorted(set(cal.context_lengths([r.context for r in base_rows + spec_rows
                                                  if r.context is not None]).values()))
        if len(lengths) > 1:  # averaged together they would answer for no length at all
            raise UserError(f"the sweeps hold {len(lengths)} context lengths ({', '.join(map(str, lengths))} "
                            "tokens) and the threshold is one number: give one length's sweeps, or calibrate "
                            "the depth table (--depth), which has a band per length")
        base_points, spec_points = points_of(base_rows), points_of(spec_rows)
        base_curve = _curve(f"baseline ({base_file})", base_points)
        spec_curve = _curve(f"speculative ({spec_file})", spec_points)
        if any(p.low != p.high for p in base_points + spec_points):  # a level measured more than once
            spread = cal.Spread(_curve("baseline, lowest", base_points, "low"),
                                _curve("baseline, highest", base_points, "high"),
                                _curve("speculative, lowest", spec_points, "low"),
                                _curve("speculative, highest", spec_points, "high"))
    result = cal.calibrate(base_curve, spec_curve, margin=float(request.margin))  # type: ignore[arg-type]
    result = cal.with_spread(result, spread) if spread else result
    calibrated = Calibrated(base_curve, spec_curve, result, cal.display_rows(base_curve, spec_curve, result),
                            figures)
    if request.png:
        from eaglegate.reports.charts import render_png

        render_png(base_curve, spec_curve, result, str(request.png))
    return calibrated


@dataclass
class DepthTabled:
    """The depth chosen per level and context, the table the depth gate reads (its JSON
    object), and the file it was written to (None: not asked)."""

    result: DepthBands
    table: dict[str, Any]
    written: str | None = None


def calibrate_depths(request: CalibrateRequest) -> DepthTabled:
    """The depth gate's table from a baseline sweep and one sweep per static depth: the
    sweeps' lines grouped by context length (`live.calibrate.context_lengths`), the best depth
    per level and context (`live.calibrate.choose_depths`, on each level's median, with the
    choice of every repeat), one table over them (`depth_bands`), checked with the gate's own
    parser and, with `table_out`, written whole or not at all."""
    import json
    import statistics

    from eaglegate.app.tree import write_file
    from eaglegate.live import calibrate as cal
    from eaglegate.live.sweep import read_rows
    from eaglegate.patches.gate_module import DepthTable

    files: dict[int, str] = {0: str(request.baseline), **dict(sorted(request.depths.items()))}  # type: ignore[attr-defined]
    names = {d: f"{'plain' if d == 0 else f'depth {d}'} ({path})" for d, path in files.items()}
    rows = {d: read_rows(path) for d, path in files.items()}
    every = [(d, r) for d in rows for r in rows[d]]
    placed = [(d, r) for d, r in every if r.context is not None]
    if placed and len(placed) < len(every):
        d, row = next((d, r) for d, r in every if r.context is None)
        other = next(d for d, _ in placed)
        raise UserError(f"{files[d]}:{row.line} has no prompt length (total_input_tokens, total_output_tokens, "
                        f"completed) while {files[other]} has: every line needs one to be placed in a context band")
    length = cal.context_lengths([r.context for _, r in placed if r.context is not None])
    contexts: list[int | None] = [*sorted(set(length.values()))] or [None]
    columns = []
    for context in contexts:
        samples: dict[int, dict[int, list[float]]] = {d: {} for d in files}
        for d, row in every:
            if row.context is None or length[row.context] == context:
                samples[d].setdefault(row.concurrency, []).append(row.output_throughput)
        missing = [names[d] for d in files if not samples[d]]
        if missing:
            measured = [names[d] for d in files if samples[d]]
            raise UserError(f"context {context} tokens was measured by {', '.join(measured)} but not by "
                            f"{', '.join(missing)}: sweep the baseline and every depth at every prompt length")
        curves = {d: cal.Curve.of(names[d], [(c, statistics.median(t)) for c, t in samples[d].items()])
                  for d in files}
        base = curves.pop(0)
        columns.append(cal.choose_depths(base, curves, margin=float(request.margin),  # type: ignore[arg-type]
                                         samples=samples, context=context))
    result = cal.depth_bands(columns)
    table = result.table()
    text = json.dumps(table)
    # What the server will read. Sweep levels are integers from 1 (`read_rows`) and context
    # bounds lie strictly between distinct lengths, so a refusal here is this code's bug.
    DepthTable.parse(text)
    written = None
    if request.table_out:
        write_file(str(request.table_out), (text + "\n").encode())
        written = str(request.table_out)
    return DepthTabled(result, table, written)


def _curve(label: str, points: list[Point], value: str = "output_throughput") -> Curve:
    from eaglegate.live.calibrate import Curve

    return Curve.of(label, [(p.concurrency, getattr(p, value)) for p in points])


def verify_live(request: VerifyLiveRequest, on_phase: Callable[[str, int, int], None] | None = None,
                on_request: Callable[[], None] | None = None) -> LiveReport:
    """Check that the gated server gives the plain server's greedy tokens and throughput."""
    from eaglegate.live.client import load_prompts
    from eaglegate.live.verify_live import verify_live as run

    gated, plain = request.gated, request.plain
    prompts = load_prompts(request.prompts)  # type: ignore[arg-type]
    return run(gated, plain, prompts, low=request.low, high=request.high,  # type: ignore[arg-type]
               tolerance=request.tolerance, max_tokens=request.max_tokens,  # type: ignore[arg-type]
               rounds=request.rounds, logprobs=bool(request.logprobs),  # type: ignore[arg-type]
               timeout=request.timeout, model=request.model,  # type: ignore[arg-type]
               on_phase=on_phase, on_request=on_request)
