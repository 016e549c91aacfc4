"""Choose the gate's threshold and hysteresis from two throughput curves.

The curves come either from measurements (a baseline sweep without speculation and one
with it, see `sweep.py`) or from a roofline estimate (`estimate_curves`). The rule, also
in docs/calibrate.md:

- crossover: the first concurrency at which speculation stops beating the baseline, found
  on the union of both curves' levels with linear interpolation in log2(concurrency);
- threshold: the largest batch size below the crossover, because the gate speculates up
  to its threshold and stops above it;
- resume_at: once plain, speculation resumes only at batch <= resume_at, the largest
  concurrency at which speculation still gains `margin` (5% by default); the gate takes
  it as `SGLANG_SPEC_BATCH_GATE_RESUME=resume_at + 1` ("resume below"). Between the two
  the gain is within noise, so staying plain costs at most `margin` and the gate does not
  flap when the batch hovers at the threshold. hysteresis = threshold - resume_at.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from eaglegate.errors import UsageError, UserError

# Dense peak BF16 tensor FLOP/s (TFLOP/s) and HBM bandwidth (TB/s), from vendor data sheets.
GPUS: dict[str, tuple[float, float]] = {
    "a100": (312.0, 2.039),
    "h100": (989.0, 3.35),
    "h20": (148.0, 4.0),
    "h200": (989.0, 4.8),
    "b200": (2250.0, 8.0),
    "l40s": (362.0, 0.864),
    "mi300x": (1307.0, 5.3),
}

# The running-request cap some SGLang versions force when speculation is on (docs/architecture.md).
SPEC_RUNNING_CAP = 48


def is_rate(value: object) -> bool:
    """A throughput as a file or a model may hold it: a finite number above 0. JSON allows
    NaN and Infinity, and a bool is an int to Python; none of them is a measurement."""
    return (not isinstance(value, bool) and isinstance(value, (int, float))
            and math.isfinite(value) and value > 0)


@dataclass(frozen=True)
class Curve:
    """Output tokens/s by concurrency, sorted by concurrency, concurrencies unique and >= 1,
    every throughput a finite number above 0."""

    label: str
    points: tuple[tuple[float, float], ...]

    @classmethod
    def of(cls, label: str, points: Sequence[tuple[float, float]]) -> Curve:
        for c, t in points:
            if not (is_rate(c) and c >= 1):
                raise UserError(f"{label}: concurrency {c!r} is not a finite number from 1 on")
            if not is_rate(t):
                raise UserError(f"{label}: throughput {t!r} at concurrency {c:g} is not a finite number above 0")
        merged = dict(sorted((float(c), float(t)) for c, t in points))
        if not merged:
            raise UserError(f"{label}: no measurements")
        return cls(label, tuple(sorted(merged.items())))

    @property
    def levels(self) -> list[float]:
        return [c for c, _ in self.points]

    def at(self, concurrency: float) -> float:
        """Throughput at `concurrency`, linear in log2(concurrency) between levels."""
        pts = self.points
        if concurrency <= pts[0][0]:
            return pts[0][1]
        if concurrency >= pts[-1][0]:
            return pts[-1][1]
        x = math.log2(concurrency)
        for (c0, t0), (c1, t1) in zip(pts, pts[1:], strict=False):
            if c0 <= concurrency <= c1:
                x0, x1 = math.log2(c0), math.log2(c1)
                return t0 + (t1 - t0) * (x - x0) / (x1 - x0)
        return pts[-1][1]  # unreachable: the levels cover the range


Status = Literal["crosses", "spec-always-wins", "spec-never-wins"]


@dataclass
class Calibration:
    """The recommendation and the evidence it rests on (JSON via `to_json`)."""

    status: Status
    crossover: float | None
    threshold: int | None
    hysteresis: int
    resume_at: int | None
    margin: float
    rows: list[dict[str, float]]
    notes: list[str] = field(default_factory=list)
    # Under the spread of levels measured more than once: the threshold where the speculative
    # curve is at its lowest and the baseline at its highest, and the other way round (None
    # above: speculation still wins at the last level). None when no level was repeated.
    threshold_range: tuple[int, int | None] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "crossover": self.crossover,
            "threshold": self.threshold,
            "threshold_range": list(self.threshold_range) if self.threshold_range else None,
            "hysteresis": self.hysteresis,
            "resume_at": self.resume_at,
            "margin": self.margin,
            "rows": self.rows,
            "notes": self.notes,
        }


def _cross(x0: float, d0: float, x1: float, d1: float) -> float:
    """Where the line through (x0, d0), (x1, d1) in log2 space reaches 0, as a concurrency."""
    lx0, lx1 = math.log2(x0), math.log2(x1)
    if d0 == d1:
        return x1
    return float(2 ** (lx0 + (lx1 - lx0) * d0 / (d0 - d1)))


def calibrate(base: Curve, spec: Curve, margin: float = 0.05) -> Calibration:
    """Find the crossover of `spec` below `base` and recommend threshold and hysteresis.

    Compared only where both curves were measured (outside that range nothing is known).
    """
    if not 0 <= margin < 1:
        raise UserError(f"margin must be in [0, 1), got {margin}")
    lo = max(base.levels[0], spec.levels[0])
    hi = min(base.levels[-1], spec.levels[-1])
    if lo > hi:
        raise UserError(
            f"the two sweeps share no concurrency range ({base.label}: "
            f"{base.levels[0]:g}-{base.levels[-1]:g}, {spec.label}: "
            f"{spec.levels[0]:g}-{spec.levels[-1]:g})"
        )
    grid = sorted({c for c in base.levels + spec.levels if lo <= c <= hi})
    rows = []
    for c in grid:  # both curves' throughputs are above 0 (Curve.of)
        b, s = base.at(c), spec.at(c)
        rows.append({"concurrency": c, "baseline": b, "spec": s, "ratio": s / b})
    gains = [r["ratio"] - 1 for r in rows]
    notes: list[str] = []

    if gains[0] <= 0:
        return Calibration(
            "spec-never-wins", None, 1, 0, None, margin, rows,
            [f"speculation does not beat the baseline even at concurrency {grid[0]:g}: "
             "threshold 1 turns it off for every batch (or do not enable it)"],
        )
    first_loss = next((i for i, g in enumerate(gains) if g <= 0), None)
    if first_loss is None:
        return Calibration(
            "spec-always-wins", None, None, 0, None, margin, rows,
            [f"speculation beats the baseline at every compared level up to {grid[-1]:g}: "
             "the crossover lies higher (measure further, or raise --max-concurrency)"],
        )
    i = first_loss
    crossover = _cross(grid[i - 1], gains[i - 1], grid[i], gains[i])
    # The gate speculates at batch <= threshold: the last size still below the crossover.
    threshold = max(1, math.ceil(crossover - 1e-9) - 1)

    # Resume bound: the largest concurrency below the crossover where the gain is >= margin.
    # (gains[i] <= 0 < margin, so the point after the last such j is below the margin.)
    resume_c = grid[0]
    for j in range(i - 1, -1, -1):
        if gains[j] >= margin:
            resume_c = _cross(grid[j], gains[j] - margin, grid[j + 1], gains[j + 1] - margin)
            break
    resume_at = min(max(1, math.floor(resume_c + 1e-9)), threshold - 1) if threshold > 1 else 0
    hysteresis = threshold - resume_at if threshold > 1 else 0

    if grid[i] > 2 * grid[i - 1]:
        # Over more than a doubling the straight line in log2 is a guess, and a threshold
        # from a guess moves from run to run (docs/calibrate.md, rule 7, has the runs).
        notes.append(
            f"the crossover is interpolated between concurrency {grid[i - 1]:g} and {grid[i]:g}, "
            "more than a doubling apart: measure levels between them for a threshold that holds"
        )
    regains = sum(1 for a, b in zip(gains[i:], gains[i + 1:], strict=False) if a <= 0 < b)
    if regains:
        notes.append(
            f"speculation wins again above the crossover ({regains} more crossing(s)): "
            "the measurements are noisy or capped; re-run with more requests per level"
        )
    notes.extend(_cap_notes(base, spec, threshold))
    return Calibration(
        "crosses", crossover, threshold, hysteresis, resume_at, margin, rows, notes
    )


@dataclass(frozen=True)
class Spread:
    """Each curve at its lowest and highest measured value per level."""

    base_low: Curve
    base_high: Curve
    spec_low: Curve
    spec_high: Curve


def with_spread(result: Calibration, spread: Spread) -> Calibration:
    """`result` with the threshold's range under the measured spread, and a note when the
    range is wide (the threshold then rests on noise: measure more). Only a crossing curve
    has a threshold to bound."""
    if result.status != "crosses" or result.threshold is None:
        return result
    pessimistic = calibrate(spread.base_high, spread.spec_low, result.margin)
    optimistic = calibrate(spread.base_low, spread.spec_high, result.margin)
    low = pessimistic.threshold if pessimistic.threshold is not None else 1
    high = optimistic.threshold if optimistic.status != "spec-always-wins" else None
    result.threshold_range = (low, high)
    if high is None or low < 0.8 * result.threshold or high > 1.25 * result.threshold:
        upper = f"{high}" if high is not None else "above the measured levels"
        result.notes.append(
            f"the repeated levels' spread puts the threshold anywhere from {low} to {upper}: "
            "the curves are too close there for the measurements' noise; measure those levels "
            "more times (each sweep run into the same file adds a sample) or more levels near "
            "the crossover"
        )
    return result


def _cap_notes(base: Curve, spec: Curve, threshold: int) -> list[str]:
    notes = [
        f"the server must run batches larger than {threshold} or the gate never fires: the gate "
        "patch (either worker's) keeps SGLang's own caps; without it, set --max-running-requests and "
        f"--cuda-graph-max-bs above {threshold} (speculation caps running requests at 48)"
    ]
    capped = [(c, t) for c, t in spec.points if c >= SPEC_RUNNING_CAP]
    if len(capped) >= 2:
        first, last = capped[0][1], capped[-1][1]
        grew = base.at(capped[-1][0]) / max(base.at(capped[0][0]), 1e-9)
        if first > 0 and last / first < 1.05 and grew > 1.10:
            notes.append(
                f"the speculative curve is flat from concurrency {capped[0][0]:g}: SGLang caps "
                f"running requests at {SPEC_RUNNING_CAP} with speculation unless "
                "--max-running-requests is set, so the crossover may reflect the cap"
            )
    return notes


# ---------------------------------------------------------------------------------------
# Roofline estimate (no measurements). Assumptions are listed in docs/calibrate.md.


@dataclass(frozen=True)
class Roofline:
    """Inputs of the roofline estimate. Sizes in billions of parameters, KV in KiB/token."""

    params_b: float
    draft_tokens: int
    accept_len: float
    peak_tflops: float
    bandwidth_tbs: float
    draft_params_b: float | None = None
    num_steps: int | None = None
    context_len: int = 1024
    kv_kib_per_token: float | None = None
    dtype_bytes: float = 2.0
    flops_efficiency: float = 0.6
    bandwidth_efficiency: float = 0.8
    overhead_ms: float = 0.0

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value)):
                raise UsageError(f"--{name.replace('_', '-')} must be a finite number, not {value!r}")
        checks = [
            (self.params_b > 0, "--params-b must be positive"),
            (self.draft_tokens >= 2, "--draft-tokens must be at least 2"),
            (1 <= self.accept_len <= self.draft_tokens,
             "--accept-len must be between 1 and --draft-tokens (it counts the bonus token)"),
            (self.peak_tflops > 0 and self.bandwidth_tbs > 0, "peak FLOP/s and bandwidth must be positive"),
            (self.context_len >= 0, "--context-len must not be negative"),
            (0 < self.flops_efficiency <= 1 and 0 < self.bandwidth_efficiency <= 1,
             "efficiencies must be in (0, 1]"),
            (self.num_steps is None or self.num_steps >= 1, "--num-steps must be at least 1"),
            (self.overhead_ms >= 0, "--overhead-ms must not be negative"),
            (self.draft_params_b is None or self.draft_params_b > 0, "--draft-params-b must be positive"),
            (self.kv_kib_per_token is None or self.kv_kib_per_token > 0, "--kv-kib-per-token must be positive"),
        ]
        for ok, message in checks:
            if not ok:
                raise UsageError(message)

    @property
    def draft_b(self) -> float:
        # EAGLE heads are about one decoder layer plus a head: ~5% of an 8B model.
        return self.draft_params_b if self.draft_params_b is not None else self.params_b / 20

    @property
    def steps(self) -> int:
        # Chain drafting (topk 1): num_draft_tokens = num_steps + 1.
        return self.num_steps if self.num_steps is not None else self.draft_tokens - 1

    @property
    def kv_bytes(self) -> float:
        # 128 KiB/token for Llama-3-8B (32 layers x 8 KV heads x 128 x K,V x 2 bytes),
        # growing roughly with the square root of size (Llama-3-70B: 320 KiB).
        kib = self.kv_kib_per_token
        if kib is None:
            kib = 128.0 * math.sqrt(self.params_b / 8.0) * self.dtype_bytes / 2.0
        return kib * 1024.0

    def forward_s(self, params_b: float, kv_bytes: float, requests: float, tokens: float) -> float:
        """One forward: `tokens` query tokens over `requests` sequences of `context_len`."""
        weights = params_b * 1e9 * self.dtype_bytes
        moved = weights + requests * self.context_len * kv_bytes
        flops = 2.0 * params_b * 1e9 * tokens
        return self.overhead_ms / 1000.0 + max(
            moved / (self.bandwidth_tbs * 1e12 * self.bandwidth_efficiency),
            flops / (self.peak_tflops * 1e12 * self.flops_efficiency),
        )

    def plain_tps(self, batch: float) -> float:
        return batch / self.forward_s(self.params_b, self.kv_bytes, batch, batch)

    def spec_tps(self, batch: float) -> float:
        draft_kv = self.kv_bytes * self.draft_b / self.params_b
        draft = self.steps * self.forward_s(self.draft_b, draft_kv, batch, batch)
        verify = self.forward_s(self.params_b, self.kv_bytes, batch, batch * self.draft_tokens)
        return batch * self.accept_len / (draft + verify)


def roofline_for_gpu(gpu: str | None, peak_tflops: float | None, bandwidth_tbs: float | None) -> tuple[float, float]:
    """Peak TFLOP/s and TB/s from a GPU name, explicit values overriding it."""
    if gpu is not None:
        key = gpu.lower().replace("-", "").replace(" ", "")
        if key not in GPUS:
            raise UsageError(f"unknown GPU {gpu!r}: one of {', '.join(sorted(GPUS))}, or pass --peak-tflops and --bandwidth-tbs")
        flops, bw = GPUS[key]
        return peak_tflops or flops, bandwidth_tbs or bw
    if peak_tflops is None or bandwidth_tbs is None:
        raise UsageError("--estimate needs --gpu, or both --peak-tflops and --bandwidth-tbs")
    return peak_tflops, bandwidth_tbs


def estimate_curves(model: Roofline, max_concurrency: int = 1024) -> tuple[Curve, Curve]:
    """Baseline and speculative curves at every integer concurrency up to `max_concurrency`."""
    levels = range(1, max_concurrency + 1)
    base = Curve.of("baseline (estimate)", [(c, model.plain_tps(c)) for c in levels])
    spec = Curve.of("speculative (estimate)", [(c, model.spec_tps(c)) for c in levels])
    return base, spec


def display_rows(base: Curve, spec: Curve, cal: Calibration) -> list[dict[str, float]]:
    """The rows to show: the measured levels, or powers of two for a dense (estimated) curve."""
    if len(cal.rows) <= 24:
        return cal.rows
    lo, hi = cal.rows[0]["concurrency"], cal.rows[-1]["concurrency"]
    levels: list[float] = []
    c = lo
    while c <= hi:
        levels.append(c)
        c *= 2
    return [
        {"concurrency": c, "baseline": base.at(c), "spec": spec.at(c), "ratio": spec.at(c) / base.at(c)}
        for c in levels
    ]


# ---------------------------------------------------------------------------------------
# The depth gate's table: the best static depth at each measured concurrency.


@dataclass
class DepthCalibration:
    """The depth chosen at each compared level (0 is plain decoding) at one context length
    (None: the sweeps do not say), and the batch bands they make (JSON via `to_json`).
    `bounds[i]` is the inclusive upper bound of band i, the last band open; `depths[i]` and
    `margins[i]` are band i's choice and its weakest lead. A row measured more than once by
    every sweep also holds `repeats`, the choice made on each repeat, and `agree`, how many of
    them made the row's choice."""

    margin: float
    rows: list[dict[str, Any]]
    bounds: list[int]
    depths: list[int]
    margins: list[float]
    notes: list[str] = field(default_factory=list)
    context: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"context": self.context, "margin": self.margin, "rows": self.rows, "batch": self.bounds,
                "depth": self.depths, "lead": self.margins, "notes": self.notes}


