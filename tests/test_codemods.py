"""Each gate transform on a small hand-written source: the exact text it writes, that a
second run leaves it unchanged, and its refusals (anchor missing, anchor found twice,
file patched by half). The real releases are tested in tests/test_patch_*.py."""

from __future__ import annotations

import textwrap
from collections.abc import Callable

import pytest

from eaglegate.errors import UserError
from eaglegate.patches.codemods import (
    scheduler_metrics,
    server_args,
    spec_alloc_tolist,
    spec_metrics_log,
    speculative_hook,
    v1_worker,
    v2_decode_prep,
    v2_worker,
)
from eaglegate.patches.codemods.common import AnchorError, gate_import

from conftest import release

Transform = Callable[[str, str], str]
GATE_IMPORT = "from sglang.srt.speculative.batch_gate import "


def assert_codemod(transform: Transform, before: str, after: str) -> None:
    """`before` becomes exactly `after`, and `after` is left as it is."""
    assert transform(before, "f.py") == after
    assert transform(after, "f.py") == after


def assert_refuses(transform: Transform, source: str, message: str, error: type = AnchorError) -> None:
    with pytest.raises(error) as raised:
        transform(source, "f.py")
    assert message in str(raised.value)


# --- v1_worker -------------------------------------------------------------------------

V1_BEFORE = '''import torch


class EAGLEWorker:
    def __init__(self, server_args):
        self.server_args = server_args

    def forward_batch_generation(self, batch):
        # extend: the target, then the draft
        if batch.forward_mode.is_extend():
            logits, next_token_ids, bid = self.forward_target_extend(batch)
            self.forward_draft_extend(batch, next_token_ids)
            return logits, next_token_ids, bid
        return self.draft(batch)

    def forward_target_extend(self, batch):
        pass

    def forward_draft_extend(self, batch, next_token_ids):
        pass
'''

V1_AFTER = '''import torch
from sglang.srt.speculative.batch_gate import finish_gated_decode, init_batch_gate, prepare_gated_decode


class EAGLEWorker:
    def __init__(self, server_args):
        self.server_args = server_args
        init_batch_gate(self)  # eaglegate: the gate and the target's DECODE graphs

    def forward_batch_generation(self, batch):
        # extend: the target, then the draft
        _eaglegate_gated = prepare_gated_decode(self, batch)  # eaglegate: batch-size gate
        if _eaglegate_gated or batch.forward_mode.is_extend():
            logits, next_token_ids, bid = self.forward_target_extend(batch)
            if not _eaglegate_gated:
                self.forward_draft_extend(batch, next_token_ids)
            if _eaglegate_gated:
                finish_gated_decode(self, batch, next_token_ids)
            return logits, next_token_ids, bid
        return self.draft(batch)

    def forward_target_extend(self, batch):
        pass

    def forward_draft_extend(self, batch, next_token_ids):
        pass
'''

V1_EXTEND_TEST = "        if batch.forward_mode.is_extend():\n"


def test_v1_worker():
    assert_codemod(v1_worker.patch_worker, V1_BEFORE, V1_AFTER)
    assert v1_worker.entry_method_name(V1_BEFORE) == "forward_batch_generation"


def test_v1_worker_refuses_a_missing_extend_branch():
    source = V1_BEFORE.replace("is_extend()", "is_decode()")
    assert_refuses(v1_worker.patch_worker, source,
                   "top-level `if ...forward_mode.is_extend()` extend branch in f.py matched 0 site(s)")


def test_v1_worker_refuses_two_extend_branches():
    source = V1_BEFORE.replace(V1_EXTEND_TEST, V1_EXTEND_TEST + "            pass\n" + V1_EXTEND_TEST, 1)
    assert_refuses(v1_worker.patch_worker, source,
                   "top-level `if ...forward_mode.is_extend()` extend branch in f.py matched 2 site(s)")


def test_v1_worker_refuses_a_half_patched_file():
    half = V1_AFTER.replace(GATE_IMPORT + "finish_gated_decode, init_batch_gate, prepare_gated_decode\n", "")
    assert_refuses(v1_worker.patch_worker, half, "f.py is partially patched", UserError)


# --- v2_worker -------------------------------------------------------------------------

V2_BEFORE = '''import torch


class EAGLEWorkerV2:
    def __init__(self, server_args):
        self.server_args = server_args

    def forward_batch_generation(self, batch):
        if batch.forward_mode.is_decode():
            return self.draft_worker.draft(batch)
        else:
            return self._draft_extend_for_prefill(batch)
'''

