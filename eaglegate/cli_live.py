"""Measurement commands that run against a live server: sweep, calibrate, verify-live.

Thin typer layers over `eaglegate.app`'s `sweep`, `calibrate` and `verify_live`, which
check every input (one message for each bad one) and run `eaglegate.live`. `--json` prints
only JSON on stdout; progress and messages go to stderr.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from eaglegate import app
from eaglegate.cli_common import JsonOpt, err, out, print_json
from eaglegate.live import MAX_CONCURRENCY
from eaglegate.live import calibrate as cal
from eaglegate.reports import charts

PromptsOpt = Annotated[
    str | None,
    typer.Option("--prompts", help="A file with one prompt per line (text, or JSON with 'prompt').",
                 show_default="built-in set of 16"),
]
ApiOpt = Annotated[
    str,
    typer.Option(
        "--api",
        help="auto (from the URL), completions, chat, or generate (SGLang's /generate with "
        "input_ids, for a server started with --skip-tokenizer-init).",
    ),
]
ModelOpt = Annotated[
    str | None, typer.Option("--model", help="Model name to send.", show_default="first of /v1/models")
]
TimeoutOpt = Annotated[
    str, typer.Option("--timeout", help="Seconds one request may take in all (connect, wait and stream).",
                      metavar="FLOAT")
]


def _progress(enabled: bool) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        disable=not (enabled and err.is_terminal),
        transient=False,
    )


def _rich_sweep_progress(progress: Progress) -> Any:
    """The sweep's progress drawn with rich; the sweep (and its HTTP client) loads only when a
    sweep runs, not with every command."""
    from eaglegate.live.sweep import SweepProgress

    class RichSweepProgress(SweepProgress):
        def __init__(self) -> None:
            self.task: TaskID | None = None

        def level_started(self, concurrency: int, requests: int) -> None:
            self.task = progress.add_task(f"concurrency {concurrency:>4}", total=requests)

        def request_done(self) -> None:
            if self.task is not None:
                progress.advance(self.task)

        def level_done(self, record: dict[str, Any]) -> None:
            if self.task is not None:
                progress.update(
                    self.task,
                    description=f"concurrency {record['max_concurrency']:>4}  "
                    f"{record['output_throughput']:>9.1f} tok/s",
                )

    return RichSweepProgress()


def sweep(
    url: Annotated[str, typer.Option("--url", help="The server: host:port, base URL or full completions URL.")],
    concurrency: Annotated[
        str, typer.Option("--concurrency", "-c", help=f"Levels: 1,2,4,8 or 1-256 (powers of two), at most {MAX_CONCURRENCY}.")
    ] = "1-256",
    prompts: PromptsOpt = None,
    max_tokens: Annotated[str, typer.Option("--max-tokens", help="Tokens generated per request.", metavar="INTEGER")] = "256",
    output: Annotated[str, typer.Option("--output", "-o", help="JSONL file; one line is appended per level.")] = "sweep.jsonl",
    rounds: Annotated[str, typer.Option("--rounds", help="Requests per worker at each level.", metavar="INTEGER")] = "2",
    min_requests: Annotated[str, typer.Option("--min-requests", help="At least this many requests per level.", metavar="INTEGER")] = "8",
    ignore_eos: Annotated[bool, typer.Option("--ignore-eos/--stop-at-eos", help="Generate exactly --max-tokens per request (SGLang/vLLM extension).")] = True,
    tag: Annotated[str | None, typer.Option("--tag", help="A label stored in every line (e.g. 'spec').")] = None,
    api: ApiOpt = "auto",
    model: ModelOpt = None,
    timeout: TimeoutOpt = "300.0",
    as_json: JsonOpt = False,
) -> None:
    """Measure output tokens/s, TTFT and inter-token latency at each concurrency level.

    Greedy streaming requests against a running OpenAI-compatible server (SGLang).
    Run it once on a server without speculation and once with it, then `calibrate`.

    Example: eaglegate sweep --url localhost:30000 -c 1,2,4,8,16,32,64,128,256 -o spec.jsonl
    """
    number = app.cli_value
    request = app.SweepRequest(
        url, concurrency=concurrency, prompts=prompts, output=output, api=api, model=model,
        max_tokens=number(max_tokens), rounds=number(rounds), min_requests=number(min_requests),
        ignore_eos=ignore_eos, timeout=number(timeout), tag=tag,
    )
    with _progress(not as_json) as progress:
        swept = app.sweep(request, progress=_rich_sweep_progress(progress))
    endpoint, records = swept.endpoint, swept.records
    if as_json:
        print_json({"output": output, "levels": records})
        return
    table = Table(title=f"sweep of {endpoint.url}")
    for col in ("concurrency", "tok/s", "TTFT mean", "TTFT p99", "ITL mean", "ITL p50", "ITL p99"):
        table.add_column(col, justify="right")
    for r in records:
        table.add_row(
            str(r["max_concurrency"]), f"{r['output_throughput']:.1f}",
            f"{r['mean_ttft_ms']:.1f} ms", f"{r['p99_ttft_ms']:.1f} ms",
            f"{r['mean_itl_ms']:.2f} ms", f"{r['median_itl_ms']:.2f} ms", f"{r['p99_itl_ms']:.2f} ms",
        )
    out.print(table)
    err.print(f"appended {len(records)} level(s) to {output}")


def calibrate(
    baseline: Annotated[str | None, typer.Argument(help="Sweep without speculation (ours or bench_serving JSONL).")] = None,
    spec: Annotated[str | None, typer.Argument(help="Sweep with speculation.")] = None,
    png: Annotated[str | None, typer.Option("--png", help="Draw both curves to this PNG (needs eaglegate\\[plot]).")] = None,
    margin: Annotated[str, typer.Option("--margin", help="Gain below which speculation is not worth resuming (sets hysteresis).", metavar="FLOAT")] = "0.05",
    estimate: Annotated[bool, typer.Option("--estimate", help="No measurements: a roofline estimate (docs/calibrate.md).")] = False,
    params_b: Annotated[str | None, typer.Option("--params-b", help="Estimate: target parameters, billions.", metavar="FLOAT")] = None,
    draft_tokens: Annotated[str | None, typer.Option("--draft-tokens", help="Estimate: --speculative-num-draft-tokens.", metavar="INTEGER")] = None,
    accept_len: Annotated[str | None, typer.Option("--accept-len", help="Estimate: mean accepted tokens per step, bonus included.", metavar="FLOAT")] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", help=f"Estimate: {', '.join(sorted(cal.GPUS))}.")] = None,
    peak_tflops: Annotated[str | None, typer.Option("--peak-tflops", help="Estimate: dense BF16 TFLOP/s (overrides --gpu).", metavar="FLOAT")] = None,
    bandwidth_tbs: Annotated[str | None, typer.Option("--bandwidth-tbs", help="Estimate: memory bandwidth, TB/s (overrides --gpu).", metavar="FLOAT")] = None,
    draft_params_b: Annotated[str | None, typer.Option("--draft-params-b", help="Estimate: draft parameters, billions.", show_default="params-b / 20", metavar="FLOAT")] = None,
    num_steps: Annotated[str | None, typer.Option("--num-steps", help="Estimate: draft forwards per step.", show_default="draft-tokens - 1", metavar="INTEGER")] = None,
    context_len: Annotated[str, typer.Option("--context-len", help="Estimate: mean tokens in context per request.", metavar="INTEGER")] = "1024",
    kv_kib: Annotated[str | None, typer.Option("--kv-kib-per-token", help="Estimate: KV cache KiB per token.", show_default="128 * sqrt(params-b / 8)", metavar="FLOAT")] = None,
    flops_eff: Annotated[str, typer.Option("--flops-efficiency", help="Estimate: achieved fraction of peak FLOP/s.", metavar="FLOAT")] = "0.6",
    bw_eff: Annotated[str, typer.Option("--bandwidth-efficiency", help="Estimate: achieved fraction of bandwidth.", metavar="FLOAT")] = "0.8",
    overhead_ms: Annotated[str, typer.Option("--overhead-ms", help="Estimate: fixed time per forward (launch, sampling), ms.", metavar="FLOAT")] = "0.0",
    max_concurrency: Annotated[str, typer.Option("--max-concurrency", help="Estimate: highest concurrency to model.", metavar="INTEGER")] = "1024",
    depth: Annotated[list[str] | None, typer.Option("--depth", help="Depth gate: a sweep at static depth D (--speculative-num-steps D), as D=FILE, one file per depth (repeats: sweep again into it); with the baseline, picks the depth per concurrency and prompt length (bench_serving's total_input_tokens).", metavar="D=FILE")] = None,
    table_out: Annotated[str | None, typer.Option("--table-out", help="Depth gate: write the depth table here (for --speculative-depth-table).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Find where speculation stops paying and recommend the gate's threshold and hysteresis;
    or, with --depth, the depth gate's table: the best depth (0: plain) per batch band and
    context band, each with its lead and, over repeated sweeps, how many repeats agreed.

    Example: eaglegate calibrate baseline.jsonl spec.jsonl --png curves.png

    Example: eaglegate calibrate --estimate --params-b 8 --draft-tokens 4 --accept-len 2.5 --gpu h200

    Example: eaglegate calibrate plain.jsonl --depth 1=d1.jsonl --depth 3=d3.jsonl --table-out depth.json
    """
    number = app.cli_value
    if depth or table_out:
        _calibrate_depths(app.CalibrateRequest(baseline, spec, margin=number(margin), png=png, depths=depth,
                                               table_out=table_out, estimate=app.Estimate() if estimate else None),
                          as_json)
        return
    model = app.Estimate(
        params_b=number(params_b), draft_tokens=number(draft_tokens),  # type: ignore[arg-type]
        accept_len=number(accept_len), gpu=gpu, peak_tflops=number(peak_tflops),  # type: ignore[arg-type]
        bandwidth_tbs=number(bandwidth_tbs), draft_params_b=number(draft_params_b),  # type: ignore[arg-type]
        num_steps=number(num_steps), context_len=number(context_len),  # type: ignore[arg-type]
        kv_kib_per_token=number(kv_kib), flops_efficiency=number(flops_eff),  # type: ignore[arg-type]
        bandwidth_efficiency=number(bw_eff), overhead_ms=number(overhead_ms),  # type: ignore[arg-type]
        max_concurrency=number(max_concurrency),  # type: ignore[arg-type]
    ) if estimate else None
    calibrated = app.calibrate(app.CalibrateRequest(baseline, spec, margin=number(margin), estimate=model, png=png))
    result, estimate_json, rows = calibrated.result, calibrated.estimate, calibrated.rows
    if as_json:
        data = result.to_json()
        if estimate_json is not None:
            data["estimate"] = estimate_json
            data["rows"] = rows
        if png:
            data["png"] = png
        print_json(data)
        return
    for line in charts.render_text_chart(rows):
        out.print(line, highlight=False, markup=False)
    out.print()
    if result.status == "crosses":
        assert result.crossover is not None
        out.print(f"[bold]crossover[/bold]   concurrency {result.crossover:.1f}")
        out.print(f"[bold]threshold[/bold]   {result.threshold}  (speculation stops when the batch is "
                  f"larger than {result.threshold})")
        if result.resume_at:
            out.print(f"[bold]hysteresis[/bold]  {result.hysteresis}  (speculation resumes below "
                      f"{result.resume_at + 1})")
        if result.threshold_range:
            low, high = result.threshold_range
            out.print(f"[bold]range[/bold]       {low} to {high if high is not None else 'above the levels'}"
                      "  (the threshold under the spread of the levels measured more than once)")
    else:
        out.print(f"[bold]{result.status}[/bold]")
    for note in result.notes:
        out.print(f"note: {note}", highlight=False)
    if estimate:
        out.print("[dim]roofline estimate: see docs/calibrate.md for what it assumes[/dim]")
    if png:
        err.print(f"wrote {png}")


