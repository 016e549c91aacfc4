"""Throughput: each server loaded at each level (an untimed pass, then the timed repeats:
one row each), one server at a time or all side by side with their repeats interleaved; and
calibrate's threshold, or a depth-gated server's depth table, from the rows measured before
the gating server (this call's, and an earlier call's given with --rows-from)."""
import json
import os
import statistics

import loadgen
import machine
import servers

from phases import equivalence, profile

# Sampling temperature per pair: the `real` and `narrow` pairs' acceptance comes from the
# target sampling token 0 with a probability below one (weights.py calibrates it); the others
# are greedy.
TEMPERATURE = {"real": 1.0, "narrow": 1.0}
PAIRS = ("accept", "real", "narrow")
# The pair whose greedy outputs are compared (phases/equivalence.py); side by side, its
# servers run the equivalence set instead of the levels.
EQUIVALENCE_PAIR = "context"


def untimed_pass(run, url, res, c):
    """An untimed repeat at this concurrency, as long as a timed one: in run G3 the first
    repeat at a new level often ran slow (C=8: about half speed on eagle-v2 and gated-v2),
    and in G9 a short pass (8 tokens) still left eagle-v2's repeats at C=8 and 32 rising
    (2203, 2571, 3118; 6502, 7198, 7851). Its figure is kept (`untimed`) to show what it
    absorbed."""
    untimed = loadgen.bench(url, c, plen=run.prompt_len, max_new=run.output_len, seed=900 + c,
                            temperature=TEMPERATURE.get(res["pair"], 0.0), min_requests=run.min_requests)
    res.setdefault("untimed", {})[str(c)] = untimed["tok_s"]
    print(f"   {res['server']} C={c:>3} untimed tok/s={untimed['tok_s']:>9}", flush=True)
    if untimed["errors"] == untimed["n"]:
        # Every request refused (a length check, a crashed scheduler): its timed repeats would
        # measure nothing, so the server is done here, and the device time kept.
        res["failed"] = f"every request of the untimed pass at C={c} failed: {untimed['first_error']}"
        print(f"   {res['server']} failed: {res['failed']}", flush=True)
    return "failed" not in res


def timed_repeat(run, url, res, c, rep, rows):
    """Repeat `rep` at concurrency c: one row. Every server's repeat `rep` at c has the same
    prompts."""
    ticks = machine.cpu_ticks()
    row = loadgen.bench(url, c, plen=run.prompt_len, max_new=run.output_len, seed=1000 + 17 * rep + c,
                        temperature=TEMPERATURE.get(res["pair"], 0.0), min_requests=run.min_requests)
    cpu = machine.cpu_shares(ticks, machine.cpu_ticks())
    row.update(server=res["server"], repeat=rep, pair=res["pair"], gpu=machine.gpu_state(), cpu=cpu)
    rows.append(row)
    print(f"   {res['server']} C={c:>3} r{rep} tok/s={row['tok_s']:>9} errors={row['errors']} "
          f"accept={row['mean_accept_len']}", flush=True)


def throughput(run, rows):
    """The work of one server alone: every level, its profile where asked."""
    def work(url, res):
        for c in run.levels:
            if not untimed_pass(run, url, res, c):
                return
            for rep in range(run.repeats):
                if run.out_of_time():
                    res["cut_short"] = True
                    return
                timed_repeat(run, url, res, c, rep, rows)
            if res["server"] in run.profile and c in run.profile_levels:
                profile.profile(run, url, res, c, TEMPERATURE.get(res["pair"], 0.0))
    return work