def _pick(throughput: dict[int, float], margin: float) -> int:
    """The fastest depth where it beats plain decoding (0) by `margin`, else plain decoding.
    The margin guards only the step off plain decoding, whose off state is free; between
    speculative depths a margin would keep one measured slower, a loss of up to the margin."""
    fastest = max((d for d in throughput if d), key=lambda d: throughput[d])
    return fastest if throughput[fastest] >= (1 + margin) * throughput[0] else 0


def choose_depths(base: Curve, by_depth: dict[int, Curve], margin: float = 0.05,
                  samples: dict[int, dict[int, list[float]]] | None = None,
                  context: int | None = None) -> DepthCalibration:
    """At each level both the baseline and every depth's curve cover, the depth to run: the
    fastest speculative depth where it beats plain decoding (0) by `margin`, the rule by which
    the threshold's speculation must gain `margin` to resume, else plain decoding.
    A choice's lead is its throughput over the best other depth's, minus 1 (negative where a
    faster depth did not clear the margin over plain decoding). Adjacent levels with the same depth make one
    band, whose lead is the smallest of its levels'; a batch size between two levels takes
    the choice of the level above it, whose batch it does not exceed.

    `samples` (depth, 0 the baseline -> level -> throughputs in measured order) are the
    repeats behind the curves: at a level every sweep measured more than once, repeat i is
    chosen on each sweep's i-th measurement, as many repeats as the fewest any sweep has."""
    if not 0 <= margin < 1:
        raise UserError(f"margin must be in [0, 1), got {margin}")
    if not by_depth or any(d < 1 for d in by_depth):
        raise UserError("give a speculative sweep for at least one depth, each depth from 1 on")
    curves = [base, *by_depth.values()]
    lo, hi = max(c.levels[0] for c in curves), min(c.levels[-1] for c in curves)
    if lo > hi:
        raise UserError("the sweeps share no concurrency range: "
                        + ", ".join(f"{c.label}: {c.levels[0]:g}-{c.levels[-1]:g}" for c in curves))
    grid = sorted({level for c in curves for level in c.levels if lo <= level <= hi})
    rows: list[dict[str, Any]] = []
    for level in grid:
        throughput = {0: base.at(level), **{d: by_depth[d].at(level) for d in sorted(by_depth)}}
        chosen = _pick(throughput, margin)
        runner_up = max(t for d, t in throughput.items() if d != chosen)
        row: dict[str, Any] = {"concurrency": level, "throughput": {str(d): t for d, t in throughput.items()},
                               "depth": chosen, "lead": throughput[chosen] / runner_up - 1}
        repeats = _repeats(samples or {}, [0, *sorted(by_depth)], int(level))
        if len(repeats) >= 2:
            row["repeats"] = [_pick(r, margin) for r in repeats]
            row["agree"] = row["repeats"].count(chosen)
        rows.append(row)
    bounds: list[int] = []
    depths: list[int] = []
    leads: list[float] = []
    for row in rows:
        if depths and depths[-1] == row["depth"]:
            bounds[-1] = int(row["concurrency"])
            leads[-1] = min(leads[-1], row["lead"])
            continue
        bounds.append(int(row["concurrency"]))
        depths.append(row["depth"])
        leads.append(row["lead"])
    where = f" at context {context}" if context is not None else ""
    notes = []
    top = max(by_depth)
    if depths[0] == top:
        notes.append(f"the deepest depth measured ({top}) wins at concurrency {grid[0]:g}{where}: a deeper one "
                     "may win there too (sweep it)")
    for row in rows:
        if row.get("agree", 0) < len(row.get("repeats", ())):
            others = sorted({d for d in row["repeats"] if d != row["depth"]})
            notes.append(
                f"concurrency {row['concurrency']:g}{where}: depth {row['depth']} in {row['agree']} of "
                f"{len(row['repeats'])} repeats ({', '.join(map(str, others))} in the others): the choice "
                "rests on noise; measure that level more times (each sweep run into the same file adds a "
                "repeat)")
    # Past the last measured level the last band's choice holds: its bound is dropped.
    return DepthCalibration(margin, rows, bounds[:-1], depths, [round(x, 4) for x in leads], notes, context)


