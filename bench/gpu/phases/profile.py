"""--profile: SGLang's torch profiler over a server's decode steps under load, digested by
trace_digest.py into profile_<tag>.txt."""
import os
import subprocess
import threading
import time

import loadgen
import servers

PROFILE_STEPS = 30
PROFILE_WINDOW_GAP_S = 0.6  # about one wave of 128 decode steps at C=64, and its prefill


def profile_windows(server, pair, c, windows):
    """The profiler windows at one level: (name, with Python stacks, seconds into the load
    before it starts, the load's waves). `windows` without stacks, each one wave later in its
    load than the one before (at C=64 a gated server's decode speed changed mostly from wave
    to wave, H21-H24) and its load a wave longer, so that it still runs when the window ends;
    then one with stacks."""
    base = f"{server}-{pair}-C{c}"
    plain = [(f"{base}-nostack" + (f"{i + 1}" if i else ""), False, 0.5 + PROFILE_WINDOW_GAP_S * i, 6 + i)
             for i in range(windows)]
    return [*plain, (f"{base}-stack", True, 0.5, 6)]


def profile(run, url, res, c, temperature):
    """SGLang's torch profiler over PROFILE_STEPS steps under load at C=c: --profile-windows
    times without Python stacks (the GPU timeline as served), then once with them (where the
    scheduler's time goes; tracing slows its Python). Appends trace_digest's summary to
    profile_<tag>.txt."""
    import trace_digest

    for name, stack, start_s, waves in profile_windows(res["server"], res["pair"], c, run.profile_windows):
        out_dir = f"{run.traces}/{name}"
        os.makedirs(out_dir, exist_ok=True)
        load = threading.Thread(target=loadgen.bench, args=(url, c),
                                kwargs={"seed": 7, "temperature": temperature, "waves": waves})
        load.start()
        time.sleep(start_s)  # past the first prefills: the running batch decodes at C
        try:
            servers.post(url + "/start_profile", {"output_dir": out_dir, "num_steps": PROFILE_STEPS,
                                                  "activities": ["CPU", "GPU"], "with_stack": stack,
                                                  "record_shapes": False})
        except Exception as e:  # noqa: BLE001 - a profile is extra; the rows stand without it
            print(f"   profile {name}: start failed: {e!r}", flush=True)
        load.join()
        traces = []
        for _ in range(60):  # the scheduler writes the trace after its last profiled step
            traces = [f"{out_dir}/{f}" for f in os.listdir(out_dir) if f.endswith(".trace.json.gz")]
            if traces:
                break
            time.sleep(0.5)
        time.sleep(1)  # let the writer finish the file it named
        try:
            text = "".join(trace_digest.digest(t) for t in traces) or f"# {name}: no trace written\n"
        except Exception as e:  # noqa: BLE001 - the traces still come back in the tar
            text = f"# {name}: digest failed: {e!r}\n"
        with open(f"{run.out}/profile_{run.tag}.txt", "a") as f:
            f.write(f"\n==== {name}\n{text}")
        print(text.splitlines()[1] if len(text.splitlines()) > 1 else text, flush=True)


def keep_traces(run):
    """The traces themselves come back, when they fit what comes back."""
    if not os.path.isdir(run.traces):
        return
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(run.traces) for f in fs)
    if size < 15 * 2**20:
        subprocess.run(["tar", "-cf", f"{run.out}/traces_{run.tag}.tar", "-C", run.traces, "."], check=False)
    else:
        print(f"== traces ({size >> 20} MiB) left on the machine", flush=True)
