"""sweep, calibrate and verify-live end to end against fake servers on 127.0.0.1."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eaglegate.cli import app
from eaglegate.errors import UserError
from eaglegate.live import calibrate as cal
from eaglegate.live.client import Generation, resolve_endpoint
from eaglegate.live.sweep import parse_levels, percentile, points_of, read_rows, run_sweep
from eaglegate.live.verify_live import first_difference
from eaglegate.reports import charts

sys.path.insert(0, str(Path(__file__).parent))
from fake_server import FakeServer, linear_step, tokens_for  # noqa: E402

pytestmark = pytest.mark.timeout(60)

runner = CliRunner()
PROMPTS = ["alpha prompt", "beta prompt", "gamma prompt", "delta prompt"]
# Planted curves (step time a + b * batch): plain n / (4 ms + 0.2 ms n); speculative,
# two tokens a step, 2n / (4.8 ms + 0.8 ms n). They cross at n = (4.8 - 8) / (0.4 - 0.8) = 8.
PLAIN = {"step_time": linear_step(0.004, 0.0002)}
SPEC = {"step_time": linear_step(0.0048, 0.0008), "tokens_per_step": 2}


def invoke(*args: str):
    result = runner.invoke(app, list(args))
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def test_sweep_writes_one_line_per_level(tmp_path: Path) -> None:
    out = tmp_path / "sweep.jsonl"
    prompts = tmp_path / "prompts.txt"
    prompts.write_text('first prompt\n\n{"prompt": "second prompt"}\n"third prompt"\n')
    with FakeServer(**PLAIN) as server:
        result = invoke("sweep", "--url", server.url, "-c", "1,2,4", "--prompts", str(prompts),
                        "--max-tokens", "12", "--min-requests", "4", "-o", str(out), "--json")
        assert server.max_batch == 4
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)  # nothing but JSON on stdout
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["max_concurrency"] for x in lines] == [1, 2, 4] == [x["max_concurrency"] for x in data["levels"]]
    for line, n in zip(lines, [4, 4, 8], strict=True):
        assert line["completed"] == n and line["total_output_tokens"] == 12 * n
        assert line["total_input_tokens"] == 2 * n  # two words a prompt: the server's usage report
        assert line["source"] == "eaglegate-sweep" and line["model"] == "fake-model"
        assert line["output_throughput"] > 0
        assert 0 < line["median_itl_ms"] <= line["p99_itl_ms"]
        assert 0 < line["mean_ttft_ms"] and line["median_ttft_ms"] <= line["p99_ttft_ms"]
        # Each step takes at least 4 ms + 0.2 ms per request (the fake server's clock); how
        # much longer depends on how busy the machine is, so there is no upper bound.
        assert line["mean_itl_ms"] > 3.5
    # Four requests share a step that one request takes alone: ~3.5x the tokens per second,
    # a margin no scheduling delay closes.
    tps = [x["output_throughput"] for x in lines]
    assert tps[0] < tps[2]


def test_sweep_over_chat_endpoint_counts_multi_token_chunks(tmp_path: Path) -> None:
    with FakeServer(step_time=linear_step(0.001, 0), tokens_per_step=3) as server:
        records = run_sweep(resolve_endpoint(server.url, "chat"), [2], PROMPTS,
                            tmp_path / "r.jsonl", max_tokens=9, min_requests=4)
    (record,) = records
    assert record["total_output_tokens"] == 4 * 9  # from usage, not from 3 chunks each
    assert record["url"].endswith("/v1/chat/completions")


def _sweep_pair(tmp_path: Path, levels: list[int]) -> tuple[Path, Path]:
    paths = []
    for name, kwargs in (("baseline", PLAIN), ("spec", SPEC)):
        path = tmp_path / f"{name}.jsonl"
        with FakeServer(**kwargs) as server:  # type: ignore[arg-type]
            run_sweep(resolve_endpoint(server.url), levels, PROMPTS, path, max_tokens=16,
                      rounds=2, min_requests=4)
        paths.append(path)
    return paths[0], paths[1]


def _planted_sweep(path: Path, fixed_us: int, per_request_us: int, tokens_per_step: int,
                   levels: list[int]) -> Path:
    """A sweep file as `sweep` writes it, whose throughput is exactly the planted step-time
    model's (k * n / (a + b * n)): measured on a fake server it would depend on how busy
    the machine is."""
    lines = [json.dumps({"max_concurrency": n, "source": "eaglegate-sweep",
                         "output_throughput": tokens_per_step * n * 1e6 / (fixed_us + per_request_us * n)})
             for n in levels]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_calibrate_finds_the_planted_crossover(tmp_path: Path) -> None:
    # PLAIN and SPEC above, in microseconds: they cross at n = 8, a measured level.
    levels = [1, 2, 4, 6, 8, 12, 16]
    base = _planted_sweep(tmp_path / "baseline.jsonl", 4000, 200, 1, levels)
    spec = _planted_sweep(tmp_path / "spec.jsonl", 4800, 800, 2, levels)
    png = tmp_path / "curves.png"
    result = invoke("calibrate", str(base), str(spec), "--png", str(png), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["status"] == "crosses"
    assert data["crossover"] == pytest.approx(8)
    # The gate speculates up to its threshold: 7, the last batch size below the crossover.
    assert data["threshold"] == 7
    # Gain at n = 4 is 20 %, at n = 6 8.3 %: speculation still gains the 5 % margin at 6.
    assert data["resume_at"] == 6 and data["hysteresis"] == 1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = invoke("calibrate", str(base), str(spec))
    assert "threshold" in text.stdout and "spec/base" in text.stdout and "█" in text.stdout
    assert "speculation stops when the batch is larger than 7" in text.stdout
    assert "speculation resumes below 7" in text.stdout


def test_calibrate_reads_what_sweep_wrote(tmp_path: Path) -> None:
    """The measured path end to end; the curves' values depend on the machine's load, so
    only what does not is asserted."""
    base, spec = _sweep_pair(tmp_path, [1, 4, 16])
    result = invoke("calibrate", str(base), str(spec), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["status"] in ("crosses", "spec-never-wins", "spec-always-wins")
    assert [row["concurrency"] for row in data["rows"]] == [1, 4, 16]


def test_sweep_keeps_partial_results_when_the_server_dies(tmp_path: Path) -> None:
    out = tmp_path / "partial.jsonl"
    # Warm-up 1 + level 1 (8) + level 2 (8) = 17 requests; the server dies at request 21.
    with FakeServer(step_time=linear_step(0.001, 0), die_after=20) as server:
        proc = subprocess.run(
            [sys.executable, "-m", "eaglegate", "sweep", "--url", server.url, "-c", "1,2,4,8",
             "--max-tokens", "8", "--min-requests", "8", "-o", str(out)],
            capture_output=True, text=True, timeout=30,
            env={**os.environ, "COLUMNS": "1000"},
        )
    assert proc.returncode != 0
    message = proc.stderr.strip().splitlines()
    assert len(message) == 1, proc.stderr
    assert message[0].startswith("error: sweep stopped at concurrency 4:")
    assert f"kept 2 finished level(s) in {out}" in message[0]
    assert "Traceback" not in proc.stderr
    assert [json.loads(x)["max_concurrency"] for x in out.read_text().splitlines()] == [1, 2]


def test_unreachable_server_is_one_line_error(tmp_path: Path) -> None:
    with FakeServer() as server:
        url = server.url  # closed once the block ends
    with pytest.raises(UserError, match=r"cannot reach http://127\.0\.0\.1:\d+: Connection"):
        run_sweep(resolve_endpoint(url), [1], PROMPTS, tmp_path / "x.jsonl")
    assert not (tmp_path / "x.jsonl").exists()


def test_verify_live_passes_on_identical_servers() -> None:
    with FakeServer(**SPEC) as gated, FakeServer(**PLAIN) as plain:
        result = invoke("verify-live", "--url", gated.url, "--baseline-url", plain.url,
                        "--low", "1", "--high", "4", "--max-tokens", "16", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["passed"] and data["tokens_match"] and data["throughput_ok"]
    assert data["compared_by"] == "token"
    assert [lv["concurrency"] for lv in data["levels"]] == [1, 4]
    assert data["levels"][1]["requests"] == 16  # max(16 built-in prompts, 2 rounds x 4)


def _alter_fibonacci(prompt: str, tokens: list[str]) -> list[str]:
    if "Fibonacci" in prompt:
        tokens = list(tokens)
        tokens[5] = " WRONG"
    return tokens


def test_verify_live_fails_showing_the_first_differing_token() -> None:
    with FakeServer(alter=_alter_fibonacci) as gated, FakeServer() as plain:
        result = invoke("verify-live", "--url", gated.url, "--baseline-url", plain.url,
                        "--low", "1", "--high", "2", "--max-tokens", "12")
        as_json = invoke("verify-live", "--url", gated.url, "--baseline-url", plain.url,
                         "--low", "1", "--high", "2", "--max-tokens", "12", "--json")
    assert result.exit_code == 1 and as_json.exit_code == 1
    assert "first differing token at position 5" in result.stdout
    assert "Fibonacci" in result.stdout and "FAIL" in result.stdout
    data = json.loads(as_json.stdout)
    assert not data["passed"] and not data["tokens_match"]
    (first, *_rest) = data["mismatches"]
    expected = tokens_for(first["prompt"], 12)[5]
    assert (first["unit"], first["position"], first["gated"], first["plain"]) == (
        "token", 5, " WRONG", expected)
    assert {m["concurrency"] for m in data["mismatches"]} == {1, 2}


def test_verify_live_fails_on_throughput_loss() -> None:
    # Steps 16 times longer on the gated server: on a loaded machine the plain server's 1 ms
    # steps stretch too (4 times longer failed this test at a load of 9 on 2 cores).
    with FakeServer(step_time=linear_step(0.016, 0)) as gated, \
            FakeServer(step_time=linear_step(0.001, 0)) as plain:
        result = invoke("verify-live", "--url", gated.url, "--baseline-url", plain.url,
                        "--low", "1", "--high", "4", "--max-tokens", "8", "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == 1
    assert data["tokens_match"] and not data["throughput_ok"]


# Field names checked against sglang/bench_serving.py of a real release below.
BENCH_LINE = {
    "backend": "sglang", "dataset_name": "random", "request_rate": float("inf"),
    "max_concurrency": 16, "duration": 30.1, "completed": 160, "total_output_tokens": 163840,
    "request_throughput": 5.3, "output_throughput": 5443.2, "mean_ttft_ms": 120.5,
    "median_ttft_ms": 110.0, "p99_ttft_ms": 300.1, "mean_itl_ms": 2.9, "median_itl_ms": 2.8,
    "p99_itl_ms": 7.0, "accept_length": 2.4,
}


def test_reads_bench_serving_result_files(tmp_path: Path, release_tree) -> None:
    bench = release_tree("0.5.9").root / "bench_serving.py"
    source = bench.read_text()
    for key in ("max_concurrency", "output_throughput", "mean_ttft_ms", "mean_itl_ms"):
        assert f'"{key}": ' in source, key
    path = tmp_path / "bench.jsonl"
    lines = [dict(BENCH_LINE, max_concurrency=c, output_throughput=t)
             for c, t in ((16, 5000.0), (1, 400.0), (16, 6000.0))]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    points = points_of(read_rows(path))
    assert [(p.concurrency, p.output_throughput, p.source) for p in points] == [
        (1, 400.0, "bench_serving"), (16, 5500.0, "bench_serving")]
    assert points[0].mean_itl_ms == 2.9
    as_list = tmp_path / "bench.json"
    as_list.write_text(json.dumps(lines))
    assert [p.concurrency for p in points_of(read_rows(as_list))] == [1, 16]
    bad = tmp_path / "rate.jsonl"
    bad.write_text(json.dumps(dict(BENCH_LINE, max_concurrency=None)) + "\n")
    with pytest.raises(UserError, match="rate.jsonl:1: no max_concurrency"):
        points_of(read_rows(bad))


def test_calibrate_rule_on_exact_curves() -> None:
    base = cal.Curve.of("b", [(1, 100), (2, 200), (4, 400), (8, 800), (16, 1600)])
    # Ratio 1.4, 1.2, 1.1, 0.9, 0.5: crosses halfway between 4 and 8 in log2, i.e. at 4*sqrt(2).
    spec = cal.Curve.of("s", [(1, 140), (2, 240), (4, 440), (8, 720), (16, 800)])
    result = cal.calibrate(base, spec, margin=0.05)
    assert result.status == "crosses"
    assert result.crossover == pytest.approx(4 * 2**0.5)
    assert result.threshold == 5  # 5.66: batch 5 still gains, batch 6 loses
    # Gain 10% at 4, -10% at 8: falls to 5% a quarter of the way in log2: 4 * 2**0.25 = 4.76.
    assert (result.resume_at, result.hysteresis) == (4, 1)
    assert not any("interpolated" in note for note in result.notes)  # levels a doubling apart
    # The same curves measured only at 1, 4 and 16: the crossing lies between 4 and 16.
    coarse = cal.calibrate(cal.Curve.of("b", [(1, 100), (4, 400), (16, 1600)]),
                           cal.Curve.of("s", [(1, 140), (4, 440), (16, 800)]))
    assert coarse.status == "crosses" and 4 < coarse.crossover < 16
    assert any("interpolated between concurrency 4 and 16" in note for note in coarse.notes)
    never = cal.calibrate(base, cal.Curve.of("s", [(1, 90), (16, 1000)]))
    assert (never.status, never.threshold) == ("spec-never-wins", 1)
    always = cal.calibrate(base, cal.Curve.of("s", [(1, 200), (16, 3200)]))
    assert (always.status, always.threshold) == ("spec-always-wins", None)
    with pytest.raises(UserError, match="share no concurrency range"):
        cal.calibrate(base, cal.Curve.of("s", [(32, 1), (64, 2)]))
    chart = charts.render_text_chart(result.rows)
    assert len(chart) == 1 + 2 * len(result.rows) and "0.50x" in chart[-1]


def test_roofline_estimate_is_sane() -> None:
    model = cal.Roofline(params_b=8, draft_tokens=4, accept_len=2.5, peak_tflops=989,
                         bandwidth_tbs=4.8)
    levels = list(range(1, 1025))
    plain = [model.plain_tps(b) for b in levels]
    ratio = [model.spec_tps(b) / model.plain_tps(b) for b in levels]
    assert all(b >= a for a, b in zip(plain, plain[1:], strict=False))
    assert all(b <= a + 1e-12 for a, b in zip(ratio, ratio[1:], strict=False))
    # Memory-bound at batch 1: 16 GB of weights at 0.8 * 4.8 TB/s, about 240 tokens/s.
    assert 200 < plain[0] < 280
    assert 1.5 < ratio[0] < model.accept_len
    result = cal.calibrate(*cal.estimate_curves(model))
    assert result.status == "crosses" and 16 < result.crossover < 1024
    assert ratio[int(result.crossover) - 2] > 1 > ratio[int(result.crossover) + 1]
    # A weaker draft (accept 1.5 tokens) crosses earlier; a longer context later.
    weaker = cal.calibrate(*cal.estimate_curves(
        cal.Roofline(params_b=8, draft_tokens=4, accept_len=1.5, peak_tflops=989, bandwidth_tbs=4.8)))
    assert weaker.crossover is not None and weaker.crossover < result.crossover
    longer = cal.Roofline(params_b=8, draft_tokens=4, accept_len=2.5, peak_tflops=989,
                          bandwidth_tbs=4.8, context_len=4096)
    assert longer.spec_tps(256) / longer.plain_tps(256) > ratio[255]
    with pytest.raises(UserError, match="accept-len"):
        cal.Roofline(params_b=8, draft_tokens=4, accept_len=5, peak_tflops=1, bandwidth_tbs=1)


def test_calibrate_estimate_command() -> None:
    result = invoke("calibrate", "--estimate", "--params-b", "8", "--draft-tokens", "4",
                    "--accept-len", "2.5", "--gpu", "h200", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["status"] == "crosses" and data["threshold"] > 1
    assert data["estimate"]["peak_tflops"] == 989 and data["estimate"]["num_steps"] == 3
    assert [r["concurrency"] for r in data["rows"]][:3] == [1, 2, 4]
    with pytest.raises(UserError, match="unknown GPU 'x100'"):
        invoke("calibrate", "--estimate", "--params-b", "8", "--draft-tokens", "4",
               "--accept-len", "2.5", "--gpu", "x100")
    with pytest.raises(UserError, match="needs --accept-len"):
        invoke("calibrate", "--estimate", "--params-b", "8", "--draft-tokens", "4")


def test_small_pieces() -> None:
    assert parse_levels("1-16") == [1, 2, 4, 8, 16]
    assert parse_levels("8, 1,2,2") == [1, 2, 8]
    with pytest.raises(UserError):
        parse_levels("0,1")
    with pytest.raises(UserError, match="from 1 to 8192"):
        parse_levels("0-8")  # used to double 0 for ever
    assert percentile([1, 2, 3, 4], 50) == 2.5 and percentile([], 99) == 0.0
    ep = resolve_endpoint("localhost:30000")
    assert ep.url == "http://localhost:30000/v1/completions" and ep.models_path == "/v1/models"
    chat = resolve_endpoint("https://h/v1/chat/completions")
    assert chat.chat and chat.port == 443 and chat.models_path == "/v1/models"
    a = Generation(text="ab cd", tokens=["ab", " cd"])
    assert first_difference(a, Generation(text="ab cd", tokens=["ab", " cd"])) is None
    assert first_difference(a, Generation(text="ab ce", tokens=["ab", " ce"])) == ("token", 1, " cd", " ce")
    assert first_difference(a, Generation(text="ab")) == ("character", 2, " ", "")


def test_png_without_matplotlib_is_a_clear_error(tmp_path: Path, monkeypatch) -> None:
    base = cal.Curve.of("b", [(1, 100), (8, 800)])
    spec = cal.Curve.of("s", [(1, 150), (8, 700)])
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(UserError, match=r"--png needs matplotlib: pip install 'eaglegate\[plot\]'"):
        charts.render_png(base, spec, cal.calibrate(base, spec), tmp_path / "x.png")


def test_sweep_loads_a_server_without_a_tokenizer_through_generate(tmp_path: Path) -> None:
    """SGLang started with --skip-tokenizer-init: /generate with input_ids, greedy."""
    out = tmp_path / "sweep.jsonl"
    with FakeServer(**PLAIN) as server:
        result = invoke("sweep", "--url", server.url, "--api", "generate", "-c", "1,4",
                        "--max-tokens", "10", "--min-requests", "4", "-o", str(out), "--json")
        assert server.max_batch == 4
    assert result.exit_code == 0, result.output
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["max_concurrency"] for x in lines] == [1, 4]
    for line, n in zip(lines, [4, 8], strict=True):
        assert line["completed"] == n and line["total_output_tokens"] == 10 * n
        assert line["url"].endswith("/generate") and line["output_throughput"] > 0


def test_generate_endpoint_and_chunks() -> None:
    from eaglegate.live import client

    endpoint = resolve_endpoint("localhost:30000", "generate")
    assert endpoint.native and endpoint.path == "/generate"
    assert resolve_endpoint("http://h:1/generate").native
    with pytest.raises(UserError, match="does not match --api chat"):
        resolve_endpoint("http://h:1/generate", "chat")
    body = client.request_body(endpoint, "a prompt", None, 7, logprobs=False, ignore_eos=True)
    assert body["input_ids"] == client.prompt_ids("a prompt") != client.prompt_ids("another")
    assert body["sampling_params"] == {"max_new_tokens": 7, "temperature": 0.0, "ignore_eos": True}
    # SGLang streams output_ids whole by default, as deltas with --incremental-streaming-output.
    whole, deltas = client.Generation(), client.Generation()
    for ids, n in (([5, 6], 2), ([5, 6, 7], 3)):
        assert client._absorb_native(whole, {"output_ids": ids, "meta_info": {"completion_tokens": n}})
    for ids, n in (([5, 6], 2), ([7], 3)):
        assert client._absorb_native(deltas, {"output_ids": ids, "meta_info": {"completion_tokens": n}})
    assert whole.token_ids == deltas.token_ids == [5, 6, 7] and whole.output_tokens == 3
    assert not client._absorb_native(whole, {"meta_info": {"completion_tokens": 3, "finish_reason": {"type": "length"}}})
    assert whole.finish_reason == "length"


# --- the same calibration for agents (`eaglegate tool`, MCP) --------------------------------


def test_calibrate_tool_answers_what_the_command_answers(tmp_path: Path) -> None:
    from eaglegate.agents.tools import call_tool

    levels = [1, 2, 4, 6, 8, 12, 16]
    base = _planted_sweep(tmp_path / "baseline.jsonl", 4000, 200, 1, levels)
    spec = _planted_sweep(tmp_path / "spec.jsonl", 4800, 800, 2, levels)
    command = json.loads(invoke("calibrate", str(base), str(spec), "--json").stdout)
    answer = call_tool("calibrate_threshold", {"baseline": str(base), "spec": str(spec)})
    assert answer["threshold"] == command["threshold"] == 7
    assert answer["crossover"] == pytest.approx(8) and answer["resume_at"] == 6
    assert answer["rows"] == command["rows"] and answer["notes"] == command["notes"]
    assert answer["estimate"] is None and "threshold 7" in answer["summary"]

    flags = ["--params-b", "8", "--draft-tokens", "4", "--accept-len", "2.5", "--gpu", "h200"]
    estimated = json.loads(invoke("calibrate", "--estimate", *flags, "--json").stdout)
    answer = call_tool("calibrate_threshold", {"estimate": True, "params_b": 8, "draft_tokens": 4,
                                               "accept_len": 2.5, "gpu": "h200"})
    assert answer["threshold"] == estimated["threshold"] and answer["estimate"] == estimated["estimate"]
    assert answer["rows"] == estimated["rows"]


@pytest.mark.parametrize(("arguments", "flags", "message"), [
    ({"margin": 1.5}, ["--margin", "1.5"], "--margin must be in [0, 1), got 1.5"),
    ({"estimate": True, "params_b": 8, "draft_tokens": 4}, ["--estimate", "--params-b", "8", "--draft-tokens", "4"],
     "--estimate needs --accept-len"),
    ({"estimate": True, "params_b": 8, "draft_tokens": 1, "accept_len": 1, "gpu": "h200"},
     ["--estimate", "--params-b", "8", "--draft-tokens", "1", "--accept-len", "1", "--gpu", "h200"],
     "--draft-tokens must be at least 2"),
])
def test_calibrate_tool_refuses_in_the_commands_words(tmp_path: Path, arguments, flags, message) -> None:
    from eaglegate.agents.tools import call_tool

    base = _planted_sweep(tmp_path / "b.jsonl", 4000, 200, 1, [1, 8, 16])
    files = [] if arguments.get("estimate") else [str(base), str(base)]
    with pytest.raises(UserError, match=re.escape(message)):
        invoke("calibrate", *files, *flags)
    if not arguments.get("estimate"):
        arguments = {**arguments, "baseline": str(base), "spec": str(base)}
    with pytest.raises(UserError, match=re.escape(message)):
        call_tool("calibrate_threshold", arguments)


@pytest.mark.parametrize(("arguments", "message"), [
    ({"version": "0.5.9"}, "calibrate_threshold takes no argument version"),
    ({"params_b": 8}, "params_b only shape an estimate"),
    ({"estimate": True, "params_b": "8"}, "--params-b must be a number, not '8'"),
    ({"estimate": True, "params_b": 8, "draft_tokens": 4.0}, "--draft-tokens must be an integer, not 4.0"),
    ({"estimate": "yes"}, "estimate must be true or false"),
])
def test_calibrate_tool_refuses_what_json_can_send(arguments, message) -> None:
    from eaglegate.agents.tools import call_tool

    with pytest.raises(UserError, match=re.escape(message)):
        call_tool("calibrate_threshold", arguments)


def test_calibrate_bounds_the_threshold_by_the_repeats_spread(tmp_path: Path) -> None:
    """A sweep run twice into one file: each level's mean sets the threshold, its lowest and
    highest values the range. Planted: the speculative server measured once 10 % slow and
    once 10 % fast. Plain n / (4 + 0.2 n) meets k * 2n / (4.8 + 0.8 n) at
    n = (8k - 4.8) / (0.8 - 0.4k): 8 for k = 1, 5.45 for 0.9, 11.1 for 1.1."""
    levels = list(range(1, 17))
    base = _planted_sweep(tmp_path / "baseline.jsonl", 4000, 200, 1, levels)
    once = _planted_sweep(tmp_path / "spec.jsonl", 4800, 800, 2, levels)
    data = json.loads(invoke("calibrate", str(base), str(once), "--json").stdout)
    assert data["threshold"] == 7 and data["threshold_range"] is None
    twice = tmp_path / "spec-twice.jsonl"
    lines = [json.loads(line) for line in once.read_text().splitlines()]
    twice.write_text("".join(json.dumps({**row, "output_throughput": row["output_throughput"] * k}) + "\n"
                             for k in (0.9, 1.1) for row in lines))
    data = json.loads(invoke("calibrate", str(base), str(twice), "--json").stdout)
    assert data["crossover"] == pytest.approx(8) and data["threshold"] == 7
    assert data["threshold_range"] == [5, 11]
    assert any("anywhere from 5 to 11" in note for note in data["notes"])
    text = invoke("calibrate", str(base), str(twice)).stdout
    assert "range       5 to 11" in text
