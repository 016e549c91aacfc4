"""Drive a running server at each concurrency level and record throughput and latency.

Closed loop, as SGLang's `bench_serving --max-concurrency`: at level C, C worker threads
each send the next greedy request as soon as their previous one finishes, until the level's
requests are done. Each level's summary is appended to a JSONL file as soon as it is
measured, under `bench_serving`'s own field names (`max_concurrency`, `output_throughput`,
`mean_ttft_ms`, ...), so `calibrate` reads our files and `bench_serving`'s alike and a
server that dies mid-sweep leaves every finished level on disk.
"""

from __future__ import annotations

import json
import math
import queue
import reprlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from eaglegate import __version__
from eaglegate.errors import UsageError, UserError
from eaglegate.live import MAX_CONCURRENCY
from eaglegate.live.calibrate import is_rate
from eaglegate.live.client import (
    Endpoint,
    Generation,
    LiveRequestError,
    first_model,
    generate,
)

SOURCE_TAG = "eaglegate-sweep"


class SweepProgress:
    """Observer of a sweep; the default does nothing. Methods may be called from threads."""

    def level_started(self, concurrency: int, requests: int) -> None:
        """A level begins with `requests` requests."""

    def request_done(self) -> None:
        """One request of the current level finished."""

    def level_done(self, record: dict[str, Any]) -> None:
        """A level finished; `record` is what was appended to the JSONL file."""


@dataclass
class LevelRun:
    """Every generation of one level, in request order, and the wall time of the level."""

    concurrency: int
    generations: list[Generation]
    duration_s: float




def check_concurrency(name: str, level: int) -> int:
    """A level to drive: an integer from 1 to MAX_CONCURRENCY."""
    if isinstance(level, bool) or not isinstance(level, int) or not 1 <= level <= MAX_CONCURRENCY:
        raise UsageError(f"{name} must be an integer from 1 to {MAX_CONCURRENCY}, not {level!r}")
    return level


def parse_levels(text: str) -> list[int]:
    """Parse `1,2,4,8` (or `1-8` for powers of two from 1 to 8) into sorted unique levels."""
    levels: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        try:
            lo, hi = (int(x) for x in part.split("-", 1)) if "-" in part else (int(part), int(part))
        except ValueError:
            raise UsageError(f"bad concurrency list {text!r}: use e.g. 1,2,4,8 or 1-256") from None
        if not 1 <= lo <= hi <= MAX_CONCURRENCY:
            raise UsageError(f"bad concurrency list {text!r}: levels must be integers from 1 to "
                             f"{MAX_CONCURRENCY}, each range from low to high")
        while lo <= hi:
            levels.add(lo)
            lo *= 2
    if not levels:
        raise UsageError(f"bad concurrency list {text!r}: no level")
    return sorted(levels)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile with linear interpolation (numpy's default); 0.0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def run_level(
    endpoint: Endpoint,
    prompts: Sequence[str],
    concurrency: int,
    requests: int,
    *,
    model: str | None,
    max_tokens: int,
    logprobs: bool = False,
    ignore_eos: bool = False,
    timeout: float = 300.0,
    on_done: Callable[[], None] | None = None,
) -> LevelRun:
    """Send `requests` requests (prompt i is `prompts[i % len(prompts)]`) at most
    `concurrency` at a time. The first failure stops the level and is raised as a
    LiveRequestError; requests not yet started are not sent."""
    failed = threading.Event()
    results: list[Generation | None] = [None] * requests
    errors: list[BaseException] = []
    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    for i in range(requests):
        todo.put(i)

    def worker() -> None:
        while not failed.is_set():
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            try:
                results[i] = generate(
                    endpoint,
                    prompts[i % len(prompts)],
                    model=model,
                    max_tokens=max_tokens,
                    logprobs=logprobs,
                    ignore_eos=ignore_eos,
                    timeout=timeout,
                )
            except BaseException as exc:  # handed to the caller below
                errors.append(exc)
                failed.set()
                return
            if on_done is not None:
                on_done()

    # Daemon threads, joined with a timeout: Ctrl-C stays responsive and does not wait for
    # the streams in flight.
    workers = [
        threading.Thread(target=worker, daemon=True, name=f"eaglegate-load-{n}")
        for n in range(min(concurrency, requests))
    ]
    start = time.perf_counter()
    try:
        for t in workers:
            t.start()
        for t in workers:
            while t.is_alive():
                t.join(0.1)
    except BaseException:
        failed.set()
        raise
    duration = time.perf_counter() - start
    if errors:
        error = errors[0]
        if isinstance(error, UserError):
            raise error
        raise LiveRequestError(f"request failed: {type(error).__name__}: {error}")
    generations = [g for g in results if g is not None]
    if not any(g.output_tokens for g in generations):
        # Every count is checked (0 to max_tokens): none at all would be a throughput of 0.
        raise LiveRequestError(f"{endpoint.url} reported no generated tokens in {requests} requests")
    return LevelRun(concurrency, generations, duration)


