"""Load for an SGLang server started with --skip-tokenizer-init: /generate with input_ids, greedy.

bench(url, C): output tok/s at concurrency C. equivalence_set(url): output ids of fixed
context-sensitive prompt sets (C=1, C=128, and requests that switch mode mid-way).
"""
import asyncio
import json
import random
import time

try:
    import aiohttp
except ImportError:  # the parsing helpers below are tested where aiohttp is not installed
    aiohttp = None

VOCAB = (100, 31000)


def prompts(n, length, seed):
    rng = random.Random(seed)
    return [[rng.randrange(*VOCAB) for _ in range(length)] for _ in range(n)]


async def _one(session, url, ids, max_new, temperature=0.0):
    params = {"max_new_tokens": max_new, "temperature": temperature, "ignore_eos": True}
    body = {"input_ids": ids, "sampling_params": params}
    t0 = time.perf_counter()
    async with session.post(url + "/generate", json=body) as r:
        txt = await r.text()
        if r.status != 200:
            return {"error": f"HTTP {r.status}: {txt[:300]}"}
    out = json.loads(txt)
    mi = out.get("meta_info", {})
    return {"ids": out.get("output_ids"), "latency": time.perf_counter() - t0,
            "accept": mi.get("spec_accept_length"), "verify_ct": mi.get("spec_verify_ct")}


async def _many(url, plist, conc, max_new, timeout=600, temperature=0.0):
    sem = asyncio.Semaphore(conc)
    # aiohttp's default connector opens at most 100 connections: C=128 and C=256 would
    # run at 100 (runs A to D did). The semaphore is the only limit.
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout)) as s:
        async def guarded(p):
            async with sem:
                try:
                    return await _one(s, url, p, max_new, temperature)
                except Exception as e:  # noqa: BLE001
                    return {"error": repr(e)}
        t0 = time.perf_counter()
        res = await asyncio.gather(*(guarded(p) for p in plist))
        return list(res), time.perf_counter() - t0


def warm(url, c=128, max_new=32, temperature=0.0):
    """One pass before measuring, at a batch above any threshold the benchmark uses, so
    one-time costs (kernel compilation, first replays) of every path fall outside the rows.
    Returns its wall time."""
    return round(asyncio.run(_many(url, prompts(c, 256, 5), c, max_new, temperature=temperature))[1], 2)


# Prompt and output tokens per request unless a call says otherwise; rows from before the
# call could say (--prompt-len, --output-len) record none and ran these.
PROMPT_LEN, OUTPUT_LEN = 256, 128


def row_lengths(row):
    """(prompt, output) tokens per request of a row."""
    return row.get("prompt_len", PROMPT_LEN), row.get("output_len", OUTPUT_LEN)


def bench(url, c, plen=PROMPT_LEN, max_new=OUTPUT_LEN, seed=1000, temperature=0.0, waves=3, min_requests=0):
    # Three waves per level: with two (runs up to G3) one slow step moved a repeat by 10 %.
    n = max(min_requests, 8 if c == 1 else max(16, waves * c))
    res, wall = asyncio.run(_many(url, prompts(n, plen, seed), c, max_new, temperature=temperature))
    ok = [r for r in res if "error" not in r]
    toks = sum(len(r["ids"] or []) for r in ok)
    acc = [r["accept"] for r in ok if r.get("accept") is not None]
    return {"C": c, "n": n, "prompt_len": plen, "output_len": max_new, "errors": n - len(ok),
            "first_error": next((r["error"] for r in res if "error" in r), None),
            "tok_s": round(toks / wall, 1), "mean_accept_len": round(sum(acc) / len(acc), 3) if acc else None}


def equivalence_set(url):
    """C1: 64 prompts one at a time. C128: 128 at once (the batch passes the threshold).
    switch: 8 long requests alone (speculating), 120 short ones join after 0.5 s (gated),
    the 8 finish alone (speculating again)."""
    def ids(rs):
        return [r.get("ids") if "error" not in r else {"error": r["error"]} for r in rs]
    out = {"C1": ids(asyncio.run(_many(url, prompts(64, 192, 7), 1, 64))[0]),
           "C128": ids(asyncio.run(_many(url, prompts(128, 192, 8), 128, 96))[0])}

    async def switch():
        longs = asyncio.create_task(_many(url, prompts(8, 192, 11), 8, 384))
        await asyncio.sleep(0.5)
        shorts, _ = await _many(url, prompts(120, 192, 12), 120, 48)
        return (await longs)[0], shorts
    longs, shorts = asyncio.run(switch())
    out["switch_long"], out["switch_short"] = ids(longs), ids(shorts)
    return out


