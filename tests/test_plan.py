"""`plan` on real releases: the family each version and flag set really gets."""

from __future__ import annotations

import ast
import json
import re
import shutil

import pytest
from packaging.version import Version
from typer.testing import CliRunner

from eaglegate.analyzer.analysis import analyze
from eaglegate.analyzer.settings import read_settings
from eaglegate.cli import app
from eaglegate.patches import live_runs
from eaglegate.patches.codemods.server_args import FLAG
from eaglegate.patches.generate import generate_patch, launch_flags
from eaglegate.patches.plan import NATIVE_COST, build_plan

from conftest import NEWEST, analysis, default_patch, release

EAGLE3 = "--speculative-algorithm EAGLE3"


@pytest.fixture(scope="module")
def unfit(tmp_path_factory):
    """0.5.12.post1 with its decode preparation reading the reservation twice: the overlap
    patch refuses it at that anchor, so a default launch (the overlap worker) is blocked."""
    parent = tmp_path_factory.mktemp("unfit")
    shutil.copytree(release("0.5.12.post1").root, parent / "sglang")
    prep = parent / "sglang" / "srt" / "speculative" / "eagle_info_v2.py"
    text = prep.read_text()
    anchor = "        alloc_len_per_decode = get_alloc_len_per_decode()\n"
    assert text.count(anchor) == 1
    prep.write_text(text.replace(anchor, anchor + "        assert get_alloc_len_per_decode() > 0\n"))
    from eaglegate.analyzer.source import from_path

    return analyze(from_path(parent))


@pytest.mark.parametrize(
    "version, env, family, worker",
    [
        ("0.4.10.post2", [], "v1-code-patch", "EAGLEWorker"),
        ("0.5.4", [], "v1-code-patch", "EAGLEWorker"),
        ("0.5.9", [], "v1-code-patch", "EAGLEWorker"),
        ("0.5.9", ["SGLANG_ENABLE_SPEC_V2=1"], "v2-code-patch", "EAGLEWorkerV2"),
        ("0.5.12.post1", [], "v2-code-patch", "EAGLEWorkerV2"),
        ("0.5.13", [], "v2-code-patch", "EAGLEWorkerV2"),
        ("0.5.12.post1", ["SGLANG_ENABLE_SPEC_V2=0"], "v1-code-patch", "EAGLEWorker"),
        ("0.5.14", [], "v2-code-patch", "EAGLEWorkerV2"),
        (NEWEST, [], "v2-code-patch", "EAGLEWorkerV2"),
    ],
)
def test_family_per_version_and_flags(version, env, family, worker):
    plan = build_plan(analysis(version), 64, EAGLE3, env)
    assert (plan.family, plan.worker) == (family, worker)
    declared = read_settings(analysis(version).codebase)
    patched = family.endswith("-code-patch")
    gate_flag = plan.launch_flags[0] if patched else None  # added by the patch itself
    for flag in plan.launch_flags:
        if flag.startswith("--") and flag != gate_flag:
            assert declared.declares(flag), flag
    if patched:
        # The patch skips speculation's running cap while the gate is on: no cap flags,
        # exactly the flags `patch` and `apply` print, and a caveat that says so.
        assert plan.caps == []
        assert plan.launch_flags == launch_flags(release(version), 64, family[:2])
        assert sum("the patch skips that while the gate is on" in c for c in plan.caveats) == \
            (Version(version) < Version("0.5.14"))  # from 0.5.14 the EAGLE hook's reset is not evaluated
        return
    assert {c["flag"] for c in plan.caps} == ({"--max-running-requests", "--cuda-graph-max-bs"} if version != NEWEST
                                             else {"--max-running-requests", "--cuda-graph-max-bs-decode"})
    assert all(c["value"] > 64 for c in plan.caps)
    assert not any("the patch skips" in c for c in plan.caveats)