# --side-by-side: every server of the call up at once on the one GPU, and at each level
# their timed repeats interleaved (repeat r of each server in turn, the order rotated by one
# each repeat). A machine whose speed drifts within a call then slows every server alike: in
# H8 one start of a server ran its C=1 decode at 620-1000 tok/s from one minute to the next,
# and one of three repeats at C=64 is often slow on every server of a call. Each server's KV
# pool is capped so that four fit beside each other (C=256 of this harness peaked near 98k
# tokens on plain-default in H9; with such a pool every server of H11 to H13 logged 0.5.16's
# running cap of 4096 and max_total_num_tokens=200000), and an idle server sleeps
# (--sleep-on-idle) rather than spin its scheduler on the cores the measured one uses.
SIDE_BY_SIDE_TOKENS = 200_000  # --kv-tokens's default
SIDE_BY_SIDE_MAX = 4
SIDE_BY_SIDE_PORT = 30100


def side_by_side_order(up, rep):
    """Repeat `rep`'s order: rotated by one each repeat, so that no server always runs
    right after the same one."""
    k = rep % len(up)
    return up[k:] + up[:k]


def side_by_side_dirs(names):
    """The folder each server runs from: one per tree (pristine, patched, each variant),
    copied once and shared by the servers of that tree. The first is `run-tree`, the folder
    of a sequential call (SGLang's JIT caches name the path: a warm machine's are reused)."""
    dirs, out = {}, []
    for name in names:
        key = (servers.tree_of(servers.server_kind(name)), servers.variant_module(name))
        dirs.setdefault(key, "run-tree" if not dirs else f"run-tree-{len(dirs) + 1}")
        out.append(dirs[key])
    return out


def side_by_side_refusal(run):
    """Why a call cannot run its servers side by side, or None."""
    items = run.servers
    if len(items) > SIDE_BY_SIDE_MAX:
        return f"at most {SIDE_BY_SIDE_MAX} servers fit beside each other, not {len(items)}"
    if len({name for name, _ in items}) < len(items):
        return "a server named twice (a second start is NAME@2)"
    if any(pair not in (*PAIRS, EQUIVALENCE_PAIR) for _, pair in items):
        return f"throughput pairs ({', '.join(PAIRS)}) or the {EQUIVALENCE_PAIR} pair only"
    if run.catchup or run.profile:
        return "not with --catchup or --profile (each measures one server alone)"
    if run.start_together and not run.plain_caps:
        return ("--start-together needs --plain-caps CAP,GRAPH_BS (the speculative servers start "
                "before plain-default logs its own)")
    for name, pair in items:  # side by side, only an earlier call's rows come before a server
        missing = uncalibrated_refs(run, servers.server_kind(name), pair, run.earlier)
        if missing:
            given = ("--depth-table FILE|JSON" if servers.KINDS[servers.server_kind(name)].plan == "depth"
                     else "a fixed --threshold")
            return (f"{given}, or --rows-from an earlier call's rows of {', '.join(missing)} (calibrate "
                    "reads rows measured before the gated server starts)")
    return kv_refusal(run) if any(pair in PAIRS for _, pair in items) else None


# What one server holds on the GPU besides its weights' files and KV pools (the CUDA context,
# its graphs, buffers, activations): D16c-a's four servers (three speculative) of 64,000-token
# pools used 70,223 MiB and D16f-a's three (two speculative) 52,005 MiB, so about 6,000 MiB a
# speculative server (its draft's graphs and buffers too) and 4,450 a plain one. With it the
# estimate of V27's three servers of 200,000-token pools is 80,143 MiB (they used 76,909).
SERVER_OVERHEAD_MIB = 6000
KV_DTYPE_BYTES = 2  # bfloat16, as weights.py writes the pairs


def server_mib(run, name, pair):
    """GPU memory (MiB) a server of the call needs beside the others: its target's weights (and
    its draft's, if it speculates) as the weights' folder holds them, a KV pool of
    --kv-tokens for each of them, and SERVER_OVERHEAD_MIB."""
    models = ["target"] + (["draft"] if servers.KINDS[servers.server_kind(name)].speculative else [])
    total = SERVER_OVERHEAD_MIB * 2**20
    for model in models:
        folder = f"{run.weights}/{pair}-{model}"
        with open(f"{folder}/config.json") as f:
            cfg = json.load(f)
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        kv_per_token = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * KV_DTYPE_BYTES
        total += sum(e.stat().st_size for e in os.scandir(folder) if e.name.endswith(".safetensors"))
        total += run.kv_tokens * kv_per_token
    return total // 2**20


