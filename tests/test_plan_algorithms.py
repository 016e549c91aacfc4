"""`plan` routes each `--speculative-algorithm` to the worker the release's own factory builds.

The expected rows below were read from each release's source, not from eaglegate: where the
release chooses the draft worker, and what its argument post-processing does to the
algorithm first. eaglegate's gate covers EAGLEWorker ("v1-code-patch") and EAGLEWorkerV2
("v2-code-patch"); a launch that builds any other worker (NGRAMWorker, StandaloneWorker,
StandaloneWorkerV2) plans "no-eagle-worker" and `plan` exits 1.

- 0.5.3.post2: `Scheduler.launch_draft_worker` branches on `self.spec_algorithm.is_eagle()`
  (EAGLEWorkerV2 if `self.enable_overlap` else EAGLEWorker), `is_standalone()`
  (StandaloneWorker), `is_ngram()` (NGRAMWorker). `ServerArgs._handle_speculative_decoding`
  rewrites NEXTN to EAGLE and turns the overlap schedule off for EAGLE, EAGLE3 and STANDALONE
  unless `--enable-beta-spec`.
- 0.5.6: `sglang/srt/speculative/spec_info.py` registers `_create_eagle_worker` for EAGLE
  (alias NEXTN) and EAGLE3 (EAGLEWorkerV2 only with `enable_overlap`), `_create_standalone_worker`
  for STANDALONE, `_create_ngram_worker` for NGRAM; `ServerArgs._handle_speculative_decoding`
  rewrites NEXTN to EAGLE and keeps the overlap schedule off unless SGLANG_ENABLE_SPEC_V2
  (default false).
- 0.5.9: `SpeculativeAlgorithm.create_worker`: `is_eagle()` gives EAGLEWorkerV2 with the
  overlap schedule, else EAGLEWorker; `ServerArgs._handle_speculative_decoding` keeps the
  overlap schedule off unless SGLANG_ENABLE_SPEC_V2 (default false), and rewrites NEXTN to EAGLE.
- 0.5.12.post1: `SpeculativeAlgorithm.create_worker` as in 0.5.9, with SGLANG_ENABLE_SPEC_V2
  (the overlap schedule) true by default. 0.5.13: EAGLEWorkerV2 for `is_eagle()` whatever the
  overlap schedule, StandaloneWorkerV2 for `is_standalone()`, NGRAMWorker for `is_ngram()`.
  In both, NEXTN becomes EAGLE in `_resolve_speculative_algorithm_alias` (server_args.py in
  0.5.12.post1, arg_groups/speculative_hook.py in 0.5.13).
- 0.5.14, 0.5.16, 0.5.18, 0.5.19, 0.5.23: `SpeculativeAlgorithm.create_worker` returns
  EAGLEWorkerV2 for `is_eagle()` whatever the overlap schedule, StandaloneWorkerV2 for
  `is_standalone()`, NGRAMWorker for `is_ngram()`; NEXTN becomes EAGLE in
  `_resolve_speculative_algorithm_alias` (arg_groups/speculative_hook.py). 0.5.14 to 0.5.18 also
  build `ContextParallelStrategyKind.from_string(server_args.cp_strategy)` in
  `sglang/srt/layers/cp/base.py`, a second class made by `from_string` from a setting.
"""

from __future__ import annotations

import pytest

from eaglegate.analyzer.launch import find_algorithm
from eaglegate.patches.plan import build_plan

from conftest import analysis, release
from test_faults_cli import eaglegate, error_line

ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "NGRAM", "STANDALONE")
V1 = ("v1-code-patch", "EAGLEWorker")
V2 = ("v2-code-patch", "EAGLEWorkerV2")
NONE = ("no-eagle-worker", None)

# release → the plan for EAGLE, EAGLE3, NEXTN, NGRAM, STANDALONE (in that order).
EXPECTED = {
    "0.5.3.post2": (V1, V1, V1, NONE, NONE),
    "0.5.6": (V1, V1, V1, NONE, NONE),
    "0.5.9": (V1, V1, V1, NONE, NONE),
    "0.5.12.post1": (V2, V2, V2, NONE, NONE),
    "0.5.13": (V2, V2, V2, NONE, NONE),
    "0.5.14": (V2, V2, V2, NONE, NONE),
    "0.5.16": (V2, V2, V2, NONE, NONE),
    "0.5.18": (V2, V2, V2, NONE, NONE),
    "0.5.19": (V2, V2, V2, NONE, NONE),
    "0.5.23": (V2, V2, V2, NONE, NONE),
}
# Releases that build a second enum from a setting with `from_string` (see above).
WITH_CP_STRATEGY_KIND = ["0.5.14", "0.5.16", "0.5.18"]


@pytest.mark.parametrize("version", list(EXPECTED))
def test_each_algorithm_plans_the_worker_the_release_builds(version):
    planned = {}
    for algorithm in ALGORITHMS:
        plan = build_plan(analysis(version), 64, f"--speculative-algorithm {algorithm}")
        planned[algorithm] = (plan.family, plan.worker)
    assert planned == dict(zip(ALGORITHMS, EXPECTED[version], strict=True))


@pytest.mark.parametrize("version", WITH_CP_STRATEGY_KIND)
def test_the_algorithm_is_the_class_the_workers_are_chosen_by(version):
    a = analysis(version)
    # The context-parallel enum is built from a setting too, and sorts before the algorithm by
    # qualified name: a finder that took the first such class read `cp_strategy` as the algorithm.
    cp = (release(version).root / "srt" / "layers" / "cp" / "base.py").read_text(encoding="utf-8")
    assert "ContextParallelStrategyKind.from_string(server_args.cp_strategy)" in cp
    built = [qn for qn in a.codebase.find("from_string") if qn.startswith("sglang.srt.")]
    assert built.index("sglang.srt.layers.cp.base.ContextParallelStrategyKind.from_string") < \
        built.index("sglang.srt.speculative.spec_info.SpeculativeAlgorithm.from_string")
    algorithm = find_algorithm(a.codebase, a.spec_map)
    assert algorithm is not None
    assert algorithm.cls.endswith(".SpeculativeAlgorithm") and algorithm.setting == "speculative_algorithm"
    assert {"is_eagle", "is_ngram", "is_standalone"} <= set(algorithm.predicates)


@pytest.mark.parametrize("version", WITH_CP_STRATEGY_KIND)
def test_plan_explains_the_launch_by_the_algorithm_not_the_cp_strategy(version):
    why = {d.setting: d.value for d in build_plan(analysis(version), 64, "").why}
    assert why.get("speculative_algorithm") == "EAGLE3" and "cp_strategy" not in why, why


def test_ngram_on_0_5_16_exits_1_with_one_line():
    release("0.5.16")
    line = error_line(eaglegate("plan", "--version", "0.5.16", "--flags", "--speculative-algorithm NGRAM", "--json"))
    assert line.startswith("error: no gate for this launch: no EAGLE worker is selected under these flags "
                           "(--speculative-algorithm NGRAM")