def test_spec_v2_route_is_found_from_the_source(unfit):
    # The overlap worker does not take the patch here: the plan finds the switch back to v1.
    plan = build_plan(unfit, 64, EAGLE3)
    assert (plan.family, plan.worker) == ("v2-blocked", "EAGLEWorkerV2")
    assert plan.route and plan.route["change"] == "SGLANG_ENABLE_SPEC_V2=0"
    # Blocked by the patch's refusal, which names the anchor that differs.
    assert "EagleDraftInputV2Mixin.prepare_for_decode" in plan.blocked_by[0]
    decided = {d.setting: d for d in plan.why}
    assert decided["disable_overlap_schedule"].value is False


def _line_at(version, where):
    path, lineno = where.rsplit(":", 1)
    return (release(version).root / path).read_text().splitlines()[int(lineno) - 1]


def test_running_request_cap_of_48_is_read_from_post_processing(unfit):
    """A v2-blocked plan has no patch: speculation's cap stays and must be raised."""
    plan = build_plan(unfit, 64, EAGLE3)
    assert plan.family == "v2-blocked"
    cap = next(c for c in plan.caps if c["setting"] == "max_running_requests")
    assert cap["current"] == 48
    where = cap["reason"].split(" at ")[1].split(";")[0]
    assert "max_running_requests = 48" in _line_at("0.5.12.post1", where)


@pytest.mark.parametrize(
    ("version", "env"),
    [("0.4.10.post2", []), ("0.5.9", []), ("0.5.12.post1", ["SGLANG_ENABLE_SPEC_V2=0"])],
)
def test_v1_plan_says_where_speculation_sets_the_48_cap_that_the_patch_skips(version, env):
    plan = build_plan(analysis(version), 64, EAGLE3, env)
    assert plan.family == "v1-code-patch" and plan.patch and plan.caps == []
    note = next(c for c in plan.caveats if "the patch skips that" in c)
    assert note.startswith("speculation sets --max-running-requests to 48 at ")
    where = note.split(" at ")[1].split(";")[0]
    assert _line_at(version, where).strip() == "self.max_running_requests = 48"
    # That reset is the one the patch guards: the line above it is the guarded test.
    from eaglegate.patches.generate import SERVER_ARGS

    patched = next(
        c.after.decode() for c in default_patch(release(version)).changes
        if c.path.endswith(SERVER_ARGS)
    )
    path, lineno = where.rsplit(":", 1)
    original = (release(version).root / path).read_text().splitlines()
    guard = "if self.max_running_requests is None and not self.speculative_batch_gate_threshold:"
    # The patch adds one line per gate argument it declares (its dataclass field) above
    # post-processing: the depth table's only where it patches the overlap worker too.
    from eaglegate.patches.codemods.server_args import GATE_ARGUMENTS

    added = sum(f"    {a.field}: " in patched for a in GATE_ARGUMENTS)
    assert patched.splitlines()[int(lineno) - 2 + added].strip() == guard
    assert original[int(lineno) - 2].strip() == "if self.max_running_requests is None:"


def test_v1_plan_warns_when_the_graph_cap_is_below_the_running_cap():
    plan = build_plan(analysis("0.5.9"), 64, EAGLE3 + " --max-running-requests 256 --cuda-graph-max-bs 128")
    assert plan.family == "v1-code-patch" and plan.caps == []
    static = [live_runs.live_status("0.5.9")]  # no live run of 0.5.9 with this gate
    assert plan.caveats == [
        "your --cuda-graph-max-bs 128 is below your --max-running-requests 256: gated batches above "
        "128 run without CUDA graphs; use --cuda-graph-max-bs 256", *static
    ]
    fine = build_plan(analysis("0.5.9"), 64, EAGLE3 + " --max-running-requests 256 --cuda-graph-max-bs 256")
    assert fine.caveats == static