def _repeats(samples: dict[int, dict[int, list[float]]], depths: list[int], level: int) -> list[dict[int, float]]:
    """The throughput of every depth in each repeat of `level`: none unless every depth was
    measured exactly there, as many as the fewest measurements any depth has."""
    if not all(samples.get(d, {}).get(level) for d in depths):
        return []
    count = min(len(samples[d][level]) for d in depths)
    return [{d: samples[d][level][i] for d in depths} for i in range(count)]


@dataclass
class DepthBands:
    """The depth gate's table over every measured context: one column per context length
    (`columns`, shortest first), batch bands where any column's choice changes. `batch` and
    `context` are the bands' inclusive upper bounds, the last of each open; `depths[i][j]`,
    `leads[i][j]` and `agreement[i][j]` (the weakest (agree, repeats) among its levels, None
    when no level was repeated) describe batch band i at context band j."""

    margin: float
    columns: list[DepthCalibration]
    batch: list[int]
    context: list[int]
    depths: list[list[int]]
    leads: list[list[float]]
    agreement: list[list[tuple[int, int] | None]]
    notes: list[str] = field(default_factory=list)

    def table(self) -> dict[str, Any]:
        """The table as the gate parses it (`gate_module.DepthTable`), each cell's lead as its margin."""
        return {"batch": self.batch, "context": self.context, "depth": self.depths, "margin": self.leads}

    def to_json(self) -> dict[str, Any]:
        return {"margin": self.margin, "contexts": [c.context for c in self.columns],
                "batch": self.batch, "context": self.context, "depth": self.depths, "lead": self.leads,
                "agreement": [[list(a) if a else None for a in row] for row in self.agreement],
                "columns": [c.to_json() for c in self.columns], "notes": self.notes}