def _calibrate_depths(request: app.CalibrateRequest, as_json: bool) -> None:
    tabled = app.calibrate_depths(request)
    result = tabled.result
    if as_json:
        print_json({**result.to_json(), "table": tabled.table, "written": tabled.written})
        return
    for column in result.columns:
        depths = sorted(int(d) for d in column.rows[0]["throughput"])
        at = f", context {column.context} tokens" if column.context is not None else ""
        table = Table(title=f"output tok/s by depth (margin {result.margin:g}{at})")
        for col in ("concurrency", *(f"depth {d}" if d else "plain" for d in depths), "chosen", "lead", "repeats"):
            table.add_column(col, justify="right")
        for row in column.rows:
            agreed = f"{row['agree']}/{len(row['repeats'])}" if "repeats" in row else "-"
            table.add_row(f"{row['concurrency']:g}", *(f"{row['throughput'][str(d)]:.1f}" for d in depths),
                          str(row["depth"]), f"{row['lead']:+.1%}", agreed)
        out.print(table)
    out.print(_depth_grid(result))
    for j in range(len(result.columns)):
        rows = [depths[j] for depths in result.depths]
        bands = [f"batch <= {b}: depth {d}" for b, d in zip(result.batch, rows, strict=False)]
        bands.append(f"above {result.batch[-1]}: depth {rows[-1]}" if result.batch else f"every batch: depth {rows[-1]}")
        at = f" at {_band(result.context, j, 'context')}" if result.context else ""
        out.print(f"[bold]depth table[/bold]{at}  " + "; ".join(bands), highlight=False)
    out.print(json.dumps(tabled.table), highlight=False, markup=False)
    for note in result.notes:
        out.print(f"note: {note}", highlight=False)
    if tabled.written:
        err.print(f"wrote {tabled.written}; plan its launch: eaglegate plan --depth-table {tabled.written}")


