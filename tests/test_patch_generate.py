"""`generate_patch`, the diff and `eaglegate patch` on real SGLang releases.

Each test copies only the files the patch reads (the worker, server_args, version.py)
out of the cached release into tmp_path: the cache is never written.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eaglegate.analyzer.source import SourceTree
from eaglegate.cli import app
from eaglegate.errors import UserError
from eaglegate.patches.codemods.server_args import FLAG
from eaglegate.patches.diff import render_patch
from eaglegate.patches.generate import (
    GATE,
    SCHEDULER_OUTPUT,
    SERVER_ARGS,
    WORKER,
    gate_module_source,
    launch_flags,
)

from conftest import default_patch

V1_VERSIONS = ["0.4.10.post2", "0.5.4", "0.5.9", "0.5.12.post1"]
# The scheduler's output processor is edited only where it counts spec metrics (0.5.3 on).
COPIED = [WORKER, SERVER_ARGS, SCHEDULER_OUTPUT, "version.py", "__init__.py"]
GUARDED_RESET = "if self.max_running_requests is None and not self.speculative_batch_gate_threshold:"
METRICS_GUARD = "and not (getattr(batch, 'eaglegate_gated_step', False) or getattr(result, 'eaglegate_gated_step', False))"


def spec_metrics_modules(root: Path) -> list[str]:
    """The scheduler metrics mixin(s) of a release (the module moved in 0.5.12)."""
    return sorted(str(p.relative_to(root)) for p in (root / "srt").rglob("scheduler_metrics_mixin.py"))


def pristine_copy(release_tree, version: str, dest: Path) -> SourceTree:
    """A minimal copy of the release: the package dir with just the files we touch."""
    source = release_tree(version).root
    package = dest / "sglang"
    for rel in COPIED + spec_metrics_modules(source):
        if not (source / rel).is_file():
            continue
        target = package / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / rel, target)
    return SourceTree(root=package, version=version, origin="path")


def counts_spec_metrics(release_tree, version: str) -> bool:
    scheduler = release_tree(version).root / SCHEDULER_OUTPUT
    return scheduler.is_file() and "update_spec_metrics(" in scheduler.read_text()


def _is_unset_cap(test: ast.expr) -> bool:
    return ast.unparse(test) == "self.max_running_requests is None"


def _names_eagle(test: ast.expr) -> bool:
    return "speculative_algorithm" in ast.unparse(test) and any(
        isinstance(n, ast.Constant) and n.value == "EAGLE" for n in ast.walk(test)
    )


def cap_resets(source: str) -> list[tuple[ast.If, bool]]:
    """Every `if self.max_running_requests is None ...: self.max_running_requests = <int>`
    in ServerArgs, with whether it lies inside an `if` that names the EAGLE algorithm."""
    found: list[tuple[ast.If, bool]] = []

    def walk(node: ast.AST, in_eagle: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_eagle
            if isinstance(child, ast.If):
                sets_constant = any(
                    isinstance(s, ast.Assign)
                    and ast.unparse(s.targets[0]) == "self.max_running_requests"
                    and isinstance(s.value, ast.Constant)
                    for s in child.body
                )
                first = child.test.values[0] if isinstance(child.test, ast.BoolOp) else child.test
                if sets_constant and _is_unset_cap(first):
                    found.append((child, in_eagle))
                inside = in_eagle or _names_eagle(child.test)
            walk(child, inside)

    cls = next(
        n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs"
    )
    walk(cls, False)
    return found


def run(cmd: list[str], cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, input=stdin, capture_output=True, text=True, check=False)


@pytest.fixture(scope="module", params=V1_VERSIONS)
def generated(request, release_tree, tmp_path_factory):
    version = request.param
    tree = pristine_copy(release_tree, version, tmp_path_factory.mktemp(version))
    patch = default_patch(tree)
    return version, tree, patch, render_patch(patch)


def test_generate_changes_the_worker_server_args_gate_and_scheduler_metrics(
    generated, release_tree
):
    version, tree, patch, diff = generated
    assert patch.version == version and patch.family == "eagle-v1" and patch.worker == "v1"
    expected = [GATE, SERVER_ARGS, WORKER]
    # 0.4.x counts spec metrics in scheduler.py without update_spec_metrics: no fourth file.
    assert counts_spec_metrics(release_tree, version) == (version != "0.4.10.post2")
    if counts_spec_metrics(release_tree, version):
        # The step's metrics guard, and the decode log's accept length where
        # update_spec_metrics is defined (no division by an interval without spec steps).
        root = release_tree(version).root
        defining = [
            rel for rel in spec_metrics_modules(root)
            if "def update_spec_metrics" in (root / rel).read_text()
        ]
        assert len(defining) == 1
        expected += [SCHEDULER_OUTPUT, *defining]
    paths = sorted(c.path for c in patch.changes)
    assert paths == sorted(f"sglang/{p}" for p in expected)
    by_path = {c.path: c for c in patch.changes}
    gate = by_path[f"sglang/{GATE}"]
    assert gate.before is None and gate.after == gate_module_source()
    worker = by_path[f"sglang/{WORKER}"].after.decode()
    assert (
        "from sglang.srt.speculative.batch_gate import "
        "finish_gated_decode, init_batch_gate, prepare_gated_decode" in worker
    )
    assert worker.count("prepare_gated_decode(self, batch)") == 1
    assert worker.count("finish_gated_decode(self, batch, next_token_ids)") == 1
    assert worker.count("if not _eaglegate_gated:") == 1
    assert worker.count("init_batch_gate(self)") == 1
    args = by_path[f"sglang/{SERVER_ARGS}"].after.decode()
    assert "speculative_batch_gate_threshold: Optional[int] = None" in args
    assert args.count('"--speculative-batch-gate-threshold"') == 1
    assert args.count(GUARDED_RESET) == 1
    # Removed lines: the widened extend `if`, the guarded cap reset, the guarded metrics
    # `if`; every other one is a draft-extend line that comes back indented under
    # `if not _eaglegate_gated:`.
    lines = diff.splitlines()
    removed = [line[1:] for line in lines if line.startswith("-") and not line.startswith("---")]
    added = [line[1:] for line in lines if line.startswith("+") and not line.startswith("+++")]
    changed_tests = [
        line
        for line in removed
        if "forward_mode.is_extend()" in line
        or line.strip() == "if self.max_running_requests is None:"
        or line.strip() == "if not batch.spec_algorithm.is_none():"
        or line.strip() == "if self.spec_algorithm.is_none():"
    ]
    assert len(changed_tests) == len(expected) - 1  # one per edited file (not the new gate)
    moved = [line for line in removed if line not in changed_tests]
    assert moved and any("forward_draft_extend(" in line for line in moved)
    for line in moved:
        assert ("    " + line if line.strip() else line) in added, line


def test_launch_flags_have_no_caps(generated):
    version, tree, patch, _ = generated
    flags = launch_flags(tree, 32, patch.worker)
    assert flags == [
        "--speculative-batch-gate-threshold",
        "32",
        "--disable-overlap-schedule",
    ], version
    assert not any(
        flag in flags for flag in ("--max-running-requests", "--cuda-graph-max-bs")
    )


def test_launch_flags_without_the_overlap_flag(release_tree, tmp_path):
    """A server_args.py that does not declare --disable-overlap-schedule gets only the gate flag."""
    tree = pristine_copy(release_tree, "0.5.9", tmp_path)
    args = tree.root / SERVER_ARGS
    text = args.read_text()
    assert text.count('"--disable-overlap-schedule"') == 1
    args.write_text(text.replace('"--disable-overlap-schedule"', '"--disable-overlap-renamed"'))
    assert launch_flags(tree, 7) == ["--speculative-batch-gate-threshold", "7"]


def _patched(patch, rel: str) -> str:
    return next(c for c in patch.changes if c.path == f"sglang/{rel}").after.decode()


def test_running_cap_reset_is_guarded_once_in_the_eagle_branch(generated, release_tree):
    version, _, patch, _ = generated
    original = (release_tree(version).root / SERVER_ARGS).read_text()
    before = cap_resets(original)
    assert [in_eagle for _, in_eagle in before].count(True) == 1, version
    args = _patched(patch, SERVER_ARGS)
    after = cap_resets(args)
    guarded = [(node, in_eagle) for node, in_eagle in after if isinstance(node.test, ast.BoolOp)]
    assert len(guarded) == 1
    node, in_eagle = guarded[0]
    assert in_eagle
    assert (
        ast.unparse(node.test)
        == "self.max_running_requests is None and (not self.speculative_batch_gate_threshold)"
    )
    assert ast.unparse(node.body[0]) == "self.max_running_requests = 48"
    line = args.splitlines()[node.lineno - 1]
    assert line.strip() == GUARDED_RESET
    # The resets of the other algorithms (NGRAM, STANDALONE, ...) stay as they were.
    assert len(after) == len(before)
    assert all(ast.unparse(n.test) == "self.max_running_requests is None" for n, e in after if not e)


def test_second_run_over_the_patched_tree_changes_nothing(generated, tmp_path):
    version, tree, patch, _ = generated
    package = tmp_path / "sglang"
    shutil.copytree(tree.root, package)
    for change in patch.changes:
        target = tmp_path / change.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(change.after)
    assert default_patch(SourceTree(package, version, "path")).changes == []
    args = (package / SERVER_ARGS).read_text()
    assert args.count(GUARDED_RESET) == 1


def test_two_resets_in_the_eagle_branch_are_refused(release_tree, tmp_path):
    tree = pristine_copy(release_tree, "0.5.9", tmp_path)
    target = tree.root / SERVER_ARGS
    text = target.read_text()
    (node, _), = [(n, e) for n, e in cap_resets(text) if e]
    lines = text.splitlines(keepends=True)
    block = lines[node.lineno - 1 : node.end_lineno]
    assert "".join(block).strip().startswith("if self.max_running_requests is None:")
    target.write_text("".join(lines[: node.end_lineno] + block + lines[node.end_lineno :]))
    assert [e for _, e in cap_resets(target.read_text())].count(True) == 2
    with pytest.raises(UserError) as info:
        default_patch(tree)
    message = str(info.value)
    assert (
        "anchor ServerArgs: `if self.max_running_requests is None: "
        "self.max_running_requests = <n>` inside the EAGLE branch" in message
    )
    assert "matched 2 site(s), expected 1" in message


def test_a_half_patched_server_args_is_refused(release_tree, tmp_path):
    """Only the cap guard present (no field, no flag): partially patched, not patched again."""
    tree = pristine_copy(release_tree, "0.5.9", tmp_path)
    target = tree.root / SERVER_ARGS
    text = target.read_text()
    (node, _), = [(n, e) for n, e in cap_resets(text) if e]
    lines = text.splitlines(keepends=True)
    indent = lines[node.lineno - 1][: len(lines[node.lineno - 1]) - len(lines[node.lineno - 1].lstrip())]
    lines[node.lineno - 1] = indent + GUARDED_RESET + "\n"
    target.write_text("".join(lines))
    with pytest.raises(UserError, match="partially patched"):
        default_patch(tree)


def test_scheduler_metrics_leave_out_gated_steps(generated, release_tree):
    version, _, patch, _ = generated
    if version == "0.4.10.post2":
        assert not any(c.path.endswith(SCHEDULER_OUTPUT) for c in patch.changes)
        assert "eaglegate_gated_step" not in (release_tree(version).root / SCHEDULER_OUTPUT).read_text()
        return
    source = _patched(patch, SCHEDULER_OUTPUT)
    func = next(
        n
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.FunctionDef) and n.name == "process_batch_result_decode"
    )
    guarded = [
        n
        for n in ast.walk(func)
        if isinstance(n, ast.If) and "self.update_spec_metrics(" in ast.unparse(n.body[0])
    ]
    assert len(guarded) == 1
    original = (release_tree(version).root / SCHEDULER_OUTPUT).read_text()
    spec_test = "not batch.spec_algorithm.is_none()"
    assert f"if {spec_test}:\n            self.update_spec_metrics(" in original
    # Marked on the batch by the v1 worker, on the result by the overlap worker.
    expected = ast.parse(
        f"({spec_test}) and not (getattr(batch, 'eaglegate_gated_step', False)"
        " or getattr(result, 'eaglegate_gated_step', False))", mode="eval"
    ).body
    assert ast.dump(guarded[0].test) == ast.dump(expected)
    assert source.count(METRICS_GUARD) == 1
    # The guard's two marks, and where the release feeds SGLang's adaptive speculation its
    # accept counts, the guard that keeps gated steps out of them; nowhere else.
    feeds = original.count("self.model_worker.on_verify_complete_cpu(")
    assert source.count("eaglegate_gated_step") == 2 + feeds


def test_init_batch_gate_is_the_last_statement_of_eagle_worker_init(generated):
    _, _, patch, _ = generated
    tree = ast.parse(_patched(patch, WORKER))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "EAGLEWorker")
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    assert ast.unparse(init.body[-1]) == "init_batch_gate(self)"
    calls = [
        n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == "init_batch_gate"
    ]
    assert len(calls) == 1


def test_diff_applies_with_git_and_patch_and_is_idempotent(generated, tmp_path):
    version, tree, patch, diff = generated
    parent = tmp_path / "tree"
    shutil.copytree(tree.root.parent, parent)
    (tmp_path / "gate.patch").write_text(diff)
    patch_file = str(tmp_path / "gate.patch")

    checked = run(["git", "apply", "--check", "-v", patch_file], parent)
    assert checked.returncode == 0, checked.stderr
    dry = run(["patch", "-p1", "--dry-run", "--batch"], parent, stdin=diff)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    applied = run(["patch", "-p1", "--batch"], parent, stdin=diff)
    assert applied.returncode == 0, applied.stdout + applied.stderr

    for change in patch.changes:
        on_disk = (parent / change.path).read_bytes()
        assert on_disk == change.after, change.path
        compile(on_disk, change.path, "exec")  # every patched file compiles

    again = default_patch(SourceTree(parent / "sglang", version, "path"))
    assert again.changes == []
    assert render_patch(again) == ""
    # git agrees the tree is fully patched: the reverse applies cleanly.
    reverse = run(["git", "apply", "--check", "--reverse", patch_file], parent)
    assert reverse.returncode == 0, reverse.stderr


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_releases_with_native_adaptive_take_the_overlap_workers_patch(release_tree, version):
    patch = default_patch(release_tree(version))
    assert patch.family == "eagle-v2" and patch.worker == "v2"
    assert launch_flags(release_tree(version), 32, patch.worker) == [FLAG, "32"]  # overlap kept, no caps


@pytest.mark.parametrize("version", ["0.3.6", "0.5.13.post1"])
def test_refuses_versions_outside_the_v1_range(release_tree, tmp_path, version):
    tree = pristine_copy(release_tree, "0.5.9", tmp_path)  # a v1 worker, another label
    relabelled = SourceTree(tree.root, version, "path")
    with pytest.raises(UserError, match="outside the v1 gate patch's range"):
        default_patch(relabelled)


@pytest.mark.parametrize(
    ("rel", "old", "new", "anchor"),
    [
        (
            WORKER,
            "if batch.forward_mode.is_extend() or batch.is_extend_in_batch:",
            "if batch.is_extend_in_batch:",
            "anchor EAGLEWorker.forward_batch_generation: top-level `if ...forward_mode.is_extend()`",
        ),
        (
            WORKER,
            "def forward_target_extend(",
            "def forward_target_prefill(",
            "anchor EAGLEWorker.forward_target_extend: method definition",
        ),
        (
            SERVER_ARGS,
            '"--speculative-num-draft-tokens",',
            '"--speculative-num-draft-tokens-renamed",',
            'anchor ServerArgs.add_cli_args: parser.add_argument("--speculative-num-draft-tokens"',
        ),
    ],
)
def test_refuses_a_hand_modified_anchor(release_tree, tmp_path, rel, old, new, anchor):
    tree = pristine_copy(release_tree, "0.5.9", tmp_path)
    target = tree.root / rel
    text = target.read_text()
    assert text.count(old) == 1
    target.write_text(text.replace(old, new))
    with pytest.raises(UserError) as info:
        default_patch(tree)
    assert anchor in str(info.value)
    assert "matched 0 site(s), expected 1" in str(info.value)


def test_refuses_an_anchor_matched_twice(release_tree, tmp_path):
    tree = pristine_copy(release_tree, "0.5.9", tmp_path)
    worker = tree.root / WORKER
    text = worker.read_text()
    # A second extend branch in the entry: two sites where the patch expects one.
    marker = "        if batch.forward_mode.is_extend() or batch.is_extend_in_batch:\n"
    worker.write_text(
        text.replace(
            marker, marker.replace("if", "if False and", 1) + "            pass\n" + marker, 1
        )
    )
    with pytest.raises(UserError, match=r"matched 2 site\(s\), expected 1"):
        default_patch(tree)


def test_refuses_a_partially_patched_worker(release_tree, tmp_path):
    tree = pristine_copy(release_tree, "0.5.9", tmp_path)
    patch = default_patch(tree)
    worker = next(c for c in patch.changes if c.path.endswith(WORKER)).after.decode()
    without_import = "\n".join(
        line for line in worker.splitlines() if "import finish_gated_decode" not in line
    )
    (tree.root / WORKER).write_text(without_import + "\n")
    with pytest.raises(UserError, match="partially patched"):
        default_patch(tree)


def test_cli_writes_the_patch_and_prints_flags(release_tree, tmp_path):
    tree = pristine_copy(release_tree, "0.5.4", tmp_path)
    out = tmp_path / "gate.patch"
    runner = CliRunner()
    result = runner.invoke(
        app, ["patch", "--path", str(tree.root), "--threshold", "24", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert out.read_text() == render_patch(default_patch(tree))
    assert (
        "launch flags: --speculative-batch-gate-threshold 24 --disable-overlap-schedule\n"
        in result.output
    )
    assert "--max-running-requests" not in result.output

    as_json = runner.invoke(app, ["patch", "--path", str(tree.root), "--threshold", "24", "--json"])
    assert as_json.exit_code == 0
    data = json.loads(as_json.stdout)  # nothing but JSON on stdout
    assert data["version"] == "0.5.4" and data["already_applied"] is False
    assert data["diff"] == out.read_text()
    assert data["launch_flags"] == launch_flags(tree, 24)
    # The threshold is a launch parameter: another one gives the same patch, other flags.
    other = json.loads(runner.invoke(app, ["patch", "--path", str(tree.root), "--threshold", "64", "--json"]).stdout)
    assert other["diff"] == data["diff"] and other["launch_flags"] == launch_flags(tree, 64)


def test_cli_patches_0_5_14_for_the_overlap_worker(release_tree):
    # Native adaptive speculation is the alternative there, not a reason to refuse.
    runner = CliRunner()
    result = runner.invoke(
        app, ["patch", "--path", str(release_tree("0.5.14").root), "--threshold", "8", "--json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["launch_flags"] == ["--speculative-batch-gate-threshold", "8"]
    assert any(c["path"].endswith("eagle_worker_v2.py") for c in data["files"])


def test_diff_marks_a_missing_final_newline(tmp_path):
    from eaglegate.patches.model import FileChange, PatchSet

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg/a.py").write_bytes(b"x = 1\ny = 2")
    patch = PatchSet(
        version="t",
        family="eagle-v1",
        changes=[
            FileChange("pkg/a.py", b"x = 1\ny = 2", b"x = 1\ny = 3\n"),
            FileChange("pkg/new.py", None, b"z = 0"),
        ],
    )
    diff = render_patch(patch)
    assert diff.count("\\ No newline at end of file") == 2
    assert "--- /dev/null\n+++ b/pkg/new.py\n" in diff
    (tmp_path / "p.diff").write_text(diff)
    assert run(["git", "apply", str(tmp_path / "p.diff")], tmp_path).returncode == 0
    assert (tmp_path / "pkg/a.py").read_bytes() == b"x = 1\ny = 3\n"
    assert (tmp_path / "pkg/new.py").read_bytes() == b"z = 0"


def _accept_length_ifs(source: str) -> list[tuple[ast.If, str]]:
    """`if self.spec_algorithm.is_none()...: ... else: ... accepted / <forward count>`, with
    the divisor of that accept-length division."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.If) and "self.spec_algorithm.is_none()" in ast.unparse(node.test):
            divisors = [
                ast.unparse(n.right)
                for stmt in node.orelse
                for n in ast.walk(stmt)
                if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div)
                and "forward_ct" in ast.unparse(n.right) and "accept" in ast.unparse(n.left)
            ]
            if len(divisors) == 1:
                found.append((node, divisors[0]))
    return found


