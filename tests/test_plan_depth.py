"""`plan --depth-table`: the depth gate's launch on real releases. The table is read by the
gate's own parser; where the release builds adaptive tiers the plan adds their flags and a
config whose candidate steps are the table's depths above 0, which the release's own loader
accepts; elsewhere it says the table collapses; the v1 worker is refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eaglegate import app
from eaglegate.cli import app as cli_app
from eaglegate.errors import UsageError
from eaglegate.patches.codemods.server_args import DEPTH_TABLE, THRESHOLD
from eaglegate.patches.gate_module import DepthTable
from eaglegate.patches.plan import ADAPTIVE_FLAGS, adaptive_loader, depth_tiers

from conftest import analysis

TABLE = {"batch": [8, 32], "context": [4096], "depth": [[3, 3], [2, "launch"], [0, 1]]}
FLAGS = "--speculative-algorithm EAGLE3 --speculative-num-steps 4"


def _plan(version: str, table: str, env: list[str] | None = None) -> app.GatePlan:  # type: ignore[name-defined]
    return app.plan_of(analysis(version), app.PlanRequest(48, app.Launch(FLAGS, env or []), depth_table=table))


@pytest.mark.parametrize("version", ["0.5.16", "0.5.23"])
def test_with_tiers_the_plan_lists_one_tier_per_depth_the_release_accepts(version, tmp_path):
    table = tmp_path / "depth.json"
    table.write_text(json.dumps(TABLE))
    plan = _plan(version, str(table))
    flags = plan.launch_flags
    assert flags[:2] == [THRESHOLD.flag, "48"]
    # Kept for the cap guard, which reads it, though the table decides every step.
    assert any(c.startswith("with the table the gate ignores the threshold") for c in plan.caveats)
    # The table itself, inline, not its path: every rank of every node reads the same table.
    inline = flags[flags.index(DEPTH_TABLE.flag) + 1]
    assert inline == DepthTable.parse(str(table)).inline() and json.loads(inline) == TABLE
    assert ADAPTIVE_FLAGS[0] in flags and flags[flags.index(ADAPTIVE_FLAGS[1]) + 1].endswith(".json")
    # The cells above 0, "launch" read as the launch's --speculative-num-steps.
    assert plan.adaptive_config == {"1": {"candidate_steps": [1, 2, 3, 4]}}
    assert plan.depth == {"table": str(table), "shape": "3x2", "depths": [1, 2, 3, 4], "tiers": True}
    written = tmp_path / "adaptive.json"
    written.write_text(json.dumps(plan.adaptive_config))
    loader = adaptive_loader(analysis(version))
    assert loader is not None
    _, slots = loader[0](str(written))  # the release's own check
    assert sorted({s for slot in slots.values() for s in slot["candidate_steps"]}) == plan.depth["depths"]


# Depths 2 and 1 of a launch of 3 steps: the table never names the launch's own depth.
WITHOUT_LAUNCH_DEPTH = {"batch": [4, 16], "depth": [[2], [1], [0]]}
THREE_STEPS = "--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1"


@pytest.mark.parametrize(("version", "check"), [
    ("0.5.13", "srt/speculative/adaptive_spec_params.py"),  # a validator beside the loader
    ("0.5.16", "srt/arg_groups/speculative_hook.py"),  # the arguments' hook from 0.5.14
    ("0.5.23", "srt/arg_groups/speculative_hook.py"),  # the hook that declares what it resolves
])
def test_the_planned_config_passes_the_releases_own_start_up_check_for_the_launchs_steps(version, check, tmp_path):
    plan = app.plan_of(analysis(version), app.PlanRequest(
        48, app.Launch(THREE_STEPS, ["SGLANG_ENABLE_SPEC_V2=1"]), depth_table=json.dumps(WITHOUT_LAUNCH_DEPTH)))
    assert plan.depth is not None and plan.depth["depths"] == [1, 2] and plan.depth["tiers"] is True
    assert plan.adaptive_config == {"1": {"candidate_steps": [1, 2, 3]}}
    tiers, _ = depth_tiers(analysis(version))
    assert tiers is not None and tiers.where.startswith(check + ":")
    written = tmp_path / "adaptive.json"
    written.write_text(json.dumps(plan.adaptive_config))
    tiers.load(str(written), 3)  # the release's own start-up check, for --speculative-num-steps 3
    # The table's depths alone: the release refuses to start, in its own words.
    written.write_text(json.dumps({"1": {"candidate_steps": [1, 2]}}))
    with pytest.raises(ValueError, match=r"^--speculative-num-steps=3 is not in the adaptive config "
                                         r"candidate_steps \[1, 2\]"):
        tiers.load(str(written), 3)


@pytest.mark.parametrize(("version", "env", "table", "why"), [
    ("0.5.9", ["SGLANG_ENABLE_SPEC_V2=1"], TABLE, "no --speculative-adaptive"),
    # 0.5.12.x's own policy refuses fewer than two distinct steps: a table whose one depth is
    # the launch's needs no tier, and a config for it would stop the server at start-up.
    ("0.5.12.post1", ["SGLANG_ENABLE_SPEC_V2=1"], {"batch": [8], "depth": [[4], [0]]},
     "candidate_steps must have at least 2 distinct values"),
])
def test_without_tiers_the_plan_says_the_table_collapses(version, env, table, why):
    inline = json.dumps(table)
    plan = _plan(version, inline, env)
    assert plan.family == "v2-code-patch"
    assert plan.launch_flags[-2:] == [DEPTH_TABLE.flag, DepthTable.parse(inline).inline()]
    assert not set(ADAPTIVE_FLAGS) & set(plan.launch_flags) and plan.adaptive_config is None
    assert plan.depth is not None and plan.depth["tiers"] is False
    collapse = [c for c in plan.caveats if "collapses to {0, the launch depth}" in c]
    assert len(collapse) == 1 and why in collapse[0]


def test_the_v1_worker_is_refused_in_one_line():
    with pytest.raises(UsageError) as refused:
        _plan("0.5.9", json.dumps(TABLE))
    assert str(refused.value) == (
        "depth_table: the depth gate runs in the overlap worker's code patch (EAGLEWorkerV2); "
        "SGLang 0.5.9 under these flags plans v1-code-patch (EAGLEWorker)")


def test_a_bad_table_is_refused_with_the_gates_own_reason():
    bad = '{"batch": [8, 8], "depth": [[1], [2], [0]]}'
    with pytest.raises(ValueError) as parsed:
        DepthTable.parse(bad)
    with pytest.raises(UsageError) as refused:
        app.PlanRequest(depth_table=bad)
    assert str(refused.value) == f"depth_table is not a depth table: {parsed.value}"


def test_a_table_given_blank_is_refused_and_a_home_path_is_read_where_it_is_returned(tmp_path, monkeypatch):
    for blank in ("", "   "):
        with pytest.raises(UsageError, match=r"^depth_table is given but blank$"):
            app.PlanRequest(depth_table=blank)
    assert _error_line(["--depth-table", "   "], 2) == "error: depth_table is given but blank"
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "t.json").write_text(json.dumps(TABLE))
    assert app.PlanRequest(depth_table="~/t.json").depth_table == str(tmp_path / "t.json")


def _error_line(args: list[str], code: int = 1) -> str:
    """The one stderr line of `eaglegate plan --version 0.5.16 ARGS`, as a shell runs it."""
    proc = subprocess.run([sys.executable, "-m", "eaglegate", "plan", "--version", "0.5.16", *args],
                          capture_output=True, text=True, timeout=600)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code and len(lines) == 1, proc.stderr
    return lines[0]


LAUNCH_ONLY = {"batch": [8], "depth": [["launch"], [0]]}


@pytest.mark.parametrize(("table", "why"), [
    ({"batch": [4], "depth": [[0], [0]]}, "every cell is 0"),
    (LAUNCH_ONLY, "the launch depth is not known here"),
])
def test_a_route_without_tiers_writes_no_other_routes_config(table, why, tmp_path):
    # 0.5.16 has a native-adaptive alternative with a config of its own: not this route's.
    config = tmp_path / "c.json"
    assert _error_line(["--depth-table", json.dumps(table), "--config-out", str(config)]) == (
        f"error: --config-out: the depth table's route on SGLang 0.5.16 has no adaptive config ({why}); "
        "nothing was written")
    assert not config.exists()


def test_a_launch_table_without_the_steps_speculates_at_a_depth_plan_cannot_list():
    plan = app.plan_of(analysis("0.5.16"), app.PlanRequest(
        48, app.Launch("--speculative-algorithm EAGLE3"), depth_table=json.dumps(LAUNCH_ONLY)))
    said = " ".join(plan.caveats)
    assert "never speculates" not in said
    assert ("the table names 'launch' and --speculative-num-steps is not given: SGLang 0.5.16 has no default "
            "for it in its source") in said
    assert plan.depth is not None and plan.depth["depths"] == [] and plan.adaptive_config is None


def test_the_command_line_writes_the_tiers_config_and_prints_the_route_as_json(tmp_path):
    config = tmp_path / "adaptive_depth.json"
    result = CliRunner().invoke(cli_app, ["plan", "--version", "0.5.16", "--flags", FLAGS, "--json",
                                          "--depth-table", json.dumps(TABLE), "--config-out", str(config)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["depth"]["depths"] == [1, 2, 3, 4] and data["depth"]["tiers"] is True
    assert json.loads(config.read_text()) == data["adaptive_config"]
    text = CliRunner().invoke(cli_app, ["plan", "--version", "0.5.16", "--flags", FLAGS,
                                        "--depth-table", json.dumps(TABLE)])
    said = " ".join(text.stdout.split())  # as printed, whatever width the terminal wraps it at
    assert "depth gate: a 3x2 table, depths [1, 2, 3, 4], each in an adaptive tier of its own" in said
    # The inline table quoted as a shell reads it.
    assert f"--speculative-depth-table '{DepthTable.parse(json.dumps(TABLE)).inline()}'" in said


def test_the_config_is_never_written_over_the_table_it_was_planned_from(tmp_path):
    table = tmp_path / "t.json"
    table.write_text(json.dumps(TABLE))
    (tmp_path / "link.json").symlink_to(table)
    for out in (str(table), f"{tmp_path}/./t.json", str(tmp_path / "link.json")):
        assert _error_line(["--flags", FLAGS, "--depth-table", str(table), "--config-out", out], 2) == (
            f"error: {Path(out)} is the depth table: write the output to another file")
        assert json.loads(table.read_text()) == TABLE
    # Any input the command reads: the interpreter whose SGLang it reads, too.
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n")
    proc = subprocess.run([sys.executable, "-m", "eaglegate", "plan", "--python", str(python), "--flags", FLAGS,
                           "--config-out", str(python)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        f"error: {python} is the interpreter given with --python: write the output to another file"), proc.stderr
    assert python.read_text() == "#!/bin/sh\n"


def test_a_table_too_long_for_a_launch_argument_is_refused_in_one_line(tmp_path):
    from eaglegate.patches.plan import MAX_INLINE_TABLE

    bands = 4000  # a file well under the parser's 1 MiB, inline over the launch's bound
    table = {"batch": list(range(1, bands)), "depth": [[1]] * bands}
    path = tmp_path / "wide.json"
    path.write_text(json.dumps(table))
    inline = DepthTable.parse(str(path)).inline()
    assert MAX_INLINE_TABLE < len(inline) < 128 * 1024 and path.stat().st_size < 1 << 20
    assert _error_line(["--flags", FLAGS, "--depth-table", str(path)], 2) == (
        f"error: depth_table: a 4000x1 table is {len(inline)} characters inline, over the {MAX_INLINE_TABLE} "
        "a launch argument may take here (Linux refuses one over 128 KiB); use fewer bands")


def test_a_start_up_check_that_reads_more_than_plan_gives_it_stops_the_plan_in_one_line():
    from eaglegate.errors import UserError
    from eaglegate.patches.plan import _run_startup_hook

    def hook(server_args):  # a later release's hook, reading a setting plan does not give
        return server_args.speculative_algorithm

    with pytest.raises(UserError) as stopped:
        _run_startup_hook(hook, "adaptive.json", 3)
    assert str(stopped.value) == (
        "this version's start-up check of the adaptive config reads what plan does not give it "
        "(AttributeError: 'types.SimpleNamespace' object has no attribute 'speculative_algorithm'); "
        "no config was planned")


# Depth 7 above a launch of 3 steps, 1 below it.
DEEPER_THAN_LAUNCH = {"batch": [16, 64, 128], "depth": [[7], [3], [1], [0]]}


@pytest.mark.parametrize(("version", "tiers", "beyond"), [
    # Each request's row of KV slots fits the launch's draft tokens alone: no tier for depth 7.
    ("0.5.12.post1", [1, 3], [7]),
    # From 0.5.13 the row fits the deepest tier's (ServerArgs.max_speculative_num_draft_tokens).
    ("0.5.13", [1, 3, 7], []),
    ("0.5.16", [1, 3, 7], []),
])
def test_a_depth_deeper_than_the_launch_gets_a_tier_only_where_the_rows_fit_it(version, tiers, beyond):
    plan = app.plan_of(analysis(version), app.PlanRequest(
        48, app.Launch(THREE_STEPS, ["SGLANG_ENABLE_SPEC_V2=1"]), depth_table=json.dumps(DEEPER_THAN_LAUNCH)))
    assert plan.depth is not None and plan.depth["depths"] == [1, 3, 7] and plan.depth["tiers"] is True
    config = plan.adaptive_config
    assert (config.get("candidate_steps") or config["1"]["candidate_steps"]) == tiers
    assert plan.depth.get("beyond_launch", []) == beyond
    said = [c for c in plan.caveats if "row of KV slots" in c]
    if beyond:
        assert len(said) == 1 and "runs at the launch's 3 steps" in said[0]
        assert "launch with --speculative-num-steps 7 --speculative-num-draft-tokens 8" in said[0]
    else:
        assert not said


def test_a_table_deeper_than_the_launch_everywhere_collapses_where_the_rows_fit_the_launch_alone():
    plan = app.plan_of(analysis("0.5.12.post1"), app.PlanRequest(
        48, app.Launch(THREE_STEPS, ["SGLANG_ENABLE_SPEC_V2=1"]), depth_table=json.dumps({"batch": [16], "depth": [[7], [0]]})))
    assert plan.depth is not None and plan.depth["tiers"] is False and plan.adaptive_config is None
    assert plan.depth["collapsed"] == "every depth of the table is deeper than the launch's 3"
    assert not set(ADAPTIVE_FLAGS) & set(plan.launch_flags)
