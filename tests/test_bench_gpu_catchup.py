"""bench/gpu's catch-up measurement without a server: the streamed events' parsing, the
accept length over a window of output tokens, and run.py's summary of fake runs."""

from __future__ import annotations

import importlib
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "gpu"
sys.path.insert(0, str(BENCH))

import catchup  # noqa: E402
import loadgen  # noqa: E402


def sse(ct, verify=None, correct=None, ids=None):
    meta = {"id": "x", "completion_tokens": ct, "cached_tokens": 0}
    if verify:  # SGLang adds the spec fields once the request has a verify step
        meta.update(spec_verify_ct=verify, spec_num_correct_drafts=correct,
                    spec_accept_length=ct / verify, spec_accepted_drafts=correct)
    return "data: " + json.dumps({"output_ids": ids or [0] * ct, "meta_info": meta})


def test_parse_event_reads_sglang_stream_lines():
    assert loadgen.parse_event(sse(1), 0.5) == [0.5, 1, None, None]
    assert loadgen.parse_event(sse(9, 3, 6), 1.25) == [1.25, 9, 3, 6]
    assert loadgen.parse_event("data: [DONE]", 2.0) is None
    assert loadgen.parse_event("", 2.0) is None
    # the older alias only
    line = "data: " + json.dumps({"meta_info": {"completion_tokens": 5, "spec_verify_ct": 2,
                                                "spec_accepted_drafts": 3}})
    assert loadgen.parse_event(line, 0.0) == [0.0, 5, 2, 3]


def events_of(steps, t0=0.0, dt=0.01, start=(1, 0, 0)):
    """Events after each step: steps = tokens per step (1 = nothing accepted or a gated step)."""
    ct, v, c = start
    out = [[t0, ct, None, None]]
    for i, n in enumerate(steps):
        ct, v, c = ct + n, v + 1, c + n - 1
        out.append([round(t0 + dt * (i + 1), 4), ct, v, c])
    return out


def test_window_accept_counts_tokens_per_streamed_step():
    ev = events_of([1] * 10 + [4] * 10)  # 10 steps of 1 token, then 10 of 4
    assert ev[-1][1] == 51
    assert loadgen.window_accept(ev, 0, 11)["accept_len"] == 1.0
    assert loadgen.window_accept(ev, 11) == {"tokens": 40, "steps": 10, "accept_len": 4.0}
    assert loadgen.window_accept(ev, 11, 23)["accept_len"] == 4.0  # first event >= 23 is 27
    assert loadgen.window_accept(ev, 1000)["accept_len"] is None
    assert loadgen.window_accept([[0.0, 1, None, None]], 0)["accept_len"] is None
    # SGLang's stream: no spec counters before the last event; the steps are the events
    bare = [[e[0], e[1], None, None] for e in ev]
    assert loadgen.window_accept(bare, 11) == loadgen.window_accept(ev, 11)
    assert loadgen.tokens_at(ev, 0.105) == 15  # the first event at or after t (step 11)
    assert loadgen.tokens_at(ev, 99) == 51


GATE_LINE = ("[2026-12-02 00:45:53] Decode batch, #running-req: {n}, #token: 260, token usage: 0.00, "
             "accept len: {acc:.2f}, accept rate: 0.22, cuda graph: True, gen throughput (token/s): "
             "129.77, #queue-req: 0, gate(>16, <14): {state}, 6 spec / 35 gated")
# A gated step's line as SGLang 0.5.12.post1 printed it in run K1: no speculative fields.
GATED_LINE = ("[2026-12-02 16:34:52] Decode batch, #running-req: {n}, #token: 33792, token usage: 0.00, "
              "cuda graph: True, gen throughput (token/s): 62610.70, #queue-req: 0, "
              "gate(>16, <14): {state}, 6 spec / 3 gated")
EAGLE_LINE = ("[2026-12-02 00:43:40] Decode batch, #running-req: {n}, #token: 345, token usage: 0.00, "
              "accept len: {acc:.2f}, accept rate: 1.00, cuda graph: True, gen throughput (token/s): "
              "117.75, #queue-req: 0")


def test_decode_steps_and_the_steps_after_the_batch_fell():
    lines = ["[2026-12-02 00:45:46] batch gate: on (overlap worker), gate(>16, <14): spec, 0 spec / 0 gated"]
    lines += [GATED_LINE.format(n=128, state="off")] * 5 + [GATED_LINE.format(n=8, state="off")] * 7
    lines += [GATED_LINE.format(n=8, state="spec")]  # the last gated step decided the next: spec
    lines += [GATE_LINE.format(n=8, acc=a, state="spec") for a in [1, 1, 1, 1, 2, 4, 4, 4]]
    steps = catchup.decode_steps(lines)
    assert len(steps) == 21 and steps[0] == [128, None, "off"] and steps[-1] == [8, 4.0, "spec"]
    accepts, gated = catchup.steps_after_fall(steps, 8)
    assert gated == 8 and accepts == [1, 1, 1, 1, 2, 4, 4, 4]
    # an unpatched server: no gate on the line; a run that never exceeded n: every step
    eagle = catchup.decode_steps([EAGLE_LINE.format(n=8, acc=4)] * 3)
    assert eagle == [[8, 4.0, None]] * 3 and catchup.steps_after_fall(eagle, 8) == ([4.0] * 3, 0)