def _band(bounds: list[int], i: int, name: str) -> str:
    """Band i of `bounds` (inclusive upper bounds, the last band open) in words."""
    if not bounds:
        return f"every {name}"
    return f"{name} <= {bounds[i]}" if i < len(bounds) else f"{name} > {bounds[-1]}"


def _depth_grid(result: cal.DepthBands) -> Table:
    """The table as the gate reads it: a row per batch band, a column per context band, each
    cell its depth, lead and, where repeated, how many repeats agreed."""
    grid = Table(title="depth per band, its lead over the next best, and the repeats that agreed")
    grid.add_column("batch", justify="right")
    for j, column in enumerate(result.columns):
        # The band and where it was measured on lines of their own: a narrow terminal wraps
        # a header inside its cell, and a band split over two lines reads wrongly.
        measured = f"\nmeasured {column.context}" if column.context is not None else ""
        grid.add_column(_band(result.context, j, "context") + measured, justify="right")
    for i, depths in enumerate(result.depths):
        cells = []
        for depth, lead, agreed in zip(depths, result.leads[i], result.agreement[i], strict=True):
            cells.append(f"{depth}  {lead:+.1%}" + (f"  {agreed[0]}/{agreed[1]}" if agreed else ""))
        grid.add_row(_band(result.batch, i, "batch"), *cells)
    return grid


