"""The GPU machine a call runs on: its cores (the load generator's, the servers', the
scheduler's), what it records of the machine and of each repeat (GPU clocks and power, CPU
shares), and the pinning of a server's scheduler."""
import hashlib
import importlib.metadata
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

# The compiled packages a release pins exactly besides torch, which the pack carries: the
# kernel package (sgl-kernel before it was renamed) and DeepGEMM. Their builds must match the
# image's torch (abi.py checks that they do).
CARRIED_BUILDS = ("sglang-kernel", "sgl-kernel", "sgl-deep-gemm")


def siblings(cpu):
    """The logical CPUs of cpu's physical core (SMT siblings), itself included."""
    try:
        text = open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read().strip()
    except OSError:
        return {cpu}
    out = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


@dataclass(frozen=True)
class Cores:
    """How a call shares the machine's cores. The load generator (run.py itself) on cores of
    its own, the servers on the rest: a speculative server at C <= 8 is bound by its
    scheduler's CPU, and G2-G6 saw the same server move by up to 23 % between starts.
    --pin-scheduler: the scheduler's physical core kept for it alone (G8 still saw two starts
    of one server differ by 13 % at C=1 with only the load generator set apart; tried in G9
    and G10: off by default)."""
    all: tuple
    load: frozenset
    server: frozenset
    scheduler: frozenset
    other: frozenset

    @classmethod
    def of_this_process(cls):
        every = sorted(os.sched_getaffinity(0))
        load = set(every[-2:]) if len(every) > 4 else set(every)
        server = set(every) - load or set(every)
        scheduler = siblings(min(server)) & server
        return cls(tuple(every), frozenset(load), frozenset(server), frozenset(scheduler),
                   frozenset(server - scheduler or server))

    def line(self):
        return (f"servers {sorted(self.server)} (scheduler {sorted(self.scheduler)}), load {sorted(self.load)}; "
                f"SMT siblings {sorted({tuple(sorted(siblings(c))) for c in self.all})}")


def tree_pids(root):
    """root and its descendants, from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def pin_server(root, cores):
    """Every thread of SGLang's scheduler process(es) (setproctitle names them
    `sglang::scheduler...`) on the scheduler's cores, the rest of the server's processes on the
    other server cores; nothing when no scheduler is found. Returns what was done, for the
    record."""
    procs = []
    for pid in tree_pids(root):
        try:
            raw = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
            comm = open(f"/proc/{pid}/comm").read().strip()
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
        title = (raw.split() or [""])[0]
        procs.append((title or comm, "scheduler" in title or "schedul" in comm, tids))
    pinned = {"scheduler_cores": sorted(cores.scheduler), "other_cores": sorted(cores.other),
              "schedulers": [t for t, sched, _ in procs if sched], "processes": len(procs)}
    if not pinned["schedulers"]:
        return pinned
    for _, sched, tids in procs:
        for tid in tids:
            try:
                os.sched_setaffinity(tid, cores.scheduler if sched else cores.other)
            except OSError as e:
                pinned.setdefault("errors", []).append(f"{tid}: {e}")
    return pinned


def gpu_mib(field):
    """nvidia-smi's memory.FIELD (used, total) in MiB, or -1 where it does not answer."""
    try:
        q = ["nvidia-smi", f"--query-gpu=memory.{field}", "--format=csv,noheader,nounits"]
        return int(subprocess.check_output(q, text=True).split()[0])
    except Exception:  # noqa: BLE001
        return -1


def gpu_state():
    """The GPU's clocks, power and temperature now (nvidia-smi), for each row: the spread
    between two starts of one server may be the machine's, not the server's."""
    base = ("clocks.sm", "clocks.mem", "power.draw", "temperature.gpu")
    # (newer drivers name the throttle reasons clock events; the older name may be gone)
    for fields in (base + ("clocks_event_reasons.active",), base + ("clocks_throttle_reasons.active",), base):
        try:
            q = ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
            values = [v.strip() for v in subprocess.check_output(q, text=True, timeout=10,
                                                                 stderr=subprocess.DEVNULL).split(",")]
            return dict(zip(fields, values, strict=True))
        except Exception:  # noqa: BLE001 - a row without it is still a row
            continue
    return None


def cpu_ticks(stat_text=None):
    """The machine's CPU time so far, in ticks, from /proc/stat's first line: user, nice,
    system, idle, iowait, irq, softirq, steal."""
    if stat_text is None:
        try:
            with open("/proc/stat") as f:
                stat_text = f.readline()
        except OSError:
            return None
    fields = stat_text.split()
    return [int(v) for v in fields[1:9]] if fields[:1] == ["cpu"] else None


def cpu_shares(before, after):
    """Of the machine's CPU time between two `cpu_ticks`: the part busy (neither idle,
    waiting nor stolen) and the part the hypervisor gave other guests (steal), for each row: a C=1
    repeat is bound by the scheduler's thread, and a starved one is the machine's, not the
    server's."""
    if not before or not after:
        return None
    delta = [b - a for a, b in zip(before, after, strict=True)]
    total = sum(delta)
    if total <= 0:
        return None
    idle = delta[3] + delta[4]
    return {"busy": round((total - idle - delta[7]) / total, 4), "steal": round(delta[7] / total, 4)}


def packages(site):
    """The builds the servers import: the image's torch (this interpreter's) and each of
    CARRIED_BUILDS that the stage (`site`, what setup.sh installed from the pack) holds."""
    found = {}
    try:
        found["torch"] = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        pass
    for name in CARRIED_BUILDS:
        stem = name.replace("-", "_")
        for info in Path(site).glob(f"{stem}-*.dist-info"):
            found[name] = info.name[len(stem) + 1:-len(".dist-info")]
    return found


def machine():
    """Which machine ran the call: the CPU model and frequency, the GPU (its UUID hashed, to
    tell two calls on one GPU from calls on two), its clocks and power limit."""
    out = {}
    try:
        cpuinfo = open("/proc/cpuinfo").read()
        out["cpu"] = re.search(r"model name\s*:\s*(.*)", cpuinfo).group(1)
        out["cpu_mhz"] = sorted(float(x) for x in re.findall(r"cpu MHz\s*:\s*([\d.]+)", cpuinfo))
    except (OSError, AttributeError):
        pass
    fields = ("name", "uuid", "clocks.max.sm", "power.limit", "driver_version", "persistence_mode")
    try:
        q = ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader"]
        gpu = dict(zip(fields, (v.strip() for v in subprocess.check_output(q, text=True, timeout=10).split(",")),
                       strict=True))
        gpu["uuid"] = hashlib.sha256(gpu["uuid"].encode()).hexdigest()[:12]
        out["gpu"] = gpu
    except Exception:  # noqa: BLE001
        pass
    return out
