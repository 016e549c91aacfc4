"""Couplings on real SGLang releases: the findings the issue names, each checked at its line.

One analysis per version (module-scoped), shared by every test of that version.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from eaglegate.analyzer.couplings import CouplingReport, Finding, find_couplings
from eaglegate.analyzer.source import SourceTree
from eaglegate.analyzer.spec_map import build_map

from conftest import NEWEST, VERSIONS, release, spec_map

pytestmark = pytest.mark.slow

_reports: dict[str, CouplingReport] = {}
V1_VERSIONS = ["0.4.10.post2", "0.5.4", "0.5.9", "0.5.12.post1"]
_WIDTHS = {"num_tokens_per_bs", "captured_req_width"}
# 0.4.10.post2 sizes req_to_token at context_len + 4; num_draft_tokens widens the token
# pool there (draft_runner_cache_size), not the request-to-token table.
WIDENED_REQ_TO_TOKEN = [v for v in VERSIONS if v != "0.4.10.post2"]


@pytest.fixture(scope="module")
def report():
    def get(version: str) -> CouplingReport:
        if version not in _reports:
            # The analysis itself (no cache), from the session's shared map of the release.
            _reports[version] = find_couplings(release(version), spec_map(version), use_cache=False)
        return _reports[version]

    return get


def line_of(version: str, finding: Finding) -> str:
    """The source line a finding points at, read from the release."""
    text = (release(version).root / finding.path).read_text(encoding="utf-8")
    return text.splitlines()[finding.line - 1]


def chain_text(finding: Finding) -> str:
    return " | ".join(s.text for s in finding.evidence)


def pick(findings: list[Finding], **where) -> list[Finding]:
    found = []
    for f in findings:
        if all(re.search(pattern, str(getattr(f, key, f.detail.get(key, "")))) for key, pattern in where.items()):
            found.append(f)
    return found


@pytest.mark.parametrize("version", VERSIONS)
def test_target_graph_captured_in_verify_mode(report, version):
    r = report(version)
    modes = [f for f in r.kinds("capture_mode") if f.detail.get("role") == "target"
             and "TARGET_VERIFY" in line_of(version, f)]
    assert modes, "no target runner switched to TARGET_VERIFY under speculation"
    assert any("speculative_algorithm" in s.text for f in modes for s in f.evidence)
    # Tokens per request (`num_tokens_per_bs`; `captured_req_width` in the newest).
    width = [f for f in r.kinds("capture_width") if f.symbol.rsplit(".", 1)[-1] in _WIDTHS
             and f.detail.get("runner") == modes[0].detail["runner"]
             and "speculative_num_draft_tokens" in chain_text(f)]
    assert width, "tokens per request of the target runner"
    assert width[0].symbol.rsplit(".", 1)[-1] in line_of(version, width[0])


@pytest.mark.parametrize("version", VERSIONS)
def test_target_input_buffers_sized_from_draft_tokens(report, version):
    r = report(version)
    buffers = [f for f in r.kinds("alloc") if f.detail["graph_bound"]
               and "speculative_num_draft_tokens" in chain_text(f)
               and re.search(r"torch\.(zeros|empty|full|ones)", line_of(version, f))
               and ("max_num_token" in line_of(version, f) or "max_num_token" in chain_text(f))]
    assert buffers, "graph input buffers sized from num_draft_tokens"
    assert all(f.severity == "blocks-runtime-switch" for f in buffers)


@pytest.mark.parametrize("version", VERSIONS)
def test_draft_runners_fixed_widths(report, version):
    r = report(version)
    widths = [f for f in r.kinds("capture_width") if f.detail.get("role") == "draft"
              and f.symbol.rsplit(".", 1)[-1] in _WIDTHS]
    runners = {f.detail["runner"].rsplit(".", 1)[-1] for f in widths}
    assert any("DraftCudaGraphRunner" in name for name in runners), runners
    assert any("DraftExtend" in name for name in runners), runners
    for f in widths:
        assert f.symbol.rsplit(".", 1)[-1] in line_of(version, f)
        assert f.source.split(".")[-1].startswith("speculative_") or "speculative_" in chain_text(f)


@pytest.mark.parametrize("version", VERSIONS)
def test_attention_backend_keeps_num_draft_tokens(report, version):
    r = report(version)
    kept = [f for f in r.kinds("backend_width") if "num_draft_tokens" in f.symbol.rsplit(".", 1)[-1]]
    assert kept
    assert all("num_draft_tokens" in line_of(version, f) for f in kept)


@pytest.mark.parametrize("version", V1_VERSIONS)
def test_v1_verify_appends_output_tokens(report, version):
    r = report(version)
    appends = [f for f in r.kinds("verify_appends") if f.detail["container"] == "output_ids"]
    assert appends and all(f.worker_path == "v1" for f in appends)
    assert all("output_ids.append" in line_of(version, f) for f in appends)


@pytest.mark.parametrize("version", V1_VERSIONS)
def test_decode_preparation_returns_early_under_spec(report, version):
    r = report(version)
    early = [f for f in r.kinds("early_return") if f.symbol.endswith("ScheduleBatch.prepare_for_decode")]
    assert early
    assert "spec_algorithm" in line_of(version, early[0])
    assert "speculative_algorithm" in early[0].source


@pytest.mark.parametrize("version", WIDENED_REQ_TO_TOKEN)
def test_req_to_token_widened_by_draft_tokens(report, version):
    r = report(version)
    widened = [f for f in r.kinds("alloc") if "req_to_token" in line_of(version, f)
               and "speculative_num_draft_tokens" in chain_text(f)]
    assert widened, "request-to-token table widened by num_draft_tokens"


@pytest.mark.parametrize("version", VERSIONS)
def test_running_request_cap_reset_to_48(report, version):
    r = report(version)
    caps = [f for f in r.kinds("setting_changed") if f.detail["setting"] == "max_running_requests"
            and f.detail["value"] == "48"]
    assert caps
    for f in caps:
        assert "max_running_requests" in line_of(version, f) and "48" in line_of(version, f)
        assert f.severity == "needs-config-change" and "speculative_" in f.source


def test_newest_has_native_adaptive_zero_steps_as_the_alternative(report):
    r = report(NEWEST)
    zero = r.kinds("zero_steps")
    assert zero and all(f.worker_path == "v2" for f in zero)
    assert re.search(r"speculative_num_steps\s*==\s*0", line_of(NEWEST, zero[0]))
    # The zero-step tier is the no-patch alternative; the route is the gated plain decode.
    verdict = r.verdict("v2")
    assert verdict is not None and verdict.status == "feasible" and "DECODE" in verdict.route
    assert any("zero-step tier" in reason and zero[0].where in reason for reason in verdict.reasons)
    assert zero[0] in verdict.findings


def test_0_5_9_verdicts(report):
    r = report("0.5.9")
    v1, v2 = r.verdict("v1"), r.verdict("v2")
    assert v1 is not None and v1.status == "feasible" and "DECODE" in v1.route
    # The worker gets a copy of the batch, but its draft input's decode preparation
    # reserves the step's KV on the scheduler's batch: the overlap gate's route.
    assert v2 is not None and v2.status == "feasible" and "draft input" in v2.route
    for verdict in (v1, v2):
        assert verdict.findings and any(re.search(r"\.py:\d+", reason) for reason in verdict.reasons)
        assert any(f.kind == "capture_mode" for f in verdict.findings)


@pytest.mark.parametrize("version", VERSIONS)
def test_precision_sample_chains_start_at_a_speculative_setting(report, version):
    r = report(version)
    assert r.findings
    sample = r.findings[:: max(1, len(r.findings) // 25)]
    for f in sample:
        assert f.evidence, f
        first = f.evidence[0].text
        assert "speculative_" in first, (f.kind, f.where, first)
        assert f.evidence[-1].line > 0
    # Nothing outside the files the analysis read.
    read = set(r.scope["modules_read"])
    assert {f.path for f in r.findings} <= read


@pytest.mark.parametrize("version", VERSIONS)
def test_json_schema(report, version):
    data = report(version).to_json()
    assert data["schema"] == "eaglegate.couplings/1"
    assert data["sglang"]["version"] == version
    assert {"category", "kind", "symbol", "site", "evidence", "reason", "worker_path", "severity"} <= set(
        data["findings"][0])
    assert {v["worker_path"] for v in data["verdicts"]} == {"v1", "v2"}


def _answer(r: CouplingReport) -> dict:
    return {k: v for k, v in r.to_json().items() if k not in ("timing_s", "sglang")}


def test_cached_report_is_the_analysis(report):
    """A second run reads the report back, and it is the one the analysis makes."""
    tree = release("0.5.9")
    find_couplings(tree)  # computes and stores it, unless a previous run did
    again = find_couplings(tree)
    assert "cached" in again.timing and "dataflow" not in again.timing
    assert _answer(again) == _answer(report("0.5.9"))
    assert again.root == str(tree.root) and again.version == "0.5.9"


def test_cache_never_serves_a_changed_tree(tmp_path):
    """Edit the line that caps running requests at 48 in a copy: the copy's report says 32."""
    tree = release("0.5.9")
    find_couplings(tree)
    copy = tmp_path / "sglang"
    shutil.copytree(tree.root, copy)
    server_args = copy / "srt" / "server_args.py"
    text = server_args.read_text(encoding="utf-8")
    assert re.search(r"max_running_requests = 48\b", text)
    server_args.write_text(re.sub(r"max_running_requests = 48\b", "max_running_requests = 32", text),
                           encoding="utf-8")
    changed = find_couplings(SourceTree(copy, "0.5.9", "path"))
    values = {f.detail["value"] for f in changed.kinds("setting_changed")
              if f.detail["setting"] == "max_running_requests"}
    assert "32" in values and "48" not in values