@pytest.mark.parametrize("version, flags, env", [
    # 0.5.3.post2 to 0.5.4 select the overlap worker with a flag; EAGLE (not only EAGLE3) too.
    ("0.5.3.post2", f"{EAGLE3} --enable-beta-spec", []),
    ("0.5.4", f"{EAGLE3} --enable-beta-spec", []),
    ("0.5.4", "--speculative-algorithm EAGLE --enable-beta-spec", []),
    # From 0.5.4.post1 with SGLANG_ENABLE_SPEC_V2; to 0.5.7 the factory takes `enable_overlap`
    # from the scheduler's keyword arguments.
    ("0.5.4.post2", EAGLE3, ["SGLANG_ENABLE_SPEC_V2=1"]),
    ("0.5.5.post3", EAGLE3, ["SGLANG_ENABLE_SPEC_V2=1"]),
    ("0.5.6", EAGLE3, ["SGLANG_ENABLE_SPEC_V2=1"]),
    ("0.5.7", EAGLE3, ["SGLANG_ENABLE_SPEC_V2=1"]),
])
def test_an_overlap_worker_launch_on_an_older_release_gets_the_overlap_patch(version, flags, env):
    """The launch selects EAGLEWorkerV2 (decided from the version's own argument handling and
    worker choice, not a version table): the plan is the overlap worker's patch, its files
    those `patch` writes for that worker, its flags those `patch` and `apply` print for it."""
    tree = release(version)
    plan = build_plan(analysis(version), 48, flags, env)
    assert (plan.family, plan.worker) == ("v2-code-patch", "EAGLEWorkerV2"), plan.to_json()
    assert plan.patch is not None and not plan.blocked_by
    assert not any("both workers remain possible" in c for c in plan.caveats)
    made = generate_patch(tree, "v2", required=True)
    assert plan.patch["files"] == [c.path for c in made.changes]
    assert plan.launch_flags == launch_flags(tree, 48, made.worker)
    assert plan.launch_flags[:2] == [FLAG, "48"] and "--disable-overlap-schedule" not in plan.launch_flags
    # The flags printed keep the overlap worker: the launch with them plans the same.
    again = build_plan(analysis(version), 48, " ".join([flags, *plan.launch_flags[2:]]), env)
    assert again.family == "v2-code-patch"
    # Without the opt-in, the same release runs (and plans) the v1 worker.
    default = build_plan(analysis(version), 48, EAGLE3, [])
    assert default.family == "v1-code-patch" and "--disable-overlap-schedule" in default.launch_flags


def test_plan_patch_and_apply_print_the_same_flags(tmp_path):
    """`generate.launch_flags` is the one source: the three commands agree on one tree."""
    parent = tmp_path / "site"
    shutil.copytree(release("0.5.9").root, parent / "sglang")
    runner = CliRunner()
    where = ["--path", str(parent / "sglang"), "--threshold", "40", "--json"]
    planned = runner.invoke(app, ["plan", "--flags", EAGLE3, *where])
    assert planned.exit_code == 0, planned.output
    patched = runner.invoke(app, ["patch", *where])
    assert patched.exit_code == 0, patched.output
    applied = runner.invoke(app, ["apply", *where])
    assert applied.exit_code == 0, applied.output
    expected = ["--speculative-batch-gate-threshold", "40", "--disable-overlap-schedule"]
    assert json.loads(planned.stdout)["launch_flags"] == expected
    assert json.loads(patched.stdout)["launch_flags"] == expected
    assert json.loads(applied.stdout)["launch_flags"] == expected


def test_an_explicit_cap_is_respected():
    plan = build_plan(analysis("0.5.9"), 64, EAGLE3 + " --max-running-requests 512 --cuda-graph-max-bs 512")
    assert plan.caps == []


def _own_loader(version):
    """The version's `_load_adaptive_config`, compiled from the fetched source."""
    path = release(version).root / "srt" / "speculative" / "adaptive_spec_params.py"
    tree = ast.parse(path.read_text())
    func = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_load_adaptive_config")
    namespace = {"json": json, "DEFAULT_ADAPTIVE_CONFIG": {}}
    exec(compile(ast.Module(body=[func], type_ignores=[]), str(path), "exec"), namespace)
    return namespace["_load_adaptive_config"]


@pytest.mark.parametrize("version", ["0.5.14", NEWEST])
def test_adaptive_config_parses_with_the_versions_own_loader(version, tmp_path):
    plan = build_plan(analysis(version), 64, EAGLE3 + " --speculative-num-steps 4")
    native = next(a for a in plan.alternatives if a["family"] == "native-adaptive")
    config = tmp_path / "adaptive.json"
    config.write_text(json.dumps(native["adaptive_config"]))
    _, slots = _own_loader(version)(str(config))
    assert slots == {1: {"candidate_steps": [4]}, 64: {"candidate_steps": [0]}}
    assert "--speculative-adaptive" in native["launch_flags"]


