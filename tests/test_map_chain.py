"""`map --json`'s call chain: from each worker's entry through its helpers and steps, the calls
into the worker's package and the model calls (the target extend, the verify's and the draft
extend's forwards, tree building, v2's verify preparation and sampling), and the scheduler's
own calls from its loop and result processing (deferred sampling, the overlap token
resolution), each at a line of the release's source that holds the call."""

from __future__ import annotations

import pytest
from test_map_releases import line

from conftest import release, spec_map

RELEASES = ["0.5.4", "0.5.9", "0.5.12.post1"]


def _calls(calls, caller: str, callee: str) -> list:
    return [c for c in calls if c.caller.endswith("." + caller) and c.callee.endswith("." + callee)]


def _held(version: str, call) -> bool:
    name = call.callee.rsplit(".", 1)[-1]
    return name in line(release(version).root, call.site.where) or name == "__init__"


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_v1_chain_through_the_target_extend_tree_and_verify(version):
    v1 = spec_map(version).worker("v1")
    chain = v1.chain
    assert chain and all(_held(version, c) for c in chain if c.kind == "call")
    extend = _calls(chain, "forward_batch_generation", "forward_target_extend")
    assert extend and extend[0].site.cond  # only for extend batches
    target = _calls(chain, "forward_target_extend", "forward_batch_generation")
    assert target and target[0].kind == "model"
    assert _calls(chain, "verify", "forward_batch_generation")[0].kind == "model"
    assert _calls(chain, "draft", "build_tree_kernel_efficient")
    assert _calls(chain, "forward_draft_extend_after_decode", "prepare_extend_after_decode")


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_v2_chain_through_verify_preparation_and_sampling(version):
    v2 = spec_map(version).worker("v2")
    chain = v2.chain
    assert _calls(chain, "verify", "prepare_for_v2_verify") and _calls(chain, "verify", "sample")
    assert _calls(chain, "verify", "forward_batch_generation")[0].kind == "model"
    assert _calls(chain, "draft", "prepare_for_v2_draft")
    assert _calls(chain, "_draft_extend_for_decode", "prepare_for_extend_to_fill_draft_kvcache")
    prefill = _calls(chain, "forward_batch_generation", "forward_batch_generation")
    assert prefill and prefill[0].kind == "model" and prefill[0].site.cond


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_scheduler_deferred_sampling_and_overlap_token_resolution(version):
    v2 = spec_map(version).worker("v2")
    calls = v2.scheduler_calls
    assert all(_held(version, c) for c in calls)
    assert _calls(calls, "event_loop_overlap", "launch_batch_sample_if_needed")
    # `_resolve_spec_overlap_token_ids`, `_resolve_spec_overlap_tokens` from 0.5.12.
    resolve = [c for c in calls if "_resolve_spec_overlap_token" in c.callee]
    assert resolve and resolve[0].site.cond  # only for speculative results
    assert resolve[0].caller.endswith("process_batch_result_decode")


def test_chain_is_in_the_json(release_tree):
    data = spec_map("0.5.9").to_json()
    for worker in data["workers"]:
        assert worker["call_chain"] and worker["scheduler_calls"]
        assert all({"kind", "caller", "callee", "site", "condition"} <= set(c) for c in worker["call_chain"])