def memory_refusal(run, gpu_total_mib):
    """Why the call's servers cannot all be up at once on a GPU of gpu_total_mib, or None:
    started together, the last ones would fail after a minute or two of device time."""
    if gpu_total_mib <= 0:  # nvidia-smi did not answer: SGLang's own check stays
        return None
    need = {f"{name}:{pair}": server_mib(run, name, pair) for name, pair in run.servers}
    if sum(need.values()) <= gpu_total_mib:
        return None
    return (f"{len(need)} servers need about {sum(need.values()):,} MiB of GPU memory with "
            f"{run.kv_tokens:,}-token KV pools ({', '.join(f'{k} {v:,}' for k, v in need.items())}), "
            f"more than this GPU's {gpu_total_mib:,}: fewer servers, a smaller --kv-tokens, or a larger GPU")


def kv_refusal(run):
    """Why the call's highest level cannot run all its requests at once on a side-by-side
    server, or None: SGLang would queue what overflows its KV pool (or its running cap) and
    measure a smaller batch."""
    c, per_request = max(run.levels), run.prompt_len + run.output_len
    if c * per_request > run.kv_tokens:
        return (f"C={c} needs {c * per_request:,} KV tokens a server ({c} x ({run.prompt_len} + "
                f"{run.output_len})), more than the {run.kv_tokens:,} each holds beside the others: "
                f"levels up to {run.kv_tokens // per_request} fit")
    if run.plain_caps and c > run.plain_caps[0]:
        return f"C={c} is above --plain-caps's running cap {run.plain_caps[0]}"
    return None


def needs_calibrate(run, kind, pair):
    """Whether a server of `kind` on `pair` takes its threshold or depth table from calibrate."""
    if pair not in PAIRS or kind not in servers.CALIBRATE_ON:
        return False
    if servers.KINDS[kind].plan == "depth":
        return run.depth_table is None
    return run.threshold == "calibrate"


def uncalibrated_refs(run, kind, pair, before):
    """The servers (`NAME:PAIR`) a server of `kind` is calibrated on that `before` (a set of
    (server, pair) measured before it) lacks; empty where it needs no calibrate. A depth table
    needs plain-default and one static depth or more (each measured one is a depth it may
    choose); a threshold, its plain and its speculative server."""
    if not needs_calibrate(run, kind, pair):
        return []
    plain, *specs = servers.CALIBRATE_ON[kind]
    missing = [f"{plain}:{pair}"] if (plain, pair) not in before else []
    if servers.KINDS[kind].plan != "depth":
        return missing + [f"{ref}:{pair}" for ref in specs if (ref, pair) not in before]
    if not any((ref, pair) in before for ref in specs):
        missing.append(f"one static depth or more ({', '.join(f'{ref}:{pair}' for ref in specs)})")
    return missing


def calibrated(run, rows, name, pair):
    """The threshold server `name` launches with: --threshold's, or calibrate's on the rows
    measured before it (`rows`, and --rows-from's), asked once per call and pair (answers in
    run.calibrations). A depth-gated server's table goes in run.depth_tables[pair]."""
    kind = servers.server_kind(name)
    fixed = None if run.threshold == "calibrate" else int(run.threshold)
    if not needs_calibrate(run, kind, pair):
        return fixed
    what = "depth" if servers.KINDS[kind].plan == "depth" else "threshold"
    if (what, pair) not in run.calibrations:  # adaptive and adaptive-skip share one
        run.calibrations[what, pair] = calibrate(run, run.earlier_rows + rows, kind, pair)
    if what == "depth":
        with open(depth_table_path(run, pair)) as f:  # the table as calibrate wrote it, for plan
            run.depth_tables[pair] = f.read().strip()
        return fixed
    return run.calibrations[what, pair]["threshold"]