@pytest.mark.parametrize("version", ["0.5.14", "0.5.16", NEWEST])
def test_from_0_5_14_the_patch_is_the_route_and_the_native_config_the_alternative_with_its_cost(version):
    """Neither route throttles plain decoding: the patch's flags carry no cap, the native
    alternative gives no cap number below what SGLang picks without speculation (none at all:
    it names the plain server's logged cap), and it states what it was measured to cost."""
    plan = build_plan(analysis(version), 50, EAGLE3)
    assert plan.family == "v2-code-patch" and plan.adaptive_config is None
    assert plan.launch_flags == launch_flags(release(version), 50, "v2") == [FLAG, "50"]
    assert plan.caps == []
    (native,) = plan.alternatives
    assert native["family"] == "native-adaptive"
    assert native["adaptive_config"] == {"1": {"candidate_steps": [3]}, "50": {"candidate_steps": [0]}}
    assert native["cost"].endswith(NATIVE_COST) and "% of plain decoding" in native["cost"]
    assert "0.5.16" in native["cost"]
    assert all(cap["value"] is None for cap in native["caps"])
    assert "--max-running-requests" in {cap["flag"] for cap in native["caps"]}
    assert not any(flag.startswith(("--max-running", "--cuda-graph")) for flag in native["launch_flags"])
    data = plan.to_json()
    assert data["alternatives"][0]["cost"] == native["cost"]


def test_older_adaptive_loader_rejects_a_zero_slot_so_the_plan_does_not_use_it():
    # 0.5.12.post1 declares the adaptive flags, but its loader wants two distinct steps per slot.
    assert read_settings(analysis("0.5.12.post1").codebase).declares("--speculative-adaptive")
    assert build_plan(analysis("0.5.12.post1"), 64, EAGLE3).family == "v2-code-patch"


def test_undeclared_flag_is_a_clear_error():
    from eaglegate.errors import UserError

    with pytest.raises(UserError, match="does not declare --no-such-flag"):
        build_plan(analysis("0.5.9"), 64, "--no-such-flag 3")


def test_flags_that_make_the_factory_build_another_class_select_no_eagle_worker():
    """0.5.9's factory builds MultiLayerEagleWorker for EAGLE with --enable-multi-layer-eagle:
    neither EAGLEWorker nor EAGLEWorkerV2 runs, so no gate is planned for them."""
    flags = "--speculative-algorithm EAGLE --enable-multi-layer-eagle --disable-overlap-schedule"
    plan = build_plan(analysis("0.5.9"), 64, flags)
    assert plan.family == "no-eagle-worker" and plan.worker is None and not plan.launch_flags
    excluded = [c for c in plan.caveats if "is not built under these settings" in c]
    assert {c.split(" ", 1)[0] for c in excluded} == {"EAGLEWorker", "EAGLEWorkerV2"}
    site = excluded[0].split(": ", 2)[1]  # the factory's condition, at file:line
    path, lineno = site.rsplit(":", 1)
    line = (release("0.5.9").root / path).read_text().splitlines()[int(lineno) - 1]
    assert "return" in line
    assert any(d.setting == "enable_multi_layer_eagle" and d.value is True for d in plan.why)
    # Without the flag the same launch is the v1 code patch.
    plain = build_plan(analysis("0.5.9"), 64, "--speculative-algorithm EAGLE --disable-overlap-schedule")
    assert plain.family == "v1-code-patch" and plain.worker == "EAGLEWorker"


def test_a_v2_worker_with_an_open_route_but_no_patch_is_not_called_blocked_by_its_route(unfit):
    """The couplings verdict finds the overlap worker's route open; the patch's anchors do
    not fit this tree, and the plan says exactly that."""
    verdict = unfit.couplings.verdict("v2")
    assert verdict is not None and verdict.status == "feasible"
    plan = build_plan(unfit, 64, EAGLE3)
    assert (plan.family, plan.worker) == ("v2-blocked", "EAGLEWorkerV2")
    assert plan.blocked_by[0].startswith("the gate patch does not fit this tree: anchor EagleDraftInputV2Mixin.")
    assert plan.blocked_by[1] == "no gate patch for this release's EAGLEWorkerV2"
    assert any("verdict for EAGLEWorkerV2 is feasible" in c for c in plan.caveats)


