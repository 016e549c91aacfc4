"""Where a decode step's time goes, from a torch profiler trace of an SGLang server.

    python3 bench/gpu/trace_digest.py [--top N] TRACE.json.gz [TRACE ...]

SGLang writes the trace on `/start_profile` (run.py's --profile). For each trace this prints:
- steps: the scheduler's `run_batch` calls in the window, and the wall time per step;
- GPU: the time the device was busy (kernels, copies, the union over streams) per step, and
  so whether the step waits on the GPU or on the scheduler's CPU;
- CPU: the scheduler thread's Python functions by self time and by inclusive time per step,
  and the CUDA runtime calls that block the CPU (synchronize, blocking copies);
- the gate: in a patched server, the time per step inside the gate's module (where it
  speculates, the gate's cost).
With the overlap scheduler, a step whose GPU busy time is well below its wall time is
CPU-bound: its cost is the scheduler's Python, which the self-time table shows. A trace
without Python stacks (the timeline as served) gives the GPU's busy share, the time from
one graph launch to the next (a decode step's time, as the stack tracing does not slow it),
the time the CPU waited on the GPU per launch (near zero: the step is CPU-bound), the
kernels that take the most GPU time per launch, and the host's work per launch (torch ops and
CUDA runtime calls, their count and time).

    python3 bench/gpu/trace_digest.py --compare A.json.gz B.json.gz

sets two such traces side by side, op by op: where a CPU-bound step of B spends more host time
than A's, the ops it runs more often per launch.

    python3 bench/gpu/trace_digest.py --callers A.json.gz B.json.gz

sets two traces with Python stacks side by side by caller: each step's torch ops counted by
the function outside torch that called them, where A and B differ.
"""
import argparse
import collections
import gzip
import itertools
import json
import statistics

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
# The gate's module in a patched tree (eaglegate.patches.behaviour.GATE_PATH). Where the gate
# speculates, its share of a step is what the gate costs; a gated step runs the target's
# forward inside it.
GATE_FILE = "/speculative/batch_gate.py("
# cudaFree waits for the whole device before it returns (the caching allocator's emptying).
BLOCKING = ("Synchronize", "cudaMemcpy ", "cudaMemcpy(", "cudaFree(")


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    if not isinstance(trace, dict) or "traceEvents" not in trace:
        raise ValueError(f"{path}: not a torch profiler trace (no traceEvents)")
    return trace["traceEvents"]


def union_us(intervals):
    total, end = 0.0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def self_times(events):
    """Self and inclusive time per name of nested complete events of one thread."""
    own, incl = collections.Counter(), collections.Counter()
    stack = []  # (end, name, child time)
    for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
        while stack and e["ts"] >= stack[-1][0]:
            end, name, child, dur = stack.pop()
            own[name] += dur - child
            if stack:
                stack[-1][2] += dur
        stack.append([e["ts"] + e["dur"], e["name"], 0.0, e["dur"]])
    while stack:
        end, name, child, dur = stack.pop()
        own[name] += dur - child
        if stack:
            stack[-1][2] += dur
    for e in events:
        incl[e["name"]] += e["dur"]
    return own, incl


def launch_intervals(launches):
    """The time from one graph launch to the next: with one decode graph a step, its median is
    a decode step's time as served, which the few longer steps (a prefill's) do not move."""
    gaps = sorted(b - a for a, b in itertools.pairwise(launches))
    if not gaps:
        return ""
    def at(q):
        return gaps[min(len(gaps) - 1, int(q * len(gaps)))] / 1000
    return (f"graph launch to launch: median {statistics.median(gaps) / 1000:.3f} ms "
            f"(p25 {at(0.25):.3f}, p75 {at(0.75):.3f}, {len(gaps)} intervals)\n")


def blocking_calls(events, t0, t1):
    """The CUDA runtime calls in [t0, t1) that block the CPU until the GPU catches up."""
    return [e for e in events if e.get("cat") == "cuda_runtime" and t0 <= e["ts"] < t1
            and any(b in e["name"] + "(" for b in BLOCKING)]


