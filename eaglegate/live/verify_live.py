"""Check a gated server against a plain one: same greedy tokens, no throughput loss.

The same prompts go to both servers at a low concurrency (the gate speculates) and a high
one (the gate decodes plainly); every answer must match token for token, and the gated
server's throughput at high concurrency must be within `tolerance` of the plain server's.
The servers are driven one after the other, never at the same time, so they may share a
GPU box without disturbing each other's timing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from eaglegate.live.client import Endpoint, Generation, first_model, generate
from eaglegate.live.sweep import LevelRun, check_concurrency, run_level, summarize


@dataclass
class Mismatch:
    """The first difference between the two answers to one request."""

    concurrency: int
    request: int
    prompt: str
    unit: str  # "token id", "token" or "character": what `position` counts
    position: int
    gated: str  # the differing item on each side ("" when that answer ended first)
    plain: str
    gated_text: str
    plain_text: str


@dataclass
class LevelCheck:
    concurrency: int
    requests: int
    gated_throughput: float
    plain_throughput: float
    mismatches: int

    @property
    def ratio(self) -> float:
        return self.gated_throughput / self.plain_throughput if self.plain_throughput else 0.0


@dataclass
class VerifyReport:
    """The verdict and its evidence; `passed` is what the exit code reports."""

    gated_url: str
    plain_url: str
    tolerance: float
    levels: list[LevelCheck]
    mismatches: list[Mismatch] = field(default_factory=list)
    compared_by: str = "character"

    @property
    def tokens_match(self) -> bool:
        return not self.mismatches

    @property
    def throughput_ok(self) -> bool:
        high = self.levels[-1]
        return high.gated_throughput >= (1 - self.tolerance) * high.plain_throughput

    @property
    def passed(self) -> bool:
        return self.tokens_match and self.throughput_ok

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "tokens_match": self.tokens_match,
            "throughput_ok": self.throughput_ok,
            "tolerance": self.tolerance,
            "gated_url": self.gated_url,
            "plain_url": self.plain_url,
            "compared_by": self.compared_by,
            "levels": [{**asdict(lv), "ratio": lv.ratio} for lv in self.levels],
            "mismatches": [asdict(m) for m in self.mismatches],
        }


def first_difference(gated: Generation, plain: Generation) -> tuple[str, int, str, str] | None:
    """(unit, position, gated item, plain item) of the first difference, or None if equal.

    Token ids are compared when both servers returned them, else token strings from
    logprobs, and the text in every case (a difference only in text is reported by
    character).
    """
    seqs: list[tuple[str, Sequence[Any], Sequence[Any]]] = []
    if gated.token_ids and plain.token_ids:
        seqs.append(("token id", gated.token_ids, plain.token_ids))
    if gated.tokens and plain.tokens:
        seqs.append(("token", gated.tokens, plain.tokens))
    seqs.append(("character", gated.text, plain.text))
    for unit, a, b in seqs:
        for pos, (x, y) in enumerate(zip(a, b, strict=False)):
            if x != y:
                return unit, pos, str(x), str(y)
        if len(a) != len(b):
            pos = min(len(a), len(b))
            return (unit, pos, str(a[pos]) if pos < len(a) else "", str(b[pos]) if pos < len(b) else "")
    return None


def comparison_unit(runs: Sequence[LevelRun]) -> str:
    gens = [g for run in runs for g in run.generations]
    if gens and all(g.token_ids for g in gens):
        return "token id"
    if gens and all(g.tokens for g in gens):
        return "token"
    return "character"


def verify_live(
    gated: Endpoint,
    plain: Endpoint,
    prompts: Sequence[str],
    *,
    low: int = 1,
    high: int = 128,
    tolerance: float = 0.1,
    max_tokens: int = 128,
    rounds: int = 2,
    logprobs: bool = True,
    timeout: float = 300.0,
    model: str | None = None,
    on_phase: Callable[[str, int, int], None] | None = None,
    on_request: Callable[[], None] | None = None,
) -> VerifyReport:
    """Run the prompts at `low` and `high` concurrency on both servers and compare.

    Level C sends max(len(prompts), rounds * C) requests, prompt i % len(prompts) each.
    """
    check_concurrency("--low", low)
    check_concurrency("--high", high)
    gated_model = model or first_model(gated)
    plain_model = model or first_model(plain)
    for ep, m in ((gated, gated_model), (plain, plain_model)):
        # Warm-up outside the measurement: CUDA-graph capture, caches.
        generate(ep, prompts[0], model=m, max_tokens=min(max_tokens, 16), timeout=timeout)
    levels: list[LevelCheck] = []
    mismatches: list[Mismatch] = []
    runs: list[LevelRun] = []
    for conc in sorted({low, high}):
        n = max(len(prompts), rounds * conc)
        pair = []
        for name, ep, m in (("gated", gated, gated_model), ("plain", plain, plain_model)):
            if on_phase is not None:
                on_phase(name, conc, n)
            pair.append(
                run_level(
                    ep, prompts, conc, n, model=m, max_tokens=max_tokens,
                    logprobs=logprobs, timeout=timeout, on_done=on_request,
                )
            )
        g_run, p_run = pair
        runs.extend(pair)
        found = 0
        for i, (g, p) in enumerate(zip(g_run.generations, p_run.generations, strict=True)):
            diff = first_difference(g, p)
            if diff is not None:
                found += 1
                unit, pos, gi, pi = diff
                mismatches.append(
                    Mismatch(conc, i, prompts[i % len(prompts)], unit, pos, gi, pi, g.text, p.text)
                )
        levels.append(
            LevelCheck(
                conc, n, summarize(g_run)["output_throughput"],
                summarize(p_run)["output_throughput"], found,
            )
        )
    return VerifyReport(
        gated.url, plain.url, tolerance, levels, mismatches, comparison_unit(runs)
    )
