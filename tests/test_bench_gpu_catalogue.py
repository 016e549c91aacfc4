"""The GPU run catalogue (bench/gpu/runs.toml): a new run is one entry there plus its raw folder,
and `collect.py` carries it into results.json, its tables, live_runs.json and VERSIONS.md's
live column. Each planting test works on a copy of bench/ and runs the copy's collect.py."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
sys.path.insert(0, str(BENCH / "gpu"))

import collect  # noqa: E402


def test_live_runs_json_is_the_catalogues_live_checks():
    catalogue = collect.Catalogue.read()
    committed = (REPO / "eaglegate" / "patches" / "live_runs.json").read_text(encoding="utf-8")
    assert committed == json.dumps(catalogue.live_runs(), indent=2) + "\n"
    assert json.loads(committed)["releases"], "no live check in the catalogue"


def test_results_json_is_what_the_catalogue_and_the_raw_rows_give():
    catalogue = collect.Catalogue.read()
    catalogue.check_raw()  # every raw folder has its entry, every entry says what its rows hold
    committed = (BENCH / "gpu" / "results.json").read_text(encoding="utf-8")
    assert committed == json.dumps(collect.gather(catalogue), indent=1) + "\n"


@pytest.fixture()
def copy(tmp_path):
    """bench/ and live_runs.json, laid out as in the checkout; the copy's collect.py writes there."""
    shutil.copytree(BENCH / "gpu", tmp_path / "bench" / "gpu", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("versions.py", "versions.json", "VERSIONS.md"):
        shutil.copy(BENCH / name, tmp_path / "bench" / name)
    (tmp_path / "eaglegate" / "patches").mkdir(parents=True)
    shutil.copy(REPO / "eaglegate" / "patches" / "live_runs.json", tmp_path / "eaglegate" / "patches")
    return tmp_path


def run_collect(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(root / "bench" / "gpu" / "collect.py")],
                          capture_output=True, text=True, timeout=300)