def host_waits(events, t0, t1, launches):
    """The time the CPU spent blocked on the GPU (synchronize, blocking copies) per graph
    launch: under the overlap scheduler a step that waits on the GPU is GPU-bound, and one
    whose waits are near zero is bound by the scheduler's CPU."""
    waits = blocking_calls(events, t0, t1)
    if not launches:
        return ""
    by_name = collections.Counter()
    for e in waits:
        by_name[e["name"]] += e["dur"]
    names = "".join(f", {k} {v / launches / 1000:.3f}" for k, v in by_name.most_common(4))
    return (f"CPU blocked on the GPU: {sum(e['dur'] for e in waits) / launches / 1000:.3f} ms "
            f"per graph launch ({len(waits)} blocking calls{names})\n")


def kernel_times(events, launches, top=8):
    """GPU time per graph launch of the kernels that take the most, by name (cut to 70
    characters): two servers' profiles at one C then show which kernel a slower step spends
    its time in (the attention kernel's grows with how the KV slots lie, a GEMM's does not)."""
    if not launches:
        return ""
    times = collections.Counter()
    for e in events:
        if e.get("cat") == "kernel":
            times[e["name"][:70]] += e["dur"]
    return "".join(f"{v / launches / 1000:8.3f}  {k}\n" for k, v in times.most_common(top))


# The host's work a trace records without Python stacks: torch ops and CUDA runtime calls.
HOST_CATS = ("cpu_op", "cuda_runtime")


def _whole_steps(events, launches, cats):
    """The events of `cats` from the first graph launch to the last, and the number of whole
    steps between them (0 with fewer than two launches)."""
    if len(launches) < 2:
        return [], 0
    t0, t1 = launches[0], launches[-1]
    return [e for e in events if e.get("cat") in cats and t0 <= e["ts"] < t1], len(launches) - 1


def host_ops(events, launches):
    """Per op (category, name): how often the host ran it and its time (us), per graph launch,
    over the whole steps between the first launch and the last."""
    mine, n = _whole_steps(events, launches, HOST_CATS)
    count, time = collections.Counter(), collections.Counter()
    for e in mine:
        key = (e["cat"], e["name"])
        count[key] += 1
        time[key] += e["dur"]
    return {key: (count[key] / n, time[key] / n) for key in count}


def host_line(events, launches):
    """The host's work per graph launch: the torch ops called from Python (an op another op
    calls is part of its caller's time) and the CUDA runtime calls."""
    parts = []
    for cat, label in (("cpu_op", "torch ops"), ("cuda_runtime", "CUDA runtime calls")):
        mine, n = _whole_steps(events, launches, (cat,))
        if not n:
            return ""
        mine.sort(key=lambda e: (e["tid"], e["ts"], -e["dur"]))
        outer, end = [], {}
        for e in mine:
            if e["ts"] >= end.get(e["tid"], -1.0):
                outer.append(e)
                end[e["tid"]] = e["ts"] + e["dur"]
        parts.append(f"{len(outer) / n:.1f} {label} ({sum(e['dur'] for e in outer) / n / 1000:.3f} ms)")
    return "host per graph launch: " + ", ".join(parts) + "\n"


def graph_launches(events):
    return sorted(e["ts"] for e in events
                  if e.get("cat") == "cuda_runtime" and e["name"] == "cudaGraphLaunch")


def compare(path_a, path_b, top=25):
    """Two stack-less traces' host work per graph launch side by side: the ops B runs more
    often than A first (then by the time they add, then by name, so that ties keep one order)."""
    sides = []
    for path in (path_a, path_b):
        events = [e for e in load(path) if e.get("ph") == "X" and "dur" in e]
        launches = graph_launches(events)
        if len(launches) < 2:
            raise ValueError(f"{path}: fewer than two graph launches, no whole step to compare")
        step = statistics.median(b - a for a, b in itertools.pairwise(launches)) / 1000
        sides.append((host_ops(events, launches), f"{path.rsplit('/', 1)[-1]}: launch to launch "
                      f"{step:.3f} ms, " + host_line(events, launches)))
    (a, line_a), (b, line_b) = sides
    out = [f"A {line_a}B {line_b}per graph launch (an op's time includes the ops it calls): "
           "count A, count B, host us A, host us B, op"]
    none = (0.0, 0.0)
    keys = sorted(set(a) | set(b), key=lambda k: (-(b.get(k, none)[0] - a.get(k, none)[0]),
                                                   -(b.get(k, none)[1] - a.get(k, none)[1]), k))
    for key in keys[:top]:
        (na, ta), (nb, tb) = a.get(key, none), b.get(key, none)
        out.append(f"{na:6.2f} {nb:6.2f} {ta:8.1f} {tb:8.1f}  {key[1][:70]}")
    return "\n".join(out) + "\n"


