"""--catchup: the acceptance of requests whose draft KV lacks the tokens decoded while gated,
against the same requests never gated (bench/gpu/README.md, "The catch-up cost"); catchup.py
reads what this records."""
import time

import loadgen
import servers
from catchup import CATCHUP, decode_steps


def catchup_work(run, store):
    """Per server: the long requests beside the short ones, then alone (never gated: 8 is
    below any threshold used here). Mixed first: after a flush the KV allocator hands out the
    same slots again, and an alone run before it would have left, in the draft's pool, valid
    KV of the same tokens at the same positions, where the mixed run's gated steps write none
    (the alone run after it writes all its draft KV itself). Before each, one request of 24
    tokens alone: the gate keeps its state between loads and the warm pass (C=128) left it
    off; without this the alone run's prefill would run without the draft and its first 8
    steps gated. Then the radix cache is flushed, so that no run reuses another's prefix KV.
    The server's decode log lines of each run are kept per step."""
    def work(url, res):
        for phase, shorts in (("mixed", True), ("alone", False)):
            loadgen.warm(url, c=1, max_new=24)  # 23 decode steps at batch 1: speculation back on
            servers.get(url + "/flush_cache", timeout=30)
            time.sleep(1)
            mark = len(servers.log_lines(run, res["server"], res["pair"]))
            try:
                measured = loadgen.catchup(url, shorts=shorts, **CATCHUP)
            except Exception as e:  # noqa: BLE001 - the other runs' rows still come back
                print(f"   {res['server']} {phase}: failed: {e!r}", flush=True)
                res[f"catchup_{phase}_error"] = repr(e)
                continue
            time.sleep(1)  # the last steps' log lines
            measured["decode_steps"] = decode_steps(servers.log_lines(run, res["server"], res["pair"])[mark:])
            store["runs"][f"{res['server']}|{phase}"] = {"pair": res["pair"], **measured}
            acc = [r.get("meta", {}).get("spec_accept_length") for r in measured["long"] if "error" not in r]
            print(f"   {res['server']} {phase}: wall {measured['wall_s']} s, shorts done at "
                  f"{measured['shorts_done_s']} s, errors {measured['first_error']}, long accept (SGLang's) "
                  f"{[round(x, 2) if x else x for x in acc]}, {len(measured['decode_steps'])} decode lines",
                  flush=True)
    return work