V2_AFTER = '''import torch
from sglang.srt.speculative.batch_gate import init_overlap_batch_gate, is_gated_decode, is_gated_prefill, run_gated_decode, run_gated_prefill


class EAGLEWorkerV2:
    def __init__(self, server_args):
        self.server_args = server_args
        init_overlap_batch_gate(self)  # eaglegate: the gate and the target's DECODE graphs

    def forward_batch_generation(self, batch):
        if batch.forward_mode.is_decode():
            if is_gated_decode(batch):  # eaglegate: batch-size gate
                return run_gated_decode(self, batch)
            return self.draft_worker.draft(batch)
        else:
            if is_gated_prefill(batch):  # eaglegate: batch-size gate
                return run_gated_prefill(self, batch)
            return self._draft_extend_for_prefill(batch)
'''


def test_v2_worker():
    assert_codemod(v2_worker.patch_worker, V2_BEFORE, V2_AFTER)


def test_v2_worker_refuses_a_missing_draft_branch():
    source = V2_BEFORE.replace("self.draft_worker.draft(batch)", "self.decode(batch)")
    assert_refuses(v2_worker.patch_worker, source,
                   "top-level if/else with one branch calling self.draft_worker.draft(...) or self.draft(...) "
                   "in f.py matched 0 site(s)")


def test_v2_worker_refuses_two_draft_branches():
    branch = V2_BEFORE[V2_BEFORE.index("        if batch"):]
    assert_refuses(v2_worker.patch_worker, V2_BEFORE + branch,
                   "top-level if/else with one branch calling self.draft_worker.draft(...) or self.draft(...) "
                   "in f.py matched 2 site(s)")


def test_v2_worker_refuses_a_half_patched_file():
    half = V2_AFTER.replace(V2_AFTER.splitlines(keepends=True)[1], "")
    assert_refuses(v2_worker.patch_worker, half, "f.py is partially patched", UserError)


# --- v2_decode_prep --------------------------------------------------------------------

PREP_BEFORE = '''import torch


class EagleDraftInputV2Mixin:
    def prepare_for_decode(self, batch):
        for r in batch.reqs:
            x = r.kv_committed_len + 2 * self.ALLOC_LEN_PER_DECODE - r.kv_allocated_len
'''

PREP_AFTER = '''import torch
from sglang.srt.speculative.batch_gate import decode_alloc_len


class EagleDraftInputV2Mixin:
    def prepare_for_decode(self, batch):
        for r in batch.reqs:
            x = max(0, r.kv_committed_len + 2 * decode_alloc_len(self, batch, self.ALLOC_LEN_PER_DECODE) - r.kv_allocated_len)
'''


def test_v2_decode_prep():
    assert_codemod(v2_decode_prep.patch_decode_prep, PREP_BEFORE, PREP_AFTER)


def test_v2_decode_prep_keeps_a_clamp_the_release_has():
    before = PREP_BEFORE.replace(
        "r.kv_committed_len + 2 * self.ALLOC_LEN_PER_DECODE - r.kv_allocated_len",
        "max(r.kv_allocated_len, r.kv_committed_len + get_alloc_len_per_decode())",
    )
    after = PREP_AFTER.replace(
        "max(0, r.kv_committed_len + 2 * decode_alloc_len(self, batch, self.ALLOC_LEN_PER_DECODE) - r.kv_allocated_len)",
        "max(r.kv_allocated_len, r.kv_committed_len + decode_alloc_len(self, batch, get_alloc_len_per_decode()))",
    )
    assert_codemod(v2_decode_prep.patch_decode_prep, before, after)


def test_v2_decode_prep_refuses_a_missing_reservation():
    source = PREP_BEFORE.replace("self.ALLOC_LEN_PER_DECODE", "4")
    assert_refuses(v2_decode_prep.patch_decode_prep, source, "the per-request reservation")


def test_v2_decode_prep_refuses_two_reservations():
    source = PREP_BEFORE.replace("2 * self.ALLOC_LEN_PER_DECODE", "self.ALLOC_LEN_PER_DECODE * self.ALLOC_LEN_PER_DECODE")
    assert_refuses(v2_decode_prep.patch_decode_prep, source, "matched 2 site(s), expected 1")


