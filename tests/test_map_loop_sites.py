"""Each event loop reaches the worker through its own call site (issue 45): on the releases
that build only the overlap worker, the non-overlap loop calls it where `run_batch` runs
without the overlap scheduler, not through the overlap-only call, on real releases."""

from __future__ import annotations

import ast

import pytest

from conftest import release, spec_map

V2_ONLY = ["0.5.15.post1", "0.5.21", "0.5.23"]


def _overlap_test(version: str, site) -> bool | None:
    """Whether the call at `site` sits under `self.enable_overlap` (True), its negation
    (False) or neither (None), read from the release's own line and its conditions."""
    for text in site.cond:
        node = ast.parse(text, mode="eval").body
        if isinstance(node, ast.Attribute) and node.attr == "enable_overlap":
            return True
        if isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Attribute) \
                and node.operand.attr == "enable_overlap":
            return False
    return None


@pytest.mark.parametrize("version", V2_ONLY)
def test_each_loop_reaches_the_overlap_worker_through_its_own_call_site(version):
    m = spec_map(version)
    worker = next(w for w in m.workers if w.label == "v2")
    assert not next(w for w in m.workers if w.label == "v1").present
    paths = {p.event_loop.rsplit(".", 1)[-1]: p for p in worker.paths}
    normal, overlap = paths["event_loop_normal"], paths["event_loop_overlap"]
    last_normal, last_overlap = normal.hops[-1], overlap.hops[-1]
    assert last_normal.callee == last_overlap.callee == worker.entry
    assert last_normal.site.where != last_overlap.site.where
    assert _overlap_test(version, last_overlap.site) is True
    assert _overlap_test(version, last_normal.site) is False
    for site in [last_normal.site, *last_normal.also]:
        assert _overlap_test(version, site) is False
        # The line is the worker's call.
        path, lineno = site.where.rsplit(":", 1)
        lines = (release(version).root / path).read_text(encoding="utf-8").splitlines()
        assert "forward_batch_generation" in "".join(lines[int(lineno) - 1:int(lineno) + 1])
    data = normal.to_json()
    assert data["hops"][-1]["also_at"] == [{"site": s.where, "condition": list(s.cond)} for s in last_normal.also]


def test_a_loop_that_cannot_run_the_overlap_worker_is_not_mapped_to_it():
    # 0.5.9 builds either worker: the non-overlap loop reaches only v1, the overlap loop only v2.
    m = spec_map("0.5.9")
    loops = {w.label: {p.event_loop.rsplit(".", 1)[-1] for p in w.paths} for w in m.workers}
    assert "event_loop_normal" in loops["v1"] and "event_loop_normal" not in loops["v2"]
    assert "event_loop_overlap" in loops["v2"] and "event_loop_overlap" not in loops["v1"]