def test_decode_log_has_no_accept_length_for_an_interval_of_gated_steps(generated, release_tree):
    """Gated steps leave the spec counters alone, so an interval of gated steps only must
    not divide by its zero forward count: that branch logs no accept length."""
    version, _, patch, _ = generated
    root = release_tree(version).root
    mixins = [c for c in patch.changes if c.path.endswith("scheduler_metrics_mixin.py")]
    if version == "0.4.10.post2":
        assert mixins == []
        return
    (change,) = mixins
    original = (root.parent / change.path).read_text()
    (_, divisor), = _accept_length_ifs(original)
    assert divisor in ("self.spec_num_forward_ct", "self.spec_num_total_forward_ct")
    patched = _accept_length_ifs(change.after.decode())
    assert len(patched) == 1
    node, after_divisor = patched[0]
    assert after_divisor == divisor
    expected = ast.parse(f"self.spec_algorithm.is_none() or not {divisor}", mode="eval").body
    assert ast.dump(node.test) == ast.dump(expected)
    assert isinstance(node.body[0], ast.Assign)
    assert ast.unparse(node.body[0]) == "spec_accept_length = 0"


def test_patch_and_apply_generate_the_patch_once(release_tree, tmp_path, monkeypatch):
    """The launch decision is made once and handed to the generator: `patch` and `apply`
    on 0.5.9 (both worker families, so the default launch's worker is decided by analysis)
    generate once each, and a second `apply` generates nothing (the manifest holds the
    worker its flags are for)."""
    from eaglegate import app as application
    from eaglegate.analyzer.source import from_path
    from eaglegate.patches import generate

    from txhelpers import copy_full

    calls: list[str] = []
    real = generate.generate_patch

    def counted(tree, worker, **kwargs):
        calls.append(worker)
        return real(tree, worker, **kwargs)

    monkeypatch.setattr(generate, "generate_patch", counted)
    parent = copy_full(release_tree("0.5.9").root, tmp_path / "site")
    tree = from_path(parent)
    made = application.make_patch(tree, 32)
    assert calls == [made.files.worker] and made.files.family == "eagle-v1+eagle-v2"
    calls.clear()
    applied = application.apply(tree, 32)
    assert calls == [made.files.worker] and applied.outcome.changed
    calls.clear()
    again = application.apply(from_path(parent), 16)
    assert calls == [] and not again.outcome.changed
    assert again.launch_flags == generate.launch_flags(tree, 16, made.files.worker)