def server_up(run, server):
    """What a side-by-side call keeps of a server once it is up: the GPU's memory in use with
    it beside the ones before it (one after another only), and the running cap and graph size
    it logged (eagle-v2 and adaptive take plain-default's; started together, they had
    --plain-caps, and a plain-default that logged others says so)."""
    caps = servers.logged_caps(servers.server_log(server))
    if run.start_together:
        given = dict(zip(("max_running_requests", "graph_max_bs"), run.plain_caps, strict=True))
        if server["name"] == "plain-default" and caps != given:
            server["res"]["caps_not_plain_caps"] = caps
            print(f"   plain-default logged {caps}, not --plain-caps {given}", flush=True)
        return
    server["res"]["gpu_used_mib"] = machine.gpu_mib("used")
    run.record_caps(server["name"], caps)


def side_by_side(run, rows, outputs):
    """Start every server of the call one after another, each beside the ones already up
    (--start-together: all launched at once, then each awaited; a server's `startup_s` is then
    when the wait saw it up: for all but the first, at least its real start-up); then the
    equivalence set on each context server in turn (into `outputs`), and per level an untimed
    pass on each throughput server, and the timed repeats interleaved. Each server's record is
    in run.launched."""
    # Every threshold and depth table before the first launch (from --rows-from's rows alone):
    # started together, the launches follow one another at once.
    refusal = memory_refusal(run, machine.gpu_mib("total"))
    if refusal:
        raise SystemExit(refusal)
    thresholds = [equivalence.EQUIV_THRESHOLD if pair == EQUIVALENCE_PAIR else calibrated(run, [], name, pair)
                  for name, pair in run.servers]
    for (name, pair), threshold in zip(run.servers, thresholds, strict=True):
        refusal = servers.threshold_refusal(name, threshold)
        if refusal:  # before any launch: started together, the others would start for nothing
            answer = run.calibrations.get(("threshold", pair), {})
            found = f"; calibrate gave none ({answer.get('status')}: {'; '.join(answer.get('notes', []))})" if answer else ""
            raise SystemExit(refusal + found)
    extra = ["--max-total-tokens", str(run.kv_tokens), "--sleep-on-idle"]
    started, copied = [], set()
    dirs = side_by_side_dirs([n for n, _ in run.servers])
    try:
        for i, ((name, pair), tree_dir) in enumerate(zip(run.servers, dirs, strict=True)):
            # a context server gates where the equivalence set switches (as one alone does)
            server = servers.launch(run, name, pair, thresholds[i], tree_dir=tree_dir, port=SIDE_BY_SIDE_PORT + i,
                                    extra_args=extra, copy_tree=tree_dir not in copied)
            copied.add(tree_dir)
            started.append(server)
            if not run.start_together:
                server_up(run, servers.wait_healthy(run, server))
        if run.start_together:  # every process launched above; now wait for all of them
            for server in started:
                server_up(run, servers.wait_healthy(run, server))
            used = machine.gpu_mib("used")  # the GPU's memory in use with all of them up
            for server in started:
                server["res"]["gpu_used_mib_all"] = used
        healthy = [s for s in started if s["res"]["healthy"]]
        for s in healthy:
            s["res"]["warm_s"] = loadgen.warm(s["url"])
        for s in healthy:
            if s["pair"] == EQUIVALENCE_PAIR:
                if run.out_of_time():
                    s["res"]["cut_short"] = True
                    continue
                equivalence.outputs_of(s["name"], outputs)(s["url"], s["res"])
        up = [s for s in healthy if s["pair"] in PAIRS]
        for c in run.levels if up else ():
            # all of them, then stop the call if one failed: side by side is the comparison
            if not all([untimed_pass(run, s["url"], s["res"], c) for s in up]):
                return
            for rep in range(run.repeats):
                for s in side_by_side_order(up, rep):
                    if run.out_of_time():
                        s["res"]["cut_short"] = True
                        return
                    timed_repeat(run, s["url"], s["res"], c, rep, rows)
    finally:
        servers.stop_all(run, started)