def test_v2_decode_prep_refuses_a_half_patched_file():
    half = PREP_AFTER.replace(GATE_IMPORT + "decode_alloc_len\n", "")
    assert_refuses(v2_decode_prep.patch_decode_prep, half, "f.py is partially patched", UserError)


# --- server_args -----------------------------------------------------------------------

ARGS_BEFORE = '''import dataclasses
from typing import Optional


@dataclasses.dataclass
class ServerArgs:
    speculative_num_draft_tokens: Optional[int] = None
    max_running_requests: Optional[int] = None

    def __post_init__(self):
        if self.speculative_algorithm in ("EAGLE", "EAGLE3"):
            if self.max_running_requests is None:
                self.max_running_requests = 48

    @staticmethod
    def add_cli_args(parser):
        parser.add_argument(
            "--speculative-num-draft-tokens",
            type=int,
            default=ServerArgs.speculative_num_draft_tokens,
            help="Draft tokens per step.",
        )
'''

ARGS_AFTER = '''import dataclasses
from typing import Optional


@dataclasses.dataclass
class ServerArgs:
    speculative_num_draft_tokens: Optional[int] = None
    speculative_batch_gate_threshold: Optional[int] = None  # eaglegate: off when None
    speculative_depth_table: Optional[str] = None  # eaglegate: off when None
    max_running_requests: Optional[int] = None

    def __post_init__(self):
        if self.speculative_algorithm in ("EAGLE", "EAGLE3"):
            if self.max_running_requests is None and not self.speculative_batch_gate_threshold:
                self.max_running_requests = 48

    @staticmethod
    def add_cli_args(parser):
        parser.add_argument(
            "--speculative-num-draft-tokens",
            type=int,
            default=ServerArgs.speculative_num_draft_tokens,
            help="Draft tokens per step.",
        )
        parser.add_argument(
            "--speculative-batch-gate-threshold",
            type=int,
            default=ServerArgs.speculative_batch_gate_threshold,
            help="EAGLE batch-size gate: while the running batch is larger than this, run plain one-token decode steps instead of speculating; speculation resumes once the batch shrinks below a lower mark. Off when unset; also read from SGLANG_SPEC_BATCH_GATE_THRESHOLD. Added by eaglegate.",
        )
        parser.add_argument(
            "--speculative-depth-table",
            type=str,
            default=ServerArgs.speculative_depth_table,
            help="EAGLE depth gate (overlap worker): a JSON table, inline or the path of a file, of the speculative depth per batch-size and context band (0 runs plain decode steps). Off when unset; also read from SGLANG_SPEC_DEPTH_TABLE. Added by eaglegate.",
        )
'''

ARGS_RESET = "            if self.max_running_requests is None:\n                self.max_running_requests = 48\n"


def _without_cap_guard(source: str, file: str) -> str:
    return server_args.patch_server_args(source, file, cap_guard=False)


def test_server_args():
    assert_codemod(server_args.patch_server_args, ARGS_BEFORE, ARGS_AFTER)


def test_server_args_without_the_cap_guard():
    after = ARGS_AFTER.replace(" and not self.speculative_batch_gate_threshold", "")
    assert_codemod(_without_cap_guard, ARGS_BEFORE, after)


def test_server_args_refuses_a_missing_anchor_field():
    source = ARGS_BEFORE.replace("    speculative_num_draft_tokens: Optional[int] = None\n", "")
    assert_refuses(server_args.patch_server_args, source,
                   "anchor ServerArgs.speculative_num_draft_tokens: dataclass field in f.py matched 0 site(s)")


def test_server_args_refuses_two_cap_resets_in_the_eagle_branch():
    source = ARGS_BEFORE.replace(ARGS_RESET, ARGS_RESET * 2)
    assert_refuses(server_args.patch_server_args, source, "inside the EAGLE branch in f.py matched 2 site(s)")


def test_server_args_refuses_a_half_patched_file():
    half = ARGS_AFTER.replace(" and not self.speculative_batch_gate_threshold", "")
    assert_refuses(server_args.patch_server_args, half, "f.py is partially patched", UserError)


def test_server_args_refuses_a_file_patched_before_the_depth_table():
    """A file with the threshold alone (patched before the depth gate had a flag) is half
    patched for this patch: restoring it first is the one way to a whole one."""
    without = ARGS_AFTER.replace("    speculative_depth_table: Optional[str] = None  # eaglegate: off when None\n", "")
    assert_refuses(server_args.patch_server_args, without, "f.py is partially patched", UserError)