def compare(ref, other):
    """Per set: identical count, and (index, first differing position) of each that differs."""
    report = {}
    for key, seqs in other.items():
        base = ref.get(key, [])
        diffs = []
        for i, (a, b) in enumerate(zip(base, seqs, strict=False)):
            if a != b:
                if isinstance(a, list) and isinstance(b, list):
                    pos = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
                else:
                    pos = None
                diffs.append([i, pos])
        report[key] = {"identical": len(base) - len(diffs), "total": len(base), "differ": diffs}
    return report


# ---- catch-up: acceptance after the gate turns speculation back on -----------------------
#
# A gated step runs the target alone, so the draft's KV cache never holds the tokens decoded
# while gated. `catchup` streams a few long requests (an event per decode step, with the
# tokens so far) beside many short ones: the batch starts above the gate's threshold and
# falls below it when the short ones finish. `window_accept` then gives a long request's
# tokens per step over a range of its output tokens, the same range on every server.
# run.py's per-step decode log (the batch's accept length every step) is the exact figure.

def parse_event(line, t):
    """One server-sent event of a streamed /generate: [t, completion_tokens, spec_verify_ct,
    spec_num_correct_drafts] (counts cumulative; the spec ones None where the server reports
    none), or None for a line that is no event."""
    if not line.startswith("data:"):
        return None
    body = line[5:].strip()
    if not body or body == "[DONE]":
        return None
    mi = json.loads(body).get("meta_info", {})
    correct = mi.get("spec_num_correct_drafts", mi.get("spec_accepted_drafts"))
    return [round(t, 4), mi.get("completion_tokens"), mi.get("spec_verify_ct"), correct]


async def _streamed(session, url, ids, max_new, t0):
    params = {"max_new_tokens": max_new, "temperature": 0.0, "ignore_eos": True}
    body = {"input_ids": ids, "sampling_params": params, "stream": True}
    events, last = [], None
    async with session.post(url + "/generate", json=body) as r:
        if r.status != 200:
            return {"error": f"HTTP {r.status}: {(await r.text())[:300]}"}
        async for raw in r.content:
            line = raw.decode(errors="replace").strip()
            ev = parse_event(line, time.perf_counter() - t0)
            if ev is not None:
                events.append(ev)
                last = line
    out = json.loads(last[5:]) if last else {}
    return {"ids": out.get("output_ids"), "events": events, "meta": out.get("meta_info", {}),
            "done_s": round(time.perf_counter() - t0, 4)}


def catchup(url, n_long=8, n_short=120, long_new=512, short_new=64, plen=256, seed=21, shorts=True):
    """n_long long requests (streamed) and, with `shorts`, n_short short ones, all sent at
    once. Returns the long ones' ids, events and final meta_info, and the time (from the
    start) at which the last short one finished."""
    async def go():
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as s:
            t0 = time.perf_counter()

            async def guarded(coro):
                try:
                    return await coro
                except Exception as e:  # noqa: BLE001
                    return {"error": repr(e)}
            longs = [guarded(_streamed(s, url, p, long_new, t0)) for p in prompts(n_long, plen, seed)]
            short = [guarded(_one(s, url, p, short_new)) for p in prompts(n_short, plen, seed + 1)] if shorts else []
            done = {}

            async def timed_shorts():
                res = await asyncio.gather(*short)
                done["t"] = round(time.perf_counter() - t0, 4)
                return res
            long_res, short_res = await asyncio.gather(asyncio.gather(*longs), timed_shorts())
            return long_res, short_res, done.get("t") if shorts else None, round(time.perf_counter() - t0, 3)
    long_res, short_res, t_done, wall = asyncio.run(go())
    return {"long": long_res, "shorts_done_s": t_done, "wall_s": wall,
            "short_errors": sum("error" in r for r in short_res),
            "first_error": next((r["error"] for r in [*long_res, *short_res] if "error" in r), None)}


def tokens_at(events, t):
    """completion_tokens of the first event at or after time t (the last one's if none)."""
    for ev in events:
        if ev[0] >= t:
            return ev[1]
    return events[-1][1] if events else None


def window_accept(events, lo, hi=None):
    """Output tokens per streamed event over output tokens lo..hi: between the first event
    with at least lo tokens and the first with at least hi (the last event when hi is None or
    beyond it). SGLang streams one event per decode step of the request (stream_interval 1),
    so this is the accept length per step, bonus included, as long as the client keeps up:
    where it lags, the tokenizer manager sends only the newest of the waiting outputs and the
    figure runs high. (The spec counters in meta_info come only with the last event.)"""
    evs = [ev for ev in events if ev[1] is not None]
    a = next((i for i, ev in enumerate(evs) if ev[1] >= lo), None)
    b = next((i for i, ev in enumerate(evs) if hi is not None and ev[1] >= hi), len(evs) - 1)
    if a is None or b <= a:
        return {"tokens": None, "steps": None, "accept_len": None}
    tokens = evs[b][1] - evs[a][1]
    return {"tokens": tokens, "steps": b - a, "accept_len": round(tokens / (b - a), 4)}