def verify_live_cmd(
    url: Annotated[str, typer.Option("--url", help="The gated server.")],
    baseline_url: Annotated[str, typer.Option("--baseline-url", help="The same model served without speculation.")],
    low: Annotated[str, typer.Option("--low", help="Low concurrency (the gate speculates).", metavar="INTEGER")] = "1",
    high: Annotated[str, typer.Option("--high", help="High concurrency (the gate decodes plainly).", metavar="INTEGER")] = "128",
    tolerance: Annotated[str, typer.Option("--tolerance", help="Allowed throughput loss at --high, as a fraction.", metavar="FLOAT")] = "0.1",
    prompts: PromptsOpt = None,
    max_tokens: Annotated[str, typer.Option("--max-tokens", help="Tokens generated per request.", metavar="INTEGER")] = "128",
    rounds: Annotated[str, typer.Option("--rounds", help="Requests per worker at each level.", metavar="INTEGER")] = "2",
    logprobs: Annotated[bool, typer.Option("--logprobs/--no-logprobs", help="Ask for logprobs to compare token by token.")] = True,
    api: ApiOpt = "auto",
    model: ModelOpt = None,
    timeout: TimeoutOpt = "300.0",
    as_json: JsonOpt = False,
) -> None:
    """Check that the gated server gives the plain server's greedy tokens and throughput.

    Exit code 0 when every answer matches and throughput at --high is within --tolerance,
    1 otherwise.

    Example: eaglegate verify-live --url localhost:30000 --baseline-url localhost:30001 --high 128
    """
    number = app.cli_value
    request = app.VerifyLiveRequest(
        url, baseline_url, low=number(low), high=number(high), tolerance=number(tolerance), prompts=prompts,
        max_tokens=number(max_tokens), rounds=number(rounds), logprobs=logprobs, api=api, model=model,
        timeout=number(timeout),
    )
    with _progress(not as_json) as progress:
        state: dict[str, TaskID] = {}

        def phase(name: str, conc: int, n: int) -> None:
            state["task"] = progress.add_task(f"{name:<5} concurrency {conc:>4}", total=n)

        def step() -> None:
            progress.advance(state["task"])

        report = app.verify_live(request, on_phase=phase, on_request=step)
    if as_json:
        print_json(report.to_json())
    else:
        table = Table(title="verify-live")
        for col in ("concurrency", "requests", "gated tok/s", "plain tok/s", "ratio", "mismatches"):
            table.add_column(col, justify="right")
        for lv in report.levels:
            table.add_row(str(lv.concurrency), str(lv.requests), f"{lv.gated_throughput:.1f}",
                          f"{lv.plain_throughput:.1f}", f"{lv.ratio:.3f}", str(lv.mismatches))
        out.print(table)
        out.print(f"compared by {report.compared_by}")
        for m in report.mismatches[:5]:
            out.print(
                f"[red]mismatch[/red] at concurrency {m.concurrency}, request {m.request}: first "
                f"differing {m.unit} at position {m.position}: gated {m.gated!r} vs plain {m.plain!r}",
                highlight=False,
            )
            out.print(f"  prompt: {m.prompt!r}", highlight=False, markup=False)
            out.print(f"  gated:  {m.gated_text[:160]!r}", highlight=False, markup=False)
            out.print(f"  plain:  {m.plain_text[:160]!r}", highlight=False, markup=False)
        if len(report.mismatches) > 5:
            out.print(f"... and {len(report.mismatches) - 5} more mismatching answers")
        high_lv = report.levels[-1]
        if not report.throughput_ok:
            out.print(
                f"[red]throughput[/red] at concurrency {high_lv.concurrency}: gated is "
                f"{high_lv.ratio:.3f} of plain, below 1 - {request.tolerance}"
            )
        out.print("[green]PASS[/green]" if report.passed else "[red]FAIL[/red]")
    if not report.passed:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add `sweep`, `calibrate` and `verify-live` to the eaglegate app."""
    app.command("sweep")(sweep)
    app.command("calibrate")(calibrate)
    app.command("verify-live")(verify_live_cmd)