def sweep_file(rows, server, pair, path):
    """The medians per level and prompt length in bench_serving's JSONL form, which `eaglegate
    calibrate` reads: every level the run measured (--levels), so a finer grid reaches
    calibrate, with the token counts from which calibrate places a line in its context band."""
    with open(path, "w") as f:
        for plen, c in sorted({(loadgen.row_lengths(r)[0], r["C"]) for r in rows}):
            level = [r for r in rows if r["server"] == server and r["pair"] == pair and r["C"] == c
                     and loadgen.row_lengths(r)[0] == plen and not r["errors"]]
            if level:
                n, olen = level[0]["n"], loadgen.row_lengths(level[0])[1]
                f.write(json.dumps({"max_concurrency": c, "output_throughput": statistics.median(r["tok_s"] for r in level),
                                    "completed": n, "total_input_tokens": plen * n,
                                    "total_output_tokens": olen * n}) + "\n")


def measured(rows):
    """(server, pair) of every server with a repeat that failed no request: a repeat with errors
    counts for nothing (sweep_file, collect), so a server whose every repeat failed was not
    measured."""
    return {(r["server"], r["pair"]) for r in rows if not r.get("errors")}


def depth_table_path(run, pair):
    return f"{run.out}/depth_table_{pair}.json"


def calibrate(run, rows, server, pair):
    """`eaglegate calibrate` on the medians of the servers `server` is calibrated on: from the
    plain and the speculative sweep, its threshold; for a depth-gated server, from the plain
    sweep and one per static depth measured (`--depth D=FILE`), its depth table, written to
    depth_table_path. A server whose every repeat failed (D16n-a's depth 7 ran out of GPU
    memory beside three others) is left out, and the call says so."""
    ours = [r for r in rows if r["pair"] == pair]
    done = measured(ours)
    for ref in servers.CALIBRATE_ON[server]:
        failed = next((r for r in ours if r["server"] == ref), None)
        if failed and (ref, pair) not in done:
            first = f" (first: {failed['first_error'][:200]})" if failed.get("first_error") else ""
            print(f"== calibrate: {ref}:{pair} left out: every repeat failed its requests{first}", flush=True)
    missing = uncalibrated_refs(run, server, pair, done)
    if missing:
        raise SystemExit(f"calibrate needs {' and '.join(missing)} before {server}:{pair}")
    plain, *specs = [ref for ref in servers.CALIBRATE_ON[server] if (ref, pair) in done]
    depth = servers.KINDS[server].plan == "depth"
    scope = ""
    if not depth and len({loadgen.row_lengths(r)[0] for r in rows}) > 1:
        # A threshold is one number (calibrate refuses sweeps of two context lengths): this
        # call's prompt length alone, in files that say so beside the depth table's.
        rows = [r for r in rows if loadgen.row_lengths(r)[0] == run.prompt_len]
        scope = f"-{run.prompt_len}"

    def sweep(ref):
        return f"{run.out}/sweep_{ref}{scope}.jsonl"

    for ref in (plain, *specs):
        sweep_file(rows, ref, pair, sweep(ref))
    if depth:  # a context band per prompt length the rows ran
        depths = [arg for spec in specs for arg in ("--depth", f"{servers.KINDS[spec].steps}={sweep(spec)}")]
        args = [*depths, "--table-out", depth_table_path(run, pair)]
    else:
        args = [sweep(spec) for spec in specs]
    answer = servers.eg(run, "calibrate", sweep(plain), *args, "--json")
    print("== calibrate:", json.dumps(answer)[:600], flush=True)
    return answer