def test_annotated_fields_on_a_real_release_take_the_anchors_optional_of_their_type():
    """0.5.16 declares its flags by annotated fields: the gate's follow the anchor, each the
    anchor's optional of its own type; a file with the threshold alone (patched before the
    depth gate had a flag, or with its field removed) is refused as half patched, while a
    patch that declares the threshold alone (the v1 worker's) leaves it as it is."""
    rel = "srt/server_args.py"
    source = (release("0.5.16").root / rel).read_text()
    after = server_args.patch_annotated_field(source, rel)
    lines = after.splitlines()
    anchor = next(i for i, line in enumerate(lines) if line.startswith("    speculative_num_draft_tokens: A["))
    added = [line for line in lines if "# eaglegate: off when None" in line]
    assert len(added) == 2 and lines.index(added[0]) > anchor
    assert added[0].startswith('    speculative_batch_gate_threshold: A[Optional[int], "EAGLE batch-size gate')
    assert added[1].startswith('    speculative_depth_table: A[Optional[str], "EAGLE depth gate')
    assert server_args.patch_annotated_field(after, rel) == after
    without = "\n".join(line for line in lines if line != added[1]) + "\n"
    assert_refuses(server_args.patch_annotated_field, without, "f.py is partially patched", UserError)
    # In the words `apply` uses for a tree another eaglegate patched, the usual cause.
    assert_refuses(server_args.patch_annotated_field, without,
                   "`eaglegate revert`, then `eaglegate apply`, installs this one's", UserError)
    threshold_only = server_args.gate_arguments(overlap_worker=False)
    assert server_args.patch_annotated_field(without, rel, threshold_only) == without


# --- speculative_hook ------------------------------------------------------------------

HOOK_BEFORE = '''def _handle_eagle_family(args):
    if args.max_running_requests is None:
        args.max_running_requests = 48
'''

HOOK_AFTER = '''def _handle_eagle_family(args):
    if args.max_running_requests is None and not args.speculative_batch_gate_threshold:
        args.max_running_requests = 48
'''


def test_speculative_hook():
    assert_codemod(speculative_hook.patch_speculative_hook, HOOK_BEFORE, HOOK_AFTER)


def test_speculative_hook_refuses_a_missing_cap_reset():
    source = HOOK_BEFORE.replace("= 48", "= args.cuda_graph_max_bs")
    assert_refuses(speculative_hook.patch_speculative_hook, source, "matched 0 site(s)")


def test_speculative_hook_refuses_two_cap_resets():
    source = HOOK_BEFORE + HOOK_BEFORE[HOOK_BEFORE.index("    if"):]
    assert_refuses(speculative_hook.patch_speculative_hook, source, "matched 2 site(s)")


def test_speculative_hook_refuses_a_missing_hook():
    source = HOOK_BEFORE.replace("_handle_eagle_family", "_handle_ngram")
    assert_refuses(speculative_hook.patch_speculative_hook, source,
                   "anchor _handle_eagle_family: module-level function definition in f.py matched 0 site(s)")


# --- scheduler_metrics -----------------------------------------------------------------

SCHED_BEFORE = '''class SchedulerOutputProcessorMixin:
    def process_batch_result_decode(self, batch, result):
        if not self.spec_algorithm.is_none():
            self.update_spec_metrics(batch.batch_size(), result.num_accepted_tokens)
'''

SCHED_AFTER = '''class SchedulerOutputProcessorMixin:
    def process_batch_result_decode(self, batch, result):
        if (not self.spec_algorithm.is_none()) and not (getattr(batch, 'eaglegate_gated_step', False) or getattr(result, 'eaglegate_gated_step', False)):
            self.update_spec_metrics(batch.batch_size(), result.num_accepted_tokens)
'''


def test_scheduler_metrics():
    assert_codemod(scheduler_metrics.patch_scheduler_metrics, SCHED_BEFORE, SCHED_AFTER)
    assert scheduler_metrics.counts_spec_metrics(SCHED_BEFORE)


def test_scheduler_metrics_refuses_a_missing_update():
    source = SCHED_BEFORE.replace("process_batch_result_decode", "process_batch_result_prefill")
    assert_refuses(scheduler_metrics.patch_scheduler_metrics, source,
                   "anchor process_batch_result_decode: `if ...: self[.<reporter>].update_spec_metrics(...)` in f.py "
                   "matched 0 site(s)")