def test_catchup_summary_compares_the_same_tokens_on_every_run():
    ids = [list(range(60))]
    # gated, beside the short ones: 20 gated steps, then speculation that starts badly
    gated_mixed = {"pair": "trained", "shorts_done_s": 0.105, "wall_s": 1.0,
                   "decode_steps": [[128, None, "off"]] * 3 + [[8, None, "off"]] * 8
                   + [[8, a, "spec"] for a in (1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0)],
                   "long": [{"ids": ids[0], "events": events_of([1] * 20 + [1, 1, 1, 1, 1, 2, 2] + [4] * 8),
                             "meta": {"completion_tokens": 60, "spec_verify_ct": 33, "spec_accept_length": 1.8}}]}
    alone = {"pair": "trained", "shorts_done_s": None, "wall_s": 0.5,
             "decode_steps": [[8, 4.0, None]] * 15,
             "long": [{"ids": ids[0], "events": events_of([4] * 15),
                       "meta": {"completion_tokens": 61, "spec_verify_ct": 15, "spec_accept_length": 4.07}}]}
    runs = {"eagle-v2|alone": alone, "eagle-v2|mixed": alone, "gated-v2|alone": alone,
            "gated-v2|mixed": gated_mixed}
    s = catchup.catchup_summary(runs, n_long=8)
    assert s["reference"] == "gated-v2|mixed"
    # 12 tokens when the short ones were done (11 gated steps after the first token), + margin
    assert s["k0"] == [12 + catchup.RESUME_MARGIN]
    g, e = s["table"]["gated-v2|mixed"], s["table"]["eagle-v2|alone"]
    assert g["resume_after_gated_steps"] == 8 and g["spec_steps"] == 8
    assert g["steps_4"] == 1.0 and g["steps_8"] == 2.0 and e["steps_8"] == 4.0
    assert g["after_k0_32"] < e["after_k0_32"] == 4.0
    assert g["before_k0"] == 1.0  # the gated stretch: one token per step
    assert g["same_ids"] == 1
    row = s["per_request"]["gated-v2|mixed"][0]
    assert row["sglang_accept_len"] == 1.8 and row["k0"] == s["k0"][0]
    json.dumps(s)


class FakeGenerate(BaseHTTPRequestHandler):
    """A stand-in for SGLang's /generate (stdlib HTTP): plain JSON, or server-sent events
    with the cumulative meta_info after every step (3 tokens a step) for `stream`."""

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = body["sampling_params"]["max_new_tokens"]
        first = body["input_ids"][0]
        self.send_response(200)
        if not body.get("stream"):
            time.sleep(0.05)
            out = json.dumps({"output_ids": [first] * n, "meta_info": {"completion_tokens": n}})
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(out.encode())
            return
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write((sse(1, ids=[first]) + "\n\n").encode())
        ct, v = 1, 0
        while ct < n:
            ct, v = min(n, ct + 3), v + 1
            self.wfile.write((sse(ct, v, 2 * v, ids=[first] * ct) + "\n\n").encode())
            self.wfile.flush()
            time.sleep(0.001)
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture
def fake_url():
    pytest.importorskip("aiohttp")
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeGenerate)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_catchup_streams_the_long_requests_from_a_server(fake_url):
    out = loadgen.catchup(fake_url, n_long=2, n_short=5, long_new=40, short_new=8, plen=4, seed=3)
    assert out["first_error"] is None and out["short_errors"] == 0
    assert out["shorts_done_s"] is not None and out["shorts_done_s"] <= out["wall_s"] + 0.001
    for r, p in zip(out["long"], loadgen.prompts(2, 4, 3), strict=True):
        assert r["ids"] == [p[0]] * 40
        assert r["meta"]["completion_tokens"] == 40 and r["meta"]["spec_verify_ct"] == 13
        assert r["events"][0][1:] == [1, None, None] and r["events"][-1][1:] == [40, 13, 26]
        assert loadgen.window_accept(r["events"], 4)["accept_len"] == 3.0  # 3 tokens per event


def test_run_catchup_work_and_summary_end_to_end(fake_url, monkeypatch, tmp_path):
    """run.py's --catchup work on a server (the fake): both phases per server, the reset
    request and the flush before each (the fake has no /flush_cache: ignored), the summary."""
    harness = importlib.import_module("harness")
    catchup_cost = importlib.import_module("phases.catchup_cost")
    run = harness.Run.from_argv(["--servers", "eagle-v2:trained,gated-v2:trained", "--threshold", "16",
                                 "--catchup", "--out", str(tmp_path)], environ={"STAGE": str(tmp_path)})
    monkeypatch.setattr(catchup_cost, "CATCHUP", {**catchup.CATCHUP, "n_short": 16, "long_new": 64, "plen": 8})
    store = {"runs": {}}
    for server in ("eagle-v2", "gated-v2"):
        catchup_cost.catchup_work(run, store)(fake_url, {"server": server, "pair": "trained"})
    assert sorted(store["runs"]) == ["eagle-v2|alone", "eagle-v2|mixed", "gated-v2|alone", "gated-v2|mixed"]
    assert store["runs"]["gated-v2|alone"]["shorts_done_s"] is None
    s = catchup.catchup_summary(store["runs"])
    assert s["reference"] == "gated-v2|mixed" and len(s["k0"]) == 8
    for key, row in s["table"].items():
        assert row["same_ids"] == 8, key
        assert row["sglang_accept_len"] == round(64 / 21, 4), key
    json.dumps(s)  # rows_<tag>.json takes it