def scheduler_window(steps):
    """The scheduler thread (the one that ran the most `run_batch` calls), the window from its
    first `run_batch` to its last, and the whole steps in it."""
    where = collections.Counter((e["pid"], e["tid"]) for e in steps).most_common(1)[0][0]
    t0, t1 = min(e["ts"] for e in steps), max(e["ts"] for e in steps)
    return where, t0, t1, sum(1 for e in steps if e["ts"] < t1)


def _torch_internal(name):
    # a C function's own event, or torch's Python: the op's caller is further out
    return name.startswith("<built-in") or "torch/" in name.split("(", 1)[0]


def op_callers(path):
    """A trace with Python stacks: per step of the scheduler thread, each torch op called from
    outside torch (an op another op calls is part of its caller's time) by the innermost
    Python function outside torch that called it: {(caller, op): (count, host us)}. Counts are
    what two servers' steps are compared on: tracing Python slows every call, so times are
    only a guide."""
    events = [e for e in load(path) if e.get("ph") == "X" and "dur" in e]
    steps = [e for e in events if e.get("cat") == "python_function" and e["name"].endswith(": run_batch")]
    if not steps:
        raise ValueError(f"{path}: no Python stacks (profiled without them): no caller to name")
    where, t0, t1, n = scheduler_window(steps)
    mine = sorted((e for e in events if (e["pid"], e["tid"]) == where and t0 <= e["ts"] < t1
                   and e.get("cat") in ("python_function", "cpu_op")), key=lambda e: (e["ts"], -e["dur"]))
    count, time = collections.Counter(), collections.Counter()
    stack = []
    for e in mine:
        while stack and e["ts"] >= stack[-1]["ts"] + stack[-1]["dur"]:
            stack.pop()
        if e["cat"] == "cpu_op" and not any(s["cat"] == "cpu_op" for s in stack):
            caller = next((short(s["name"]) for s in reversed(stack)
                           if s["cat"] == "python_function" and not _torch_internal(s["name"])), "?")
            count[caller, e["name"]] += 1
            time[caller, e["name"]] += e["dur"]
        stack.append(e)
    return {key: (count[key] / max(n, 1), time[key] / max(n, 1)) for key in count}


def compare_callers(path_a, path_b):
    """Two traces with Python stacks side by side: every (caller, op) one of them runs more
    often per step than the other, those B runs more often first."""
    a, b = op_callers(path_a), op_callers(path_b)
    none = (0.0, 0.0)
    differ = [k for k in set(a) | set(b) if round(a.get(k, none)[0], 2) != round(b.get(k, none)[0], 2)]
    keys = sorted(differ, key=lambda k: (-(b.get(k, none)[0] - a.get(k, none)[0]),
                                         -(b.get(k, none)[1] - a.get(k, none)[1]), k))
    out = [f"A {path_a.rsplit('/', 1)[-1]}, B {path_b.rsplit('/', 1)[-1]}: torch ops per step by the "
           "function outside torch that called them, where the counts differ: count A, count B, host us A, "
           "host us B, caller, op",
           f"{sum(v[0] for v in a.values()):6.2f} {sum(v[0] for v in b.values()):6.2f} "
           f"{sum(v[1] for v in a.values()):8.1f} {sum(v[1] for v in b.values()):8.1f}  (all)"]
    for key in keys:
        (na, ta), (nb, tb) = a.get(key, none), b.get(key, none)
        out.append(f"{na:6.2f} {nb:6.2f} {ta:8.1f} {tb:8.1f}  {key[0][:60]}  {key[1][:40]}")
    return "\n".join(out) + "\n"


def short(name):
    # "path/to/scheduler.py(1234): run_batch" -> "scheduler.py:run_batch"
    if "): " in name:
        where, func = name.split("): ", 1)
        return f"{where.rsplit('/', 1)[-1].split('(')[0]}:{func}"
    return name