def test_scheduler_metrics_refuses_two_updates():
    body = SCHED_BEFORE[SCHED_BEFORE.index("        if"):]
    assert_refuses(scheduler_metrics.patch_scheduler_metrics, SCHED_BEFORE + body, "matched 2 site(s)")


# --- spec_metrics_log ------------------------------------------------------------------

LOG_BEFORE = '''class SchedulerMetricsMixin:
    def log_decode_stats(self):
        if self.spec_algorithm.is_none():
            msg = ""
        else:
            accept_length = self.spec_num_accepted_tokens / self.spec_num_forward_ct
            msg = f"accept len: {accept_length:.2f}"
'''

LOG_AFTER = '''class SchedulerMetricsMixin:
    def log_decode_stats(self):
        if self.spec_algorithm.is_none() or not self.spec_num_forward_ct:
            msg = ""
        else:
            accept_length = self.spec_num_accepted_tokens / self.spec_num_forward_ct
            msg = f"accept len: {accept_length:.2f}"
'''


def test_spec_metrics_log():
    assert_codemod(spec_metrics_log.patch_spec_metrics_log, LOG_BEFORE, LOG_AFTER)


def test_spec_metrics_log_refuses_a_missing_division():
    source = LOG_BEFORE.replace(" / self.spec_num_forward_ct", "")
    assert_refuses(spec_metrics_log.patch_spec_metrics_log, source,
                   "anchor the decode stats: `if self[.scheduler].spec_algorithm.is_none(): ... else: accept length = accepted / forward_ct` in f.py matched 0 site(s)")


def test_spec_metrics_log_refuses_two_divisions():
    body = LOG_BEFORE[LOG_BEFORE.index("        if"):]
    assert_refuses(spec_metrics_log.patch_spec_metrics_log, LOG_BEFORE + body, "matched 2 site(s)")


# --- 0.5.14 on: the worker's graph init, its extra arguments, the prefill one call deeper ---

V2_ADAPTIVE_BEFORE = '''import torch


class EAGLEWorkerV2:
    def __init__(self, server_args):
        self.server_args = server_args

    def init_cuda_graphs(self):
        super().init_cuda_graphs()

    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
        if batch.forward_mode.is_extend():
            return self._forward_prefill_batch(batch, on_publish)
        else:
            return self.draft_worker.draft(batch)

    def _forward_prefill_batch(self, batch, on_publish):
        return self.draft_worker._draft_extend_for_prefill(batch)
'''


def test_v2_worker_on_the_adaptive_worker():
    after = v2_worker.patch_worker(V2_ADAPTIVE_BEFORE, "f.py")
    assert v2_worker.patch_worker(after, "f.py") == after
    passed = "self, batch, on_publish=on_publish, grammar_barrier=grammar_barrier, pp_proxy_tensors=pp_proxy_tensors"
    assert f"return run_gated_decode({passed})" in after and f"return run_gated_prefill({passed})" in after
    # Built after the target's graphs and the adaptive tiers, not in __init__.
    assert "super().init_cuda_graphs()\n        init_overlap_batch_gate(self)" in after
    assert after.count("init_overlap_batch_gate(self)") == 1


def test_v2_worker_refuses_an_argument_it_does_not_know():
    source = V2_ADAPTIVE_BEFORE.replace("pp_proxy_tensors=None)", "pp_proxy_tensors=None, extra=None)")
    assert_refuses(v2_worker.patch_worker, source, "parameters (self, batch) followed by")


def test_v2_worker_refuses_an_extend_branch_that_never_prefills_the_draft():
    source = V2_ADAPTIVE_BEFORE.replace("self.draft_worker._draft_extend_for_prefill(batch)", "batch")
    assert_refuses(v2_worker.patch_worker, source, "the extend branch beside it")


PREP_FUNCTION_BEFORE = '''import torch


def eagle_prepare_for_decode(batch):
    double_alloc = get_alloc_reserve_per_decode()
    lens = page_aligned_decode_alloc_lens(batch.reqs, reserve=double_alloc)
'''


def test_v2_decode_prep_function():
    after = v2_decode_prep.patch_prepare_function(PREP_FUNCTION_BEFORE, "f.py")
    assert "double_alloc = decode_alloc_len(batch.spec_info, batch, get_alloc_reserve_per_decode())" in after
    assert GATE_IMPORT + "decode_alloc_len\n" in after
    assert v2_decode_prep.patch_prepare_function(after, "f.py") == after