def summarize(run: LevelRun) -> dict[str, Any]:
    """The level's metrics under bench_serving's field names (times in ms, rates per s)."""
    gens = run.generations
    ttfts = [g.ttft_s * 1000 for g in gens]
    itls = [x * 1000 for g in gens for x in g.itls_s]
    tpots = [
        (g.latency_s - g.ttft_s) * 1000 / (g.output_tokens - 1) for g in gens if g.output_tokens > 1
    ]
    e2e = [g.latency_s * 1000 for g in gens]
    total = sum(g.output_tokens for g in gens)
    dur = max(run.duration_s, 1e-9)
    # The prompts' length places the level in a context band of the depth table; a count
    # missing for any request would understate it, so then there is none.
    prompt_counts = [g.prompt_tokens for g in gens if g.prompt_tokens is not None]
    prompt = {"total_input_tokens": sum(prompt_counts)} if len(prompt_counts) == len(gens) else {}
    return {
        "max_concurrency": run.concurrency,
        "completed": len(gens),
        "duration": round(run.duration_s, 6),
        **prompt,
        "total_output_tokens": total,
        "request_throughput": len(gens) / dur,
        "output_throughput": total / dur,
        "mean_ttft_ms": sum(ttfts) / len(ttfts) if ttfts else 0.0,
        "median_ttft_ms": percentile(ttfts, 50),
        "p99_ttft_ms": percentile(ttfts, 99),
        "mean_itl_ms": sum(itls) / len(itls) if itls else 0.0,
        "median_itl_ms": percentile(itls, 50),
        "p99_itl_ms": percentile(itls, 99),
        "mean_tpot_ms": sum(tpots) / len(tpots) if tpots else 0.0,
        "mean_e2e_latency_ms": sum(e2e) / len(e2e) if e2e else 0.0,
    }


def requests_for(concurrency: int, rounds: int, min_requests: int) -> int:
    """Requests sent at one level: `rounds` per worker, and at least `min_requests`."""
    return max(concurrency * rounds, min_requests)


def run_sweep(
    endpoint: Endpoint,
    levels: Sequence[int],
    prompts: Sequence[str],
    output: str | Path,
    *,
    model: str | None = None,
    max_tokens: int = 256,
    rounds: int = 2,
    min_requests: int = 8,
    ignore_eos: bool = True,
    timeout: float = 300.0,
    warmup: bool = True,
    tag: str | None = None,
    progress: SweepProgress | None = None,
) -> list[dict[str, Any]]:
    """Measure every level in order, appending one JSON line per finished level.

    Returns the records. When the server fails, raises a one-line UserError that names
    the level, the cause and how many levels were kept in `output`.
    """
    if not prompts:
        raise UserError("no prompts to send")
    progress = progress or SweepProgress()
    path = Path(output)
    model = model or first_model(endpoint)
    if warmup:
        # One request outside the measurement: CUDA-graph capture, caches, JIT.
        generate(endpoint, prompts[0], model=model, max_tokens=min(max_tokens, 16), timeout=timeout)
    records: list[dict[str, Any]] = []
    for level in levels:
        n = requests_for(level, rounds, min_requests)
        progress.level_started(level, n)
        try:
            run = run_level(
                endpoint,
                prompts,
                level,
                n,
                model=model,
                max_tokens=max_tokens,
                ignore_eos=ignore_eos,
                timeout=timeout,
                on_done=progress.request_done,
            )
        except UserError as exc:
            kept = f"kept {len(records)} finished level(s) in {path}" if records else "no level finished"
            raise UserError(f"sweep stopped at concurrency {level}: {exc}; {kept}") from None
        record = {
            "source": SOURCE_TAG,
            "eaglegate_version": __version__,
            "tag": tag,
            "url": endpoint.url,
            "model": model,
            "max_tokens": max_tokens,
            "ignore_eos": ignore_eos,
            "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            **summarize(run),
        }
        try:
            with path.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(record) + "\n")
        except OSError as exc:
            raise UserError(f"cannot write results to {path}: {exc.strerror}") from None
        records.append(record)
        progress.level_done(record)
    return records


@dataclass(frozen=True)
class Point:
    """One measured level: concurrency and output tokens per second, and where it came from."""

    concurrency: int
    output_throughput: float
    source: str  # "eaglegate-sweep" or "bench_serving"
    mean_itl_ms: float | None = None
    mean_ttft_ms: float | None = None
    # The lowest and highest output_throughput among the lines of this level (a level measured
    # once: both are output_throughput). Their spread bounds where the crossover can lie.
    low: float | None = None
    high: float | None = None


@dataclass(frozen=True)
class Row:
    """One line of a sweep file: its level, its throughput, and the mean KV length its
    decode steps read (None when the line does not say how long its prompts were)."""

    line: int
    concurrency: int
    output_throughput: float
    context: float | None
    record: dict[str, Any]