def digest(path, top=22):
    events = [e for e in load(path) if e.get("ph") == "X" and "dur" in e]
    py = [e for e in events if e.get("cat") == "python_function"]
    steps = [e for e in py if e["name"].endswith(": run_batch")]
    if not steps:  # profiled without Python stacks: the GPU timeline alone
        gpu = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") in GPU_CATS]
        if not gpu:
            return f"# {path.rsplit('/', 1)[-1]}: no GPU events\n"
        t0, t1 = min(a for a, _ in gpu), max(b for _, b in gpu)
        launches = graph_launches(events)
        return (f"# {path.rsplit('/', 1)[-1]}\nno Python stacks: GPU busy {100 * union_us(gpu) / (t1 - t0):.0f} % "
                f"of {(t1 - t0) / 1000:.1f} ms, {len(gpu)} GPU events, {len(launches)} graph launches\n"
                + launch_intervals(launches) + host_waits(events, t0, t1, len(launches))
                + host_line(events, launches) + kernel_times(events, len(launches)))
    tid, t0, t1, n = scheduler_window(steps)
    gpu = [(e["ts"], e["ts"] + e["dur"]) for e in events
           if e.get("cat") in GPU_CATS and t0 <= e["ts"] < t1]
    busy = union_us(gpu)
    wall = (t1 - t0) / max(n, 1)
    out = [f"# {path.rsplit('/', 1)[-1]}",
           f"steps {n}, wall {wall / 1000:.3f} ms/step, GPU busy {busy / max(n, 1) / 1000:.3f} ms/step "
           f"({100 * busy / max(t1 - t0, 1):.0f} %), GPU events {len(gpu)}"]
    mine = [e for e in py if (e["pid"], e["tid"]) == tid and t0 <= e["ts"] < t1]
    own, incl = self_times(mine)
    out.append(f"## scheduler thread, self time per step (ms), top {top}")
    out += [f"{v / n / 1000:8.3f}  {short(k)}" for k, v in own.most_common(top)]
    out.append(f"## scheduler thread, inclusive time per step (ms), top {top}")
    out += [f"{v / n / 1000:8.3f}  {short(k)}" for k, v in incl.most_common(top)]
    # a patched server: the time inside the gate's calls (nested ones count once, as the union)
    gate = [(e["ts"], e["ts"] + e["dur"]) for e in mine if GATE_FILE in e["name"]]
    if gate:
        out.append(f"## the gate's module per step (ms): {union_us(gate) / n / 1000:.3f} "
                   "(a gated step's target forward included)")
    runtime = collections.Counter()
    for e in blocking_calls(events, t0, t1):
        runtime[e["name"]] += e["dur"]
    out.append("## blocking CUDA runtime calls per step (ms)")
    out += [f"{v / n / 1000:8.3f}  {k}" for k, v in runtime.most_common(8)]
    launches = sum(1 for e in events if e.get("cat") == "cuda_runtime" and t0 <= e["ts"] < t1
                   and "Launch" in e["name"])
    out.append(f"## kernel and graph launches per step: {launches / n:.1f}")
    return "\n".join(out) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description="Where a decode step's time goes, from torch "
                                     "profiler traces of an SGLang server.")
    parser.add_argument("traces", nargs="+", metavar="TRACE", help="a trace (.json or .json.gz)")
    parser.add_argument("--compare", action="store_true", help="set two traces side by side, op by op")
    parser.add_argument("--callers", action="store_true",
                        help="set two traces with Python stacks side by side, by the function that called each op")
    parser.add_argument("--top", type=int, default=22, help="rows of the self- and inclusive-time tables")
    args = parser.parse_args(argv)
    if args.compare and args.callers:
        parser.error("--compare or --callers, not both")
    if (args.compare or args.callers) and len(args.traces) != 2:
        parser.error(f"--{'compare' if args.compare else 'callers'} takes two traces")
    try:
        if args.compare:
            print(compare(*args.traces))
        elif args.callers:
            print(compare_callers(*args.traces))
        else:
            for path in args.traces:
                print(digest(path, top=args.top))
    except (OSError, ValueError) as e:
        parser.exit(1, f"trace_digest.py: error: {e}\n")


if __name__ == "__main__":
    main()