def plant(root: Path, entry: dict, data: dict) -> None:
    """One catalogue entry and its raw folder, with the rows as run.py writes them (collect
    gzips them)."""
    folder = root / "bench" / "gpu" / "raw" / entry["id"]
    folder.mkdir()
    (folder / f"rows_{entry['id']}.json").write_text(json.dumps(data))
    lines = ["", "[[runs]]"] + [f"{key} = {json.dumps(value)}" for key, value in entry.items()]
    with (root / "bench" / "gpu" / "runs.toml").open("a", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def throughput_rows(release: str, levels, servers, repeats=3) -> list[dict]:
    """Rows whose tok/s differ per server, level and repeat, none of them round."""
    return [{"server": server, "pair": "accept", "C": c, "repeat": r, "n": 3 * c, "errors": 0,
             "first_error": None, "tok_s": round(97.3 * c * (1 + 0.21 * i) + 13.7 * r * (r - 1.4), 1),
             "sglang": release}
            for i, server in enumerate(servers) for c in levels for r in range(repeats)]


def run_data(release, servers, rows, threshold, uuid="5e7c0a1b2d3f", pair="accept", **more) -> dict:
    return {"sglang": release, "machine": {"gpu": {"name": "NVIDIA H200", "uuid": uuid}},
            "threshold": threshold, "rows": rows, "equivalence": {},
            "servers": [{"server": s, "pair": pair} for s in servers], **more}


def medians(rows, server, c):
    return statistics.median(r["tok_s"] for r in rows if r["server"] == server and r["C"] == c)


def table_line(stdout: str, start: str) -> list[str]:
    """The cells of the last line that starts so: a planted run's tables come after the committed ones."""
    line = [line for line in stdout.splitlines() if line.startswith(start)][-1]
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def test_a_new_run_is_one_entry_and_its_raw_folder(copy):
    servers = ["plain-default", "eagle-v2", "gated-v2"]
    levels = [1, 64]
    rows = throughput_rows("0.5.16", levels, servers)
    plant(copy, {"id": "H90", "date": "2026-12-05", "machine": "5e7c0a1b2d3f", "release": "0.5.16",
                 "servers": servers, "pair": "accept", "section": "newest", "purpose": "throughput",
                 "note": "a planted call"}, run_data("0.5.16", servers, rows, 48))
    before = json.loads((copy / "bench" / "gpu" / "results.json").read_text())

    done = run_collect(copy)
    assert done.returncode == 0, done.stderr

    assert (copy / "bench" / "gpu" / "raw" / "H90" / "rows_H90.json.gz").is_file()  # gzipped in place
    after = json.loads((copy / "bench" / "gpu" / "results.json").read_text())
    newest = after["newest"]
    assert newest["table_runs"][-1] == "H90" and newest["notes"]["H90"] == "a planted call"
    assert newest["thresholds"]["H90"] == 48
    for c in levels:
        i = newest["levels"].index(c)
        for server in servers:
            assert newest["medians"]["H90"][server][i] == medians(rows, server, c)
    # its C=1 starts join every start of eagle-v2 and gated-v2 on the pair
    assert newest["c1_every_start"]["accept"]["gated-v2"]["starts"]["H90 gated-v2"] == medians(rows, "gated-v2", 1)
    # the other sections do not move
    assert {k: v for k, v in after.items() if k != "newest"} == {k: v for k, v in before.items() if k != "newest"}

    # collect's 0.5.16 table: the run's row per server, and gated-v2 against the best of the others
    cells = table_line(done.stdout, "| gated-v2, threshold 48 | H90 (accept) |")
    ratio = table_line(done.stdout, "| gated-v2 / max(plain-default, eagle-v2) | H90 (accept) |")
    for c in levels:
        i = newest["levels"].index(c)
        gated = medians(rows, "gated-v2", c)
        assert cells[2 + i] == f"{gated:.0f}"
        best = max(medians(rows, s, c) for s in ("plain-default", "eagle-v2"))
        assert ratio[2 + i] == f"{gated / best:.1%}"
    # not a live check: live_runs.json is as it was
    assert (copy / "eaglegate" / "patches" / "live_runs.json").read_bytes() == \
        (REPO / "eaglegate" / "patches" / "live_runs.json").read_bytes()


def a_release_without_a_live_run():
    """A release of VERSIONS.md's table that no live run covers yet (the catalogue grows)."""
    live = json.loads((REPO / "eaglegate" / "patches" / "live_runs.json").read_text())["releases"]
    for line in (BENCH / "VERSIONS.md").read_text().splitlines():
        cells = line.split(" | ")
        if line.startswith("| 0.") and cells[-1].startswith("static only") and cells[0][2:] not in live:
            return cells[0][2:]
    raise AssertionError("every release of VERSIONS.md has a live run: plant into another table")


def test_a_live_check_of_a_new_release_reaches_live_runs_json_and_versions_md(copy):
    servers = ["plain-default", "eagle-v2", "gated-v2"]
    release = a_release_without_a_live_run()
    rows = throughput_rows(release, [8, 128], servers)
    plant(copy, {"id": "V90", "date": "2026-12-05", "machine": "5e7c0a1b2d3f", "release": release,
                 "servers": servers, "pair": "accept", "section": "live", "purpose": "throughput"},
          run_data(release, servers, rows, 56, side_by_side={"kv_tokens": 200000}))
    same = {"C128": {"identical": 117, "total": 128, "differ": []},
            "switch_short": {"identical": 119, "total": 120, "differ": []}}
    outputs = {s: {"C128": [[5, 6, 7]] * 3, "switch_short": [[8, 9]] * 2} for s in servers}
    plant(copy, {"id": "V91", "date": "2026-12-05", "machine": "5e7c0a1b2d3f", "release": release,
                 "servers": servers, "pair": "context", "section": "live", "purpose": "equivalence",
                 "kernels": "--enable-deterministic-inference"},
          run_data(release, servers, [], None, pair="context", outputs=outputs,
                   equivalence={"gated-v2 vs plain-default": same}))

    done = run_collect(copy)
    assert done.returncode == 0, done.stderr

    live = json.loads((copy / "eaglegate" / "patches" / "live_runs.json").read_text())
    committed = json.loads((REPO / "eaglegate" / "patches" / "live_runs.json").read_text())
    assert live["releases"][release] == {"throughput": ["V90"], "equivalence": "V91"}
    assert {k: v for k, v in live["releases"].items() if k != release} == committed["releases"]
    cell = next(line for line in (copy / "bench" / "VERSIONS.md").read_text().splitlines()
                if line.startswith(f"| {release} |")).rstrip(" |").split(" | ")[-1]
    assert cell.startswith("live (V90, V91): 0 request errors; ")
    for c in (8, 128):
        best = max(medians(rows, s, c) for s in ("plain-default", "eagle-v2"))
        assert f"C={c} {100 * medians(rows, 'gated-v2', c) / best:.1f} %" in cell
    assert "C128 117/128, switch_short 119/120" in cell
    # the other releases' cells are as committed
    others = [line for line in (copy / "bench" / "VERSIONS.md").read_text().splitlines()
              if not line.startswith(f"| {release} |")]
    assert others == [line for line in (BENCH / "VERSIONS.md").read_text().splitlines()
                      if not line.startswith(f"| {release} |")]


# What a call records of the builds its servers imported (machine.packages): here a release's
# code on the kernels of an earlier one, built for the image's torch.
BUILDS = {"torch": "2.11.0", "sglang-kernel": "0.4.5", "sgl-deep-gemm": "0.1.5.post1"}


@pytest.mark.parametrize(("started", "measured", "builds"),
                         [(False, False, None), (True, True, None), (True, False, None), (True, True, BUILDS)])
def test_a_probe_of_a_release_says_in_versions_md_what_it_found(copy, started, measured, builds):
    """A release with no live check, tried on the image: its VERSIONS.md cell says static only
    and what the probe found, the line each server died on or that they served, with the builds
    it ran on where the call recorded them; live_runs.json, which plan and verify read, is as it
    was."""
    servers = ["plain-default", "gated-v2"]
    release = a_release_without_a_live_run()
    died = "ImportError: /stage/site/sgl_kernel/common_ops.abi3.so: undefined symbol: _ZN3c104cuda9SetDeviceEa"
    records = [{"server": s, "pair": "accept", "healthy": started, "last_error_line": None if started else died}
               for s in servers]
    rows = throughput_rows(release, [8], servers, repeats=1) if measured else []
    data = run_data(release, servers, rows, 56)
    if builds:
        data["machine"]["packages"] = builds
    plant(copy, {"id": "P90", "date": "2026-12-05", "machine": "5e7c0a1b2d3f", "release": release,
                 "servers": servers, "pair": "accept", "section": "live", "purpose": "probe"},
          {**data, "servers": records})

    done = run_collect(copy)
    assert done.returncode == 0, done.stderr

    cell = next(line for line in (copy / "bench" / "VERSIONS.md").read_text().splitlines()
                if line.startswith(f"| {release} |")).rstrip(" |").split(" | ")[-1]
    if builds:
        assert cell == ("static only; probe P90 (torch 2.11.0, sglang-kernel 0.4.5, sgl-deep-gemm 0.1.5.post1): "
                        "plain-default, gated-v2 started and served C=8 with 0 request errors")
    elif measured:
        assert cell == "static only; probe P90: plain-default, gated-v2 started and served C=8 with 0 request errors"
    elif started:  # up, but the call's deadline came before any level
        assert cell == "static only; probe P90: plain-default, gated-v2 started; no level was measured"
    else:
        assert cell == f"static only; probe P90: plain-default, gated-v2 did not start: {died}"
    assert (copy / "eaglegate" / "patches" / "live_runs.json").read_bytes() == \
        (REPO / "eaglegate" / "patches" / "live_runs.json").read_bytes()


def test_a_probe_whose_servers_were_still_starting_at_its_deadline_says_so_not_that_they_died(copy):
    """A probe under a short deadline: a server that died says the line it died on; one still
    starting when the deadline came says that, and how long it had been starting."""
    servers = ["plain-default", "gated-v2"]
    release = a_release_without_a_live_run()
    died = "Exception: sglang-kernel is installed with version 0.4.5"
    records = [{"server": "plain-default", "pair": "accept", "healthy": False, "startup_s": 104.6,
                "cut_off_starting": True, "last_error_line": None},
               {"server": "gated-v2", "pair": "accept", "healthy": False, "startup_s": 28.0,
                "last_error_line": died}]
    plant(copy, {"id": "P90", "date": "2026-12-06", "machine": "5e7c0a1b2d3f", "release": release,
                 "servers": servers, "pair": "accept", "section": "live", "purpose": "probe"},
          {**run_data(release, servers, [], 56), "servers": records})

    done = run_collect(copy)
    assert done.returncode == 0, done.stderr

    cell = next(line for line in (copy / "bench" / "VERSIONS.md").read_text().splitlines()
                if line.startswith(f"| {release} |")).rstrip(" |").split(" | ")[-1]
    assert cell == ("static only; probe P90: plain-default did not start: still starting after 105 s, at the "
                    f"call's deadline; gated-v2 did not start: {died}")


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ("release", "runs.toml: run H90: release is '0.5.15.post1', its raw rows say '0.5.16'"),
        ("no entry", "runs.toml lists no entry for raw/H90"),
        # 0.4.6: a release the gate does not patch, so the catalogue never holds a live check of it
        ("live, no equivalence", "a live check needs a throughput and an equivalence run: 0.4.6 lacks one"),
        ("twice", "runs.toml: run H90 listed twice"),
        # rows that run.py wrote when the device's limit cut the call off
        ("cut off", "runs.toml: run H90: the device cut it off (SIGTERM at t=441s), so its purpose is partial, "
                    "not throughput"),
    ],
)
def test_a_catalogue_that_disagrees_stops_collect_in_one_line_and_writes_nothing(copy, change, says):
    servers = ["plain-default", "gated-v2"]
    release = "0.4.6" if change.startswith("live") else "0.5.16"
    entry = {"id": "H90", "date": "2026-12-05", "release": "0.5.15.post1" if change == "release" else release,
             "servers": servers, "pair": "accept", "section": "live" if change.startswith("live") else "newest",
             "purpose": "throughput"}
    cut = {"cut_off": "SIGTERM at t=441s"} if change == "cut off" else {}
    plant(copy, entry, run_data(release, servers, throughput_rows(release, [8], servers), 56, uuid=None, **cut))
    toml = copy / "bench" / "gpu" / "runs.toml"
    if change == "twice":
        toml.write_text(toml.read_text() + "\n[[runs]]" + toml.read_text().rsplit("\n[[runs]]", 1)[1])
    if change == "no entry":
        toml.write_text(toml.read_text().rsplit("\n[[runs]]", 1)[0] + "\n")
    written = {p: p.read_bytes() for p in (copy / "bench" / "gpu" / "results.json",
                                           copy / "eaglegate" / "patches" / "live_runs.json",
                                           copy / "bench" / "VERSIONS.md")}

    done = run_collect(copy)

    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and says in done.stderr, done.stderr
    assert {p: p.read_bytes() for p in written} == written
    assert not done.stdout