def read_rows(path: str | Path) -> list[Row]:
    """Every line of a sweep file, ours or SGLang `bench_serving --output-file` (JSONL, or a
    JSON list), in file order, each checked. A bench_serving line run without
    `--max-concurrency` (request-rate mode) has no level and is refused.

    A line's context is the mean prompt plus half the mean output (`total_input_tokens`,
    `total_output_tokens` and `completed`, bench_serving's names): the mean KV length a
    decode step reads over the run, which is what the depth gate compares (docs/calibrate.md).
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot read results file {p}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:  # binary, UTF-16
        raise UserError(f"results file {p} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    lines: list[tuple[int, Any]] = []
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UserError(f"{p}: not valid JSON: {exc.msg} at line {exc.lineno}") from None
        except RecursionError:
            raise UserError(f"{p}: not a results file: nested too deep to read") from None
        lines = [(i + 1, obj) for i, obj in enumerate(data)]
    else:
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                lines.append((lineno, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise UserError(f"{p}:{lineno}: not valid JSON: {exc.msg}") from None
            except RecursionError:
                raise UserError(f"{p}:{lineno}: not a measurement: nested too deep to read") from None
    rows = []
    for lineno, obj in lines:
        if not isinstance(obj, dict):
            raise UserError(f"{p}:{lineno}: expected a JSON object per line")
        level = obj.get("max_concurrency")
        if level is None:
            raise UserError(
                f"{p}:{lineno}: no max_concurrency (run bench_serving with --max-concurrency)"
            )
        if isinstance(level, bool) or not isinstance(level, int) or level < 1:
            raise UserError(f"{p}:{lineno}: max_concurrency is {reprlib.repr(level)}, not an integer from 1 on")
        throughput: Any = obj.get("output_throughput")
        if not is_rate(throughput):
            raise UserError(
                f"{p}:{lineno}: output_throughput is {reprlib.repr(throughput)}, not a finite number above 0"
            )
        rows.append(Row(lineno, level, float(throughput), _context(obj, f"{p}:{lineno}"), obj))
    if not rows:
        raise UserError(f"{p}: no measurements")
    return rows


def _context(obj: dict[str, Any], where: str) -> float | None:
    """The KV length the gate reads per decode step, averaged over the sweep's steps, in
    tokens; None when the line has no prompt count. The gate reads the running requests' mean
    KV length each step, and a request of prompt P and output O runs O steps whose KV holds
    P + O/2 on average: per request lengths (bench_serving --output-details: input_lens,
    output_lens) weigh each by its O; from totals alone every request is taken to generate the
    mean output, which is exact where outputs have one length (--random-range-ratio 1, or
    `eaglegate sweep` without EOS)."""
    prompt = obj.get("total_input_tokens")
    if prompt is None:
        return None
    per_request = _request_lengths(obj, where)
    if per_request is not None:
        inputs, outputs = per_request
        return sum(o * (p + o / 2) for p, o in zip(inputs, outputs, strict=True)) / sum(outputs)
    values: dict[str, float] = {}
    for key in ("total_input_tokens", "total_output_tokens", "completed"):
        value = obj.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise UserError(f"{where}: {key} is {reprlib.repr(value)}, not a count of tokens or requests")
        values[key] = float(value)
    if not values["completed"]:
        raise UserError(f"{where}: completed is 0: no request finished, so no prompt length")
    return (values["total_input_tokens"] + values["total_output_tokens"] / 2) / values["completed"]


def _request_lengths(obj: dict[str, Any], where: str) -> tuple[list[float], list[float]] | None:
    """bench_serving's per-request prompt and output lengths where the line has both, else None."""
    if "input_lens" not in obj or "output_lens" not in obj:
        return None
    lists = []
    for key in ("input_lens", "output_lens"):
        value = obj[key]
        if not isinstance(value, list) or not all(
                not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in value):
            raise UserError(f"{where}: {key} is {reprlib.repr(value)}, not a list of token counts")
        lists.append([float(v) for v in value])
    inputs, outputs = lists
    if len(inputs) != len(outputs):
        raise UserError(f"{where}: input_lens has {len(inputs)} requests and output_lens {len(outputs)}")
    if not sum(outputs):
        raise UserError(f"{where}: output_lens are all 0: no request generated a token, so no decode step")
    return inputs, outputs


def points_of(rows: Sequence[Row]) -> list[Point]:
    """One point per level of `rows`. Levels measured more than once (a sweep run again into
    the same file) are averaged, and their lowest and highest throughput kept."""
    by_level: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        by_level.setdefault(row.concurrency, []).append(row.record)

    def mean(objs: list[dict[str, Any]], key: str) -> float | None:
        # Latencies only annotate a level: one that is not a finite number is left out.
        vals = [float(v) for o in objs if not isinstance(v := o.get(key), bool)
                and isinstance(v, (int, float)) and math.isfinite(v)]
        return sum(vals) / len(vals) if vals else None

    points = []
    for level in sorted(by_level):
        objs = by_level[level]
        source = SOURCE_TAG if objs[-1].get("source") == SOURCE_TAG else "bench_serving"
        points.append(
            Point(
                concurrency=level,
                output_throughput=sum(o["output_throughput"] for o in objs) / len(objs),
                source=source,
                mean_itl_ms=mean(objs, "mean_itl_ms"),
                mean_ttft_ms=mean(objs, "mean_ttft_ms"),
                low=min(float(o["output_throughput"]) for o in objs),
                high=max(float(o["output_throughput"]) for o in objs),
            )
        )
    return points