def context_bounds(contexts: Sequence[int]) -> list[int]:
    """The bounds between measured context lengths (sorted, distinct): the geometric midpoint
    of each pair, as the levels are powers of two and a step's KV read scales with its
    context, so a length halfway in ratio is as near to either measurement."""
    return [math.isqrt(a * b) for a, b in zip(contexts, contexts[1:], strict=False)]


def depth_bands(columns: Sequence[DepthCalibration]) -> DepthBands:
    """One table from each context's choices (shortest context first). A level one column did
    not measure takes that column's choice at the next level it measured above (its batch
    does not exceed that level's), or past its last level, its last level's."""
    if not columns:
        raise UserError("no context length to calibrate")
    levels = sorted({int(r["concurrency"]) for c in columns for r in c.rows})

    def row_at(column: DepthCalibration, level: int) -> dict[str, Any]:
        return next((r for r in column.rows if r["concurrency"] >= level), column.rows[-1])

    bands: list[tuple[int, list[dict[str, Any]]]] = []  # (upper level, each column's rows in it)
    for level in levels:
        chosen = [row_at(c, level) for c in columns]
        if bands and [r["depth"] for r in bands[-1][1][-len(columns):]] == [r["depth"] for r in chosen]:
            bands[-1] = (level, bands[-1][1] + chosen)
        else:
            bands.append((level, chosen))
    depths, leads, agreement = [], [], []
    for _, rows in bands:
        per_column = [rows[j::len(columns)] for j in range(len(columns))]
        depths.append([col[0]["depth"] for col in per_column])
        leads.append([round(min(r["lead"] for r in col), 4) for col in per_column])
        agreement.append([_weakest(col) for col in per_column])
    notes = [n for c in columns for n in c.notes]
    for column in columns:
        last = int(column.rows[-1]["concurrency"])
        if last < levels[-1]:
            notes.append(f"context {column.context} was measured up to concurrency {last}: above it the table "
                         f"keeps its choice there (depth {column.rows[-1]['depth']}); sweep it as high as the others")
    contexts = [c.context for c in columns if c.context is not None]
    return DepthBands(columns[0].margin, list(columns), [level for level, _ in bands[:-1]], context_bounds(contexts),
                      depths, leads, agreement, notes)


def _weakest(rows: list[dict[str, Any]]) -> tuple[int, int] | None:
    """The lowest share of repeats that agreed among `rows`, as (agree, repeats)."""
    repeated = [(r["agree"], len(r["repeats"])) for r in rows if "repeats" in r]
    return min(repeated, key=lambda a: a[0] / a[1]) if repeated else None


# Sweeps of one prompt length differ a little in their measured context (outputs that stop
# at EOS, a tokenizer's count); lengths meant to differ are set far apart (256 and 4,096).
SAME_CONTEXT = 1.25


def context_lengths(values: Sequence[float]) -> dict[float, int]:
    """Each measured context mapped to the length of its group, the group's median rounded:
    sorted, a value joins the group whose smallest it exceeds by at most `SAME_CONTEXT`
    times."""
    import statistics

    def length(group: list[float]) -> int:
        return max(1, round(statistics.median(group)))

    groups: list[list[float]] = []
    for value in sorted(values):
        # Below a token or two the ratio says nothing: lengths that round alike are one.
        if groups and (value <= SAME_CONTEXT * groups[-1][0] or length([value]) == length(groups[-1])):
            groups[-1].append(value)
        else:
            groups.append([value])
    return {value: length(group) for group in groups for value in group}