def test_a_depth_probe_reaches_results_json_with_its_ratios(copy):
    # bench/gpu/depth.sh's two calls: the static depths, then the depth-gated server whose
    # table was calibrated on the first call's rows.
    static = ["plain-default", "eagle-v2-d1", "eagle-v2-d2", "eagle-v2"]
    gated = ["plain-default", "gated-depth", "eagle-v2", "adaptive"]
    levels = [16, 32, 64, 128]
    rows_a, rows_b = throughput_rows("0.5.16", levels, static, 1), throughput_rows("0.5.16", levels, gated, 1)
    table = {"batch": [32], "context": [], "depth": [[3], [0]]}
    entry = {"date": "2026-12-05", "machine": "5e7c0a1b2d3f", "release": "0.5.16", "pair": "accept",
             "section": "depth", "purpose": "throughput"}
    plant(copy, {"id": "P1-a", **entry, "servers": static}, run_data("0.5.16", static, rows_a, None))
    plant(copy, {"id": "P1-b", **entry, "servers": gated, "calibrated_on": "P1-a"},
          run_data("0.5.16", gated, rows_b, None, prompt_len=256, output_len=128, depth_tables={"accept": table},
                   # calibrate's answer names the file it wrote, under the device call's $OUT
                   depth_calibrate={"accept": {"written": "/home/gpu/out/depth_table_accept.json"}}))

    done = run_collect(copy)
    assert done.returncode == 0, done.stderr

    depth = json.loads((copy / "bench" / "gpu" / "results.json").read_text())["depth"]
    assert list(depth)[-2:] == ["P1-a", "P1-b"] and depth["P1-b"]["calibrated_on"] == "P1-a"
    assert depth["P1-b"]["depth_tables"] == {"accept": table}
    assert depth["P1-b"]["depth_calibrate"] == {"accept": {"written": "$OUT/depth_table_accept.json"}}
    assert depth["P1-a"]["medians"]["eagle-v2-d2"] == [medians(rows_a, "eagle-v2-d2", c) for c in levels]
    this_call = table_line(done.stdout, "| gated-depth / max(plain-default, eagle-v2, adaptive), this call |")
    static_call = table_line(done.stdout, "| gated-depth / max(the static servers of P1-a, another start) |")
    for i, c in enumerate(levels):
        mine = medians(rows_b, "gated-depth", c)
        assert this_call[1 + i] == f"{mine / max(medians(rows_b, s, c) for s in gated if s != 'gated-depth'):.1%}"
        assert static_call[1 + i] == f"{mine / max(medians(rows_a, s, c) for s in static):.1%}"
    # a probe is no live check of the gate
    assert (copy / "eaglegate" / "patches" / "live_runs.json").read_bytes() == \
        (REPO / "eaglegate" / "patches" / "live_runs.json").read_bytes()