def test_v2_decode_prep_function_refuses_a_reservation_no_one_clamps():
    source = PREP_FUNCTION_BEFORE.replace("reserve=double_alloc", "reserve=8")
    assert_refuses(v2_decode_prep.patch_prepare_function, source, "the over-allocation")


FEED_BEFORE = '''class BatchResultProcessor:
    def _resolve_spec_v2_tokens(self, result, batch):
        self.model_worker.on_verify_complete_cpu(
            result.num_correct_drafts_per_req_cpu, batch_size=len(batch.reqs)
        )
'''

FEED_AFTER = '''class BatchResultProcessor:
    def _resolve_spec_v2_tokens(self, result, batch):
        if not getattr(result, 'eaglegate_gated_step', False):
            self.model_worker.on_verify_complete_cpu(
                result.num_correct_drafts_per_req_cpu, batch_size=len(batch.reqs)
            )
'''


def test_adaptive_feed():
    from eaglegate.patches.codemods import adaptive_feed

    assert_codemod(adaptive_feed.patch_adaptive_feed, FEED_BEFORE, FEED_AFTER)
    assert_refuses(adaptive_feed.patch_adaptive_feed, FEED_BEFORE + FEED_BEFORE.split("\n", 1)[1],
                   "matched 2 site(s)")


def test_scheduler_metrics_and_log_through_the_metrics_reporter():
    source = SCHED_BEFORE.replace("self.update_spec_metrics(", "self.metrics_reporter.update_spec_metrics(")
    assert "getattr(result, 'eaglegate_gated_step', False)" in scheduler_metrics.patch_scheduler_metrics(source, "f.py")
    log = LOG_BEFORE.replace("self.spec_algorithm.is_none()", "self.scheduler.spec_algorithm.is_none()")
    assert "if self.scheduler.spec_algorithm.is_none() or not " in spec_metrics_log.patch_spec_metrics_log(log, "f.py")


def test_the_gate_import_is_built_as_a_node():
    import libcst as cst

    # The bytes a transform inserts: a node, not source text pasted into the module.
    assert cst.Module(body=[gate_import(("a", "b"))]).code == "from sglang.srt.speculative.batch_gate import a, b\n"


# --- the window releases (0.5.3.post2 to 0.5.5.post3) ---------------------------------------

V2_SELF_DRAFT_BEFORE = '''import torch


class EAGLEWorkerV2(EAGLEWorker):
    def __init__(self, server_args):
        super().__init__(server_args)

    def forward_batch_generation(self, batch):
        if batch.forward_mode.is_decode():
            verify_input = self.draft(batch)
            return self.verify(batch, verify_input)
        else:
            out = self.target_worker.forward_batch_generation(batch)
            out.next_draft_input = self.forward_draft_extend(batch, out)
            return out
'''


def test_v2_worker_on_the_worker_that_drafts_itself():
    """0.5.3.x: `self.draft` and `self.forward_draft_extend`, the same edits."""
    after = v2_worker.patch_worker(V2_SELF_DRAFT_BEFORE, "f.py")
    assert "        if batch.forward_mode.is_decode():\n            if is_gated_decode(batch):" in after
    assert "        else:\n            if is_gated_prefill(batch):" in after
    assert "        super().__init__(server_args)\n        init_overlap_batch_gate(self)  # eaglegate" in after
    assert v2_worker.patch_worker(after, "f.py") == after


WINDOW_BEFORE = '''import torch


class EagleDraftInputV2Mixin:
    def prepare_for_decode(self, batch):
        if batch.page_size == 1:
            new_allocate_lens = batch.seq_lens + self.ALLOC_LEN_PER_DECODE
        else:
            new_allocate_lens = batch.seq_lens + self.ALLOC_LEN_PER_DECODE
        self.allocate_lens = new_allocate_lens
        for req in batch.reqs:
            req.kv_allocated_len = req.kv_committed_len + self.ALLOC_LEN_PER_DECODE
'''
WINDOW_AFTER = WINDOW_BEFORE.replace("import torch\n", "import torch\n" + GATE_IMPORT + "decode_alloc_window\n").replace(
    "batch.seq_lens + self.ALLOC_LEN_PER_DECODE",
    "batch.seq_lens + decode_alloc_window(self, batch, self.ALLOC_LEN_PER_DECODE)")


