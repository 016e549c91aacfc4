"""Launch lines read as the release's own server reads them (issue 45, section 1), on real
releases: argparse's options and prefixes, types and `dest`s of the server's parser alone;
the algorithm rewritten as the release rewrites it; the worker an algorithm builds; and the
gate's off-switches (attention DP in each spelling, pipeline parallelism) in plan's caveats.
"""

from __future__ import annotations

import pytest

from eaglegate.analyzer.launch import evaluate_launch, find_algorithm
from eaglegate.analyzer.settings import parse_flags
from eaglegate.errors import UserError
from eaglegate.patches.plan import build_plan

from conftest import analysis, release
from test_faults_cli import eaglegate, error_line

SPREAD = ["0.4.10.post2", "0.5.4", "0.5.9", "0.5.12.post1", "0.5.14", "0.5.16", "0.5.23"]
TP8 = "--tp 8 --speculative-algorithm EAGLE3"


def _launch(version: str, flags: str):
    a = analysis(version)
    return evaluate_launch(a.settings, a.spec_map, a.codebase, flags)


@pytest.mark.parametrize("version", SPREAD)
def test_tp_is_an_unambiguous_prefix_of_tp_size_and_plans(version):
    settings = analysis(version).settings
    # argparse takes a prefix that names one declared option: `--tp` names `--tp-size` alone.
    assert [f for f in settings.flags if f.startswith("--tp")] == ["--tp-size"]
    assert parse_flags(settings, TP8) == {"tp_size": 8, "speculative_algorithm": "EAGLE3"}
    plan = build_plan(analysis(version), 64, TP8)
    assert plan.worker is not None and plan.family.endswith("code-patch"), plan


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_prefixes_resolve_as_argparse_resolves_them(version):
    settings = analysis(version).settings
    values = parse_flags(settings, "--speculative-algo EAGLE --mem-frac 0.8 --dp 2")
    assert values == {"speculative_algorithm": "EAGLE", "mem_fraction_static": 0.8, "dp_size": 2}
    # A prefix of several declared options is refused, naming them, as argparse does.
    several = sorted(f for f in settings.flags if f.startswith("--speculative-num"))
    assert len(several) > 1
    with pytest.raises(UserError) as refused:
        parse_flags(settings, "--speculative-num 3")
    assert str(refused.value) == f"ambiguous option in --flags: --speculative-num could match {', '.join(several)}"


def test_only_the_servers_parser_is_read_not_the_diffusion_servers():
    settings = analysis("0.5.9").settings
    # 0.5.9's diffusion server declares `--dp`; the LLM server's parser does not.
    diffusion = release("0.5.9").root / "multimodal_gen"
    assert any('"--dp"' in p.read_text(encoding="utf-8") for p in diffusion.rglob("server_args*.py"))
    assert "--dp" not in settings.flags
    assert parse_flags(settings, "--dp 8") == {"dp_size": 8}


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_a_value_the_options_type_refuses_is_refused(version):
    with pytest.raises(UserError, match=r"^--speculative-num-steps in --flags: invalid int value: 'abc'$"):
        parse_flags(analysis(version).settings, "--speculative-num-steps abc")


def test_a_refused_value_is_one_line_and_exit_1_on_the_command_line():
    release("0.5.9")
    line = error_line(eaglegate("plan", "--version", "0.5.9", "--flags", "--speculative-num-steps abc"))
    assert line == "error: --speculative-num-steps in --flags: invalid int value: 'abc'"


def test_aliases_store_under_the_options_dest():
    # 0.5.23 generates `--tensor-parallel-size` from the field `tp_size` (`Arg(aliases=…)`).
    settings = analysis("0.5.23").settings
    assert parse_flags(settings, "--tensor-parallel-size 4") == {"tp_size": 4}


@pytest.mark.parametrize("version", ["0.5.6", "0.5.9"])
def test_nextn_is_rewritten_to_eagle_and_runs_the_v1_worker_with_overlap_off(version):
    plan = build_plan(analysis(version), 64, "--speculative-algorithm NEXTN")
    assert plan.family == "v1-code-patch" and plan.worker == "EAGLEWorker"
    assert "--disable-overlap-schedule" in plan.launch_flags
    why = {d.setting: d for d in plan.why}
    assert why["disable_overlap_schedule"].value is True
    rewrite = why["speculative_algorithm"]
    assert rewrite.value == "EAGLE" and rewrite.source != "flag"
    path, lineno = rewrite.source.rsplit(":", 1)
    line = (release(version).root / path).read_text(encoding="utf-8").splitlines()[int(lineno) - 1]
    assert "speculative_algorithm" in line and '"EAGLE"' in line  # the release's own rewrite


@pytest.mark.parametrize("version", ["0.5.6", "0.5.9", "0.5.23"])
def test_ngram_builds_no_eagle_worker_so_no_gate_is_planned(version):
    plan = build_plan(analysis(version), 64, "--speculative-algorithm NGRAM")
    assert plan.family == "no-eagle-worker" and plan.worker is None and not plan.launch_flags
    assert "--speculative-algorithm NGRAM" in plan.caveats[0]


def test_ngram_on_the_command_line_exits_1_with_one_line():
    release("0.5.9")
    line = error_line(eaglegate("plan", "--version", "0.5.9", "--flags", "--speculative-algorithm NGRAM", "--json"))
    assert line.startswith("error: no gate for this launch: no EAGLE worker is selected under these flags "
                           "(--speculative-algorithm NGRAM")


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_the_algorithms_predicates_come_from_its_class(version):
    a = analysis(version)
    algorithm = find_algorithm(a.codebase, a.spec_map)
    assert algorithm is not None and algorithm.setting == "speculative_algorithm"
    assert {"EAGLE", "EAGLE3", "NGRAM"} <= set(algorithm.members)
    known = _launch(version, "--speculative-algorithm NGRAM")
    assert known.workers == []


@pytest.mark.parametrize("version, flags, reason", [
    ("0.5.23", "--attn-dp-size 8", "data-parallel attention is on"),
    ("0.5.23", "--enable-dp-attention --dp-size 8", "data-parallel attention is on"),
    ("0.5.23", "--pp-size 2", "pipeline parallelism is on"),
    ("0.5.16", "--enable-dp-attention --dp-size 8", "data-parallel attention is on"),
])
def test_a_setting_that_switches_the_overlap_gate_off_is_a_caveat(version, flags, reason):
    plan = build_plan(analysis(version), 64, f"--speculative-algorithm EAGLE3 {flags}")
    assert plan.worker == "EAGLEWorkerV2"
    off = [c for c in plan.caveats if c.startswith("the overlap worker's gate switches itself off")]
    assert len(off) == 1 and reason in off[0], plan.caveats
    assert not [c for c in build_plan(analysis(version), 64, "--speculative-algorithm EAGLE3").caveats
                if "switches itself off" in c]