def test_same_map_analysed_twice_gives_the_same_report():
    """The call graph is shared and grows with each query; the report must not depend on that."""
    tree = release("0.5.9")
    spec_map = build_map(tree)
    first = find_couplings(tree, spec_map, use_cache=False)
    second = find_couplings(tree, spec_map, use_cache=False)
    assert _answer(first) == _answer(second)


def _cli(*args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | {"COLUMNS": "250"}
    proc = subprocess.run([sys.executable, "-m", "eaglegate", "couplings", "--version", "0.5.9", *args],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_cli_couplings_verdicts_first_then_grouped_tables(report):
    r = report("0.5.9")
    text = _cli()
    v1 = r.verdict("v1")
    assert v1 is not None and v1.cls is not None
    # The answer comes first: what the launch selects, both verdicts, then the tables.
    assert text.index("selects: worker_path") < text.index(f"{v1.cls}: feasible") < text.index("v2 ") \
        < text.index("cuda_graph (")
    # Each blocking capture-mode finding is listed with its site; compatible ones are counted, not listed.
    for f in r.kinds("capture_mode"):
        assert re.search(rf"{re.escape(f.path)}:(\d+,)*{f.line}\b", text), f.where
    compatible = [f for f in r.findings if f.severity == "compatible"]
    assert compatible and re.search(r"not listed: \d+ compatible", text)
    shown_all = _cli("--all", "--category", "buffer")
    assert "not listed" not in shown_all and "compatible" in shown_all
    assert "cuda_graph · " not in shown_all and "buffer · " in shown_all


def test_report_does_not_depend_on_the_hash_seed():
    """Memoized lookups with a cycle guard answer by the order they run in; that order must not
    follow set hashing. 0.5.12.post1 gave two different sets of findings under seeds 0 and 4."""
    script = ("import hashlib, json, sys\n"
              "from eaglegate.analyzer.couplings import find_couplings\n"
              "from eaglegate.analyzer.source import locate\n"
              "r = find_couplings(locate(version='0.5.12.post1'), use_cache=False)\n"
              "j = {k: v for k, v in r.to_json().items() if k not in ('timing_s', 'sglang')}\n"
              "print(hashlib.sha256(json.dumps(j, sort_keys=True).encode()).hexdigest())\n")
    release("0.5.12.post1")
    digests = set()
    for seed in ("0", "4"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr
        digests.add(proc.stdout.strip())
    assert len(digests) == 1