def test_v2_decode_prep_on_the_window_wraps_both_page_size_branches_only():
    """The bookkeeping line keeps its width: the window is unchanged, only decided."""
    assert_codemod(v2_decode_prep.patch_decode_prep, WINDOW_BEFORE, WINDOW_AFTER)
    assert "req.kv_committed_len + self.ALLOC_LEN_PER_DECODE" in WINDOW_AFTER


def test_v2_decode_prep_refuses_a_window_in_one_branch_only():
    source = WINDOW_BEFORE.replace("new_allocate_lens = batch.seq_lens + self.ALLOC_LEN_PER_DECODE",
                                   "new_allocate_lens = batch.seq_lens + 1", 1)
    assert_refuses(v2_decode_prep.patch_decode_prep, source, "one per page-size branch in f.py matched 1 site(s), "
                   "expected 2")


def test_v2_decode_prep_refuses_a_half_patched_window():
    half = WINDOW_AFTER.replace(GATE_IMPORT + "decode_alloc_window\n", "")
    assert_refuses(v2_decode_prep.patch_decode_prep, half, "f.py is partially patched", UserError)


BATCH_WINDOW_BEFORE = '''import torch


class ScheduleBatch:
    def allocate_for_eagle_v2(self):
        from sglang.srt.speculative.eagle_info import EagleDraftInput

        draft_input = self.spec_info
        new_allocate_lens = self.seq_lens + EagleDraftInput.ALLOC_LEN_PER_DECODE
        draft_input.allocate_lens = new_allocate_lens
'''


def test_v2_decode_prep_on_the_batchs_window():
    """0.5.3.x: the batch reserves the window itself; its draft input is `spec_info`."""
    after = BATCH_WINDOW_BEFORE.replace("import torch\n", "import torch\n" + GATE_IMPORT + "decode_alloc_window\n").replace(
        "self.seq_lens + EagleDraftInput.ALLOC_LEN_PER_DECODE",
        "self.seq_lens + decode_alloc_window(self.spec_info, self, EagleDraftInput.ALLOC_LEN_PER_DECODE)")
    assert_codemod(v2_decode_prep.patch_allocate_for_eagle_v2, BATCH_WINDOW_BEFORE, after)
    assert_refuses(v2_decode_prep.patch_allocate_for_eagle_v2,
                   BATCH_WINDOW_BEFORE.replace("def allocate_for_eagle_v2(", "def allocate("),
                   "ScheduleBatch.allocate_for_eagle_v2: method definition in f.py matched 0 site(s)")
    assert_refuses(v2_decode_prep.patch_allocate_for_eagle_v2,
                   BATCH_WINDOW_BEFORE.replace("EagleDraftInput.ALLOC_LEN_PER_DECODE", "2"),
                   "matched 0 site(s), expected 1")


# --- spec_alloc_tolist (SGLang PR #35377 backported) ----------------------------------------

ALLOC_BEFORE = """import torch


def alloc_for_spec_decode(tree_cache, *, reqs, nxt_kv_lens_cpu, num_needed_tokens):
    if num_needed_tokens > 0:
        tree_cache.alloc(num_needed_tokens)

    for i, req in enumerate(reqs):
        req.kv.kv_allocated_len = max(req.kv.kv_allocated_len, int(nxt_kv_lens_cpu[i]))
"""

ALLOC_AFTER = """import torch


def alloc_for_spec_decode(tree_cache, *, reqs, nxt_kv_lens_cpu, num_needed_tokens):
    if num_needed_tokens > 0:
        tree_cache.alloc(num_needed_tokens)

    nxt_kv_lens_list = nxt_kv_lens_cpu.tolist()  # eaglegate: backport of SGLang PR #35377
    for req, nxt_kv_len in zip(reqs, nxt_kv_lens_list, strict=True):
        req.kv.kv_allocated_len = max(req.kv.kv_allocated_len, nxt_kv_len)
"""
ALLOC_LOOP = (
    "    for i, req in enumerate(reqs):\n"
    "        req.kv.kv_allocated_len = max(req.kv.kv_allocated_len, int(nxt_kv_lens_cpu[i]))\n"
)


def test_spec_alloc_tolist():
    assert spec_alloc_tolist.reads_scalar_per_request(ALLOC_BEFORE, "f.py")
    assert_codemod(spec_alloc_tolist.patch_alloc_for_spec_decode, ALLOC_BEFORE, ALLOC_AFTER)
    assert not spec_alloc_tolist.reads_scalar_per_request(ALLOC_AFTER, "f.py")


