"""Measuring live servers: sweep, calibrate, verify-live. Each takes a checked request."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eaglegate.app.requests import CalibrateRequest, SweepRequest, VerifyLiveRequest

if TYPE_CHECKING:
    from eaglegate.live.calibrate import Calibration, Curve, DepthCalibration
    from eaglegate.live.client import Endpoint
    from eaglegate.live.sweep import Point, SweepProgress
    from eaglegate.live.verify_live import VerifyReport as LiveReport


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
    from eaglegate.live.sweep import read_results

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
        base_points, spec_points = read_results(base_file), read_results(spec_file)
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
    """The depth chosen per level, the table the depth gate reads (its JSON object), and the
    file it was written to (None: not asked)."""

    result: DepthCalibration
    table: dict[str, Any]
    written: str | None = None


def calibrate_depths(request: CalibrateRequest) -> DepthTabled:
    """The depth gate's table from a baseline sweep and one sweep per static depth: the best
    depth per level (`live.calibrate.choose_depths`), one context band, checked with the
    gate's own parser and, with `table_out`, written whole or not at all."""
    import json

    from eaglegate.app.tree import write_file
    from eaglegate.live import calibrate as cal
    from eaglegate.live.sweep import read_results
    from eaglegate.patches.gate_module import DepthTable

    base_file = str(request.baseline)
    base = _curve(f"baseline ({base_file})", read_results(base_file))
    sweeps: dict[int, str] = request.depths  # type: ignore[assignment]
    by_depth = {d: _curve(f"depth {d} ({path})", read_results(path)) for d, path in sorted(sweeps.items())}
    result = cal.choose_depths(base, by_depth, margin=float(request.margin))  # type: ignore[arg-type]
    table = {"batch": result.bounds, "context": [], "depth": [[d] for d in result.depths],
             "margin": [[m] for m in result.margins]}
    text = json.dumps(table)
    # What the server will read. Sweep levels are integers from 1 (`read_results`), so the
    # bounds are batch sizes, strictly increasing: a refusal here is this code's bug.
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