@pytest.mark.parametrize("version,worker", [("0.4.10.post2", "v1"), ("0.5.9", "v1"), ("0.5.9", "v2"),
                                            ("0.5.16", "v2"), ("0.5.23", "v2")])
def test_the_generator_returns_where_the_gate_is_called(release_tree, version, worker):
    """The insertion point is the generator's fact: the line it names in the original
    worker file lies in the method it names, and the patched method calls the gate there."""
    from eaglegate.patches.codemods import v1_worker, v2_worker
    from eaglegate.patches.generate import WORKER_V2, generate_patch

    patch = generate_patch(release_tree(version), worker, required=True)
    point = patch.insertion
    assert point is not None and point.file == (WORKER_V2 if worker == "v2" else WORKER)
    change = next(c for c in patch.changes if c.path == f"sglang/{point.file}")
    cls_name, method = point.symbol.split(".")
    line = int(point.where.rsplit(":", 1)[1])

    def span(data: bytes) -> tuple[int, int]:
        cls = next(n for n in ast.parse(data).body if isinstance(n, ast.ClassDef) and n.name == cls_name)
        fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == method)
        return fn.lineno, fn.end_lineno or fn.lineno

    low, high = span(change.before)
    assert low <= line <= high
    call = (v2_worker.IS_GATED if worker == "v2" else v1_worker.PREPARE) + "("
    block = next(e for e in point.edits if e["at"] == point.where)
    assert any(call in text for text in block["new"])
    low, high = span(change.after)
    assert any(call in text for text in change.after.decode().splitlines()[low - 1:high])