def test_spec_alloc_tolist_finds_the_loop_under_other_names():
    before = ALLOC_BEFORE.replace(
        ALLOC_LOOP,
        "    for j, r in enumerate(batch.reqs):\n"
        "        r.kv.kv_allocated_len = max(r.kv.kv_allocated_len, int(lens[j]))\n",
    )
    after = spec_alloc_tolist.patch_alloc_for_spec_decode(before, "f.py")
    assert after.endswith(
        "    nxt_kv_lens_list = lens.tolist()  # eaglegate: backport of SGLang PR #35377\n"
        "    for r, nxt_kv_len in zip(batch.reqs, nxt_kv_lens_list, strict=True):\n"
        "        r.kv.kv_allocated_len = max(r.kv.kv_allocated_len, nxt_kv_len)\n"
    )
    assert spec_alloc_tolist.patch_alloc_for_spec_decode(after, "f.py") == after


def test_spec_alloc_tolist_leaves_the_list_form_alone():
    """0.5.19 on: upstream's own list form, with no mark, is already what the backport writes."""
    upstream = ALLOC_AFTER.replace("  # eaglegate: backport of SGLang PR #35377", "")
    assert not spec_alloc_tolist.reads_scalar_per_request(upstream, "f.py")
    assert spec_alloc_tolist.patch_alloc_for_spec_decode(upstream, "f.py") == upstream


@pytest.mark.parametrize(
    "near_miss",
    [
        # The loop does something else as well: the index is still needed.
        ALLOC_LOOP + "        req.kv.seen = i\n",
        # Another request's length, not this one's.
        ALLOC_LOOP.replace("nxt_kv_lens_cpu[i]", "nxt_kv_lens_cpu[i + 1]"),
        # Another attribute kept than the one set.
        ALLOC_LOOP.replace("max(req.kv.kv_allocated_len,", "max(req.kv_committed_len,"),
        # The length read without int(): a tensor, not the Python int the list form gives.
        ALLOC_LOOP.replace("int(nxt_kv_lens_cpu[i])", "nxt_kv_lens_cpu[i]"),
        # Not a statement of the function's own body.
        "    if reqs:\n" + textwrap.indent(ALLOC_LOOP, "    "),
    ],
)
def test_spec_alloc_tolist_leaves_a_near_miss_alone_and_refuses_to_rewrite_it(near_miss):
    """Not PR #35377's loop: `generate` does not pick the backport (the gate is right without
    it), and the transform, asked anyway, names what it did not find."""
    source = ALLOC_BEFORE.replace(ALLOC_LOOP, near_miss)
    assert source != ALLOC_BEFORE
    assert not spec_alloc_tolist.reads_scalar_per_request(source, "f.py")
    assert_refuses(
        spec_alloc_tolist.patch_alloc_for_spec_decode,
        source,
        "anchor alloc_for_spec_decode: the loop `for i, req in enumerate(reqs)",
    )


def test_spec_alloc_tolist_refuses_two_loops():
    source = ALLOC_BEFORE + ALLOC_LOOP
    assert spec_alloc_tolist.reads_scalar_per_request(source, "f.py")
    assert_refuses(
        spec_alloc_tolist.patch_alloc_for_spec_decode, source, "f.py matched 2 site(s), expected 1"
    )


@pytest.mark.parametrize(
    ("extra", "what"),
    [
        (
            "    return i\n",
            "statements after the loop that read its index `i` in f.py matched 1 site(s), expected 0",
        ),
        (
            "    nxt_kv_len = 0\n",
            "uses of the names `nxt_kv_lens_list`, `nxt_kv_len` the rewrite adds in f.py "
            "matched 1 site(s), expected 0",
        ),
    ],
)
def test_spec_alloc_tolist_refuses_a_rewrite_that_would_change_another_statement(extra, what):
    assert_refuses(spec_alloc_tolist.patch_alloc_for_spec_decode, ALLOC_BEFORE + extra, what)


def test_spec_alloc_tolist_refuses_a_module_without_the_function():
    source = ALLOC_BEFORE.replace("def alloc_for_spec_decode(", "def alloc_for_decode(")
    assert not spec_alloc_tolist.reads_scalar_per_request(source, "f.py")
    assert_refuses(
        spec_alloc_tolist.patch_alloc_for_spec_decode,
        source,
        "anchor alloc_for_spec_decode: module-level function definition in f.py matched 0 site(s)",
    )