def test_a_v1_tree_the_patch_does_not_fit_still_gets_a_plan_that_says_so():
    """0.4.7's v1 entry branches `if is_decode(): … else: extend`: the codemod's anchor (a
    top-level `if …is_extend()`) matches nothing, so there is no patch, and the plan says why."""
    plan = build_plan(analysis("0.4.7"), 64, EAGLE3)
    assert (plan.family, plan.worker) == ("v1-code-patch", "EAGLEWorker")
    assert not plan.patch
    assert len(plan.blocked_by) == 1 and "does not fit" in plan.blocked_by[0]
    assert "matched 0 site(s)" in plan.blocked_by[0]
    assert plan.launch_flags == [] and plan.caps == []


def test_a_v1_plan_without_a_patch_does_not_say_the_patch_skips_the_cap():
    plan = build_plan(analysis("0.4.7"), 64, EAGLE3)
    assert not plan.patch
    assert not any("the patch skips" in c for c in plan.caveats)


def test_plan_decides_the_launch_through_evaluate_launch():
    """One launch decision: the algorithm assumed, the settings resolved and the workers
    chosen are `analyzer.launch.evaluate_launch`'s, as for `couplings`."""
    from eaglegate.analyzer.launch import DEFAULT_ALGORITHM, evaluate_launch

    a = analysis("0.5.9")
    for flags in ("", "--disable-overlap-schedule"):
        launch = evaluate_launch(a.settings, a.spec_map, a.codebase, flags)
        plan = build_plan(a, 64, flags)
        assert launch.assumed and all(line in plan.caveats for line in launch.assumed)
        assert plan.worker in {w.name for w in launch.workers}
        decided = {d.setting: d.value for d in plan.why}
        assert decided and all(launch.resolved.values[name] == value for name, value in decided.items())
        explicit = build_plan(a, 64, f"--speculative-algorithm {DEFAULT_ALGORITHM} {flags}")
        assert explicit.worker == plan.worker and not any("assumed" in c for c in explicit.caveats)


def test_the_native_routes_measured_cost_is_what_the_benchmark_holds():
    """plan's figures for the native route are results.json's: every 0.5.16 run in which it
    ran at C >= 64 (in a call of its own, beside another call's servers, or side by side)."""
    from pathlib import Path

    results = Path(__file__).resolve().parent.parent / "bench" / "gpu" / "results.json"
    newest = json.loads(results.read_text())["newest"]
    above = [i for i, c in enumerate(newest["levels"]) if c >= 64]
    share, ratio, native, plain, runs = [], [], [], [], set()
    for run, medians in newest["medians"].items():
        servers = ("plain-default", "adaptive", "gated-v2")
        if not all(s in medians and all(medians[s][i] for i in above) for s in servers):
            continue
        runs.add(newest["borrowed"].get(run, {}).get("adaptive", run))
        for i in above:
            p, a, g = (medians[s][i] for s in servers)
            share.append(a / p)
            ratio.append(g / a)
            native.append(a)
            plain.append(p)
    assert len(runs) >= 3
    low, high = round(100 * min(share)), round(100 * max(share))
    assert f"served {low}-{high} % of plain decoding" in NATIVE_COST
    assert f"({min(native) / 1000:.1f}-{max(native) / 1000:.1f}k " in NATIVE_COST
    assert f"against {min(plain) / 1000:.1f}-{max(plain) / 1000:.1f}k output tok/s" in NATIVE_COST
    assert f"served {min(ratio):.1f}-{max(ratio):.1f} times as much" in NATIVE_COST
    # Run ids are a letter and one or two digits (H4, H31); the machine's name (H200) is no run id.
    assert not re.search(r"\b[A-Z]\d{1,2}\b", NATIVE_COST), "run ids stay out of user-visible output"
