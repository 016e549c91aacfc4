"""The application layer: every operation the command line and the agent tools offer.

`eaglegate/cli_*.py` and `eaglegate/agents/` only turn input into these calls and their
results into output (text, JSON, pages). Each input is validated here, once, so a bad
argument gets the same message from the CLI, `eaglegate tool` and MCP
(docs/architecture.md, "The application layer").

`confined=True` is the agents' policy: an agent names only Python interpreters and never
makes eaglegate read or write through a link out of the located tree. A person at the
command line may (a venv whose files link into a shared store is a real layout).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eaglegate.analyzer import source
from eaglegate.errors import UsageError, UserError
from eaglegate.live.calibrate import Roofline
from eaglegate.patches.model import MAX_THRESHOLD, PatchSet

if TYPE_CHECKING:
    from eaglegate.analyzer.analysis import Analysis
    from eaglegate.analyzer.couplings.model import CouplingReport
    from eaglegate.analyzer.couplings.scope import LaunchScope
    from eaglegate.analyzer.spec_map import MapAnswer
    from eaglegate.live.calibrate import Calibration, Curve
    from eaglegate.live.client import Endpoint
    from eaglegate.live.sweep import Point, SweepProgress
    from eaglegate.live.verify_live import VerifyReport as LiveReport
    from eaglegate.patches import transaction
    from eaglegate.patches.plan import GatePlan
    from eaglegate.patches.verify import VerifyReport

# Every command imports this module: the analysis (networkx), the codemods (LibCST) and
# the transactions (GitPython) are imported by the operations that use them, so `locate`,
# `status` and a warm `map` do not pay for loading what they never run.

Progress = Callable[[int, int], None]

# Free-text arguments: long enough for any real path or launch line, short enough that a
# pasted file is refused.
MAX_TEXT = 400
MAX_FLAGS_TEXT = 2000
MAX_ENV_TEXT = 200
MAX_ENV_ENTRIES = 32
# Every free-text argument an operation takes, with its longest plausible value.
TEXT_LIMITS = {"version": 64, "path": MAX_TEXT, "git": MAX_TEXT, "rev": 200, "python": MAX_TEXT,
               "flags": MAX_FLAGS_TEXT, "category": 40, "worker": 40, "symbol": 300, "location": MAX_TEXT,
               "baseline": MAX_TEXT, "spec": MAX_TEXT, "gpu": 64}
_PYTHON_NAME = re.compile(r"python(\d+(\.\d+)?)?(\.exe)?")


# ---------------------------------------------------------------- inputs


def check_threshold(threshold: object) -> int:
    """The gate's batch size: the one bound of the product (SGLang keeps batch sizes in int32)."""
    if isinstance(threshold, bool) or not isinstance(threshold, int) or not 1 <= threshold <= MAX_THRESHOLD:
        raise UsageError(f"threshold must be an integer batch size from 1 to {MAX_THRESHOLD}, not {threshold!r}")
    return threshold


def check_text(name: str, value: object, limit: int = MAX_TEXT) -> str | None:
    """A free-text argument, stripped; None when absent or blank."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise UsageError(f"{name} must be a string, not {type(value).__name__}")
    if len(value) > limit or "\x00" in value:
        raise UsageError(f"{name} is not a plausible value (over {limit} characters or a NUL byte)")
    return value.strip() or None


def check_launch(flags: object, env: object) -> tuple[str, list[str]]:
    """The server's launch flags (one string) and NAME=VALUE environment entries."""
    text = check_text("flags", flags, MAX_FLAGS_TEXT) or ""
    if env is not None and not isinstance(env, (list, tuple)):
        raise UsageError(f"env must be a list of NAME=VALUE strings, not {type(env).__name__}")
    if env is not None and len(env) > MAX_ENV_ENTRIES:
        raise UsageError(f"env holds at most {MAX_ENV_ENTRIES} entries, not {len(env)}")
    entries = [e for e in (check_text("env", item, MAX_ENV_TEXT) for item in (env or [])) if e]
    return text, entries


def check_inputs(arguments: dict[str, object]) -> None:
    """Every shared input among `arguments` (by name), checked as the operation that takes
    it checks it: a caller that refuses a whole request up front (the MCP server, before
    its schema's own checks) then refuses in the same words as the CLI and `eaglegate tool`."""
    for name, value in arguments.items():
        if name == "threshold" and value is not None:
            check_threshold(value)
        elif name in TEXT_LIMITS:
            check_text(name, value, TEXT_LIMITS[name])
        elif name == "margin":
            check_fraction("--margin", value)
        elif name in ESTIMATE_FIGURES:
            check_figure(name, value)
    if "env" in arguments:
        check_launch(None, arguments["env"])


@dataclass(frozen=True)
class TreeArgs:
    """How the caller names the SGLang tree (at most one of path/python/git/version)."""

    version: str | None = None
    path: str | None = None
    git: str | None = None
    rev: str | None = None
    python: str | None = None


def locate(args: TreeArgs, on_fetch: Callable[[str], None] | None = None,
           confined: bool = False) -> source.SourceTree:
    """The SGLang tree the arguments name, each argument checked first."""
    version = check_text("version", args.version, TEXT_LIMITS["version"])
    path = check_text("path", args.path, TEXT_LIMITS["path"])
    git = check_text("git", args.git, TEXT_LIMITS["git"])
    rev = check_text("rev", args.rev, TEXT_LIMITS["rev"])
    python = check_text("python", args.python, TEXT_LIMITS["python"])
    if confined and python is not None and not _PYTHON_NAME.fullmatch(Path(python).name):
        # The interpreter is executed to read metadata: only something named python.
        raise UsageError(f"python must name a Python interpreter (python, python3.11...), not {python!r}")
    if rev is not None and rev.startswith("-"):
        raise UsageError(f"rev must be a tag or commit, not {rev!r}")
    if path is not None:
        path = str(Path(path).expanduser().resolve())  # symlinks followed: the real tree is named
    return source.locate(path=path, python=python, git_path=git, rev=rev, version=version, on_fetch=on_fetch)


def writable_parent(tree: source.SourceTree, action: str) -> Path:
    """The directory holding the `sglang` package, refusing trees eaglegate must not write.

    Every route that writes (apply and revert, from the CLI, `eaglegate tool` and MCP, by
    --version, --path or --git) passes here: the cache is refused by where the package
    lies, not by how it was named."""
    if tree.origin == "git" and tree.detail.get("rev"):
        raise UserError(f"--rev (rev=) reads an exported snapshot; check out {tree.detail['rev']} and "
                        f"{action} the checkout with --git (git=) alone")
    package, cache = tree.root.resolve(), source.cache_dir().expanduser().resolve()
    if tree.origin == "release" or package.is_relative_to(cache) or cache.is_relative_to(package):
        # The cache is the shared read-only reference every analysis reads: a patched copy
        # there would be read as the release from then on.
        raise UserError(
            f"{package.parent} is in eaglegate's cache ({cache}), its read-only reference, not a tree to "
            f"{action}; copy it (cp -r {shlex.quote(str(package.parent))} ./sglang-{tree.version}) and "
            "pass --path (path=) to the copy")
    return tree.root.parent


def check_inside(tree: source.SourceTree, rels: list[str]) -> None:
    """Paths relative to the package's parent must not lead out of the tree through links."""
    root = tree.root.resolve()
    for rel in rels:
        target = (tree.root.parent / rel).resolve()
        if not target.is_relative_to(root):
            raise UserError(f"refusing: {rel} resolves to {target}, outside the located tree {root}")


# ---------------------------------------------------------------- analyses


def analyse(tree: source.SourceTree, progress: Progress | None = None) -> Analysis:
    """Map the tree; stops when a file the map rests on does not parse."""
    from eaglegate.analyzer.needed import analyze_checked

    return analyze_checked(tree, progress)


def _answer_code() -> str:
    """The digest of the code behind a cached answer: the analyzer and this module."""
    from eaglegate.analyzer import cache

    return cache.analyzer_digest(str(Path(__file__).resolve()))


def map_answer(tree: source.SourceTree, progress: Progress | None = None) -> MapAnswer:
    """`eaglegate map`'s answer: the map of the tree, stopping when a file the map rests on
    does not parse; read back from eaglegate's cache when this tree was mapped before by this
    code (eaglegate/analyzer/answers.py), with `timing` then `{"cached": seconds}`."""
    import time

    from eaglegate.analyzer import answers, cache
    from eaglegate.analyzer.spec_map import CachedMap, Question

    start = time.perf_counter()
    question = Question()
    entry = answers.map_entry(tree, {"question": repr(question)}, _answer_code())
    found = cache.load_checked(entry)
    if isinstance(found, CachedMap):
        found.tree = tree
        found.timing = {"cached": time.perf_counter() - start}
        return found
    from eaglegate.analyzer.needed import check_needed
    from eaglegate.analyzer.spec_map import build_map

    spec_map = build_map(tree, question, progress=progress)
    check_needed(spec_map)  # an answer that stops here is never stored
    cache.store_checked(entry, spec_map.detached())
    return spec_map


def couplings_answer(tree: source.SourceTree, flags: object = "", env: object = None, *,
                     categories: object = None, every: bool = False,
                     progress: Progress | None = None) -> Couplings:
    """`couplings(analyse(tree), …)`, read back from eaglegate's cache when this tree was
    asked the same before by this code: a warm run neither loads the tree's summaries nor
    builds the map. The report's `timing` is then `{"cached": seconds}`."""
    import time

    start = time.perf_counter()
    kept, text, entries = check_couplings_request(flags, env, categories, every)
    entry, stored = _stored_couplings(tree, kept, text, entries, every)
    found = _unpickled(stored[1]) if stored is not None else None
    if isinstance(found, Couplings):
        reports = [found.report] + ([found.scoped.report] if found.scoped is not None else [])
        for report in reports:
            report.version, report.root = tree.version, str(tree.root)
            report.timing = {"cached": time.perf_counter() - start}
        return found
    answer = couplings(analyse(tree, progress), text, entries, categories=kept, every=every)
    _store_couplings(entry, answer)
    return answer


def couplings_json(tree: source.SourceTree, flags: object = "", env: object = None, *,
                   categories: object = None, every: bool = False,
                   progress: Progress | None = None) -> str:
    """`couplings --json`'s output: `couplings_answer`'s JSON, indented, with a newline. A warm
    run fills the stored text in (the tree's version and root, the seconds it took) without
    rebuilding the report's objects or encoding its findings again."""
    import json
    import time

    start = time.perf_counter()
    kept, text, entries = check_couplings_request(flags, env, categories, every)
    _, stored = _stored_couplings(tree, kept, text, entries, every)
    if stored is not None and stored[0] is not None:
        sglang = {"version": tree.version, "root": str(tree.root)}
        return _filled(stored[0], sglang, {"cached": round(time.perf_counter() - start, 3)}) + "\n"
    found = couplings_answer(tree, text, entries, categories=kept, every=every, progress=progress)
    return json.dumps(found.to_json(), indent=2, default=str) + "\n"


# Where a stored couplings JSON text takes the tree's location and the run's seconds: strings
# no answer holds (a NUL is escaped in JSON, and a finding quotes source text, which has none).
_SGLANG_SLOT = "\x00eaglegate:sglang\x00"
_TIMING_SLOT = "\x00eaglegate:timing_s\x00"


def _filled(template: str, sglang: dict[str, Any], timing: dict[str, float]) -> str:
    import json

    def nested(value: object) -> str:  # a value at depth 1 of an indent=2 document
        return json.dumps(value, indent=2, default=str).replace("\n", "\n  ")

    return (template.replace(json.dumps(_SGLANG_SLOT), nested(sglang), 1)
            .replace(json.dumps(_TIMING_SLOT), nested(timing), 1))


def _json_template(data: dict[str, Any]) -> str | None:
    """`data`'s JSON text with slots for its `sglang` and `timing_s`, or None unless filling
    them in gives exactly `json.dumps(data, indent=2)`."""
    import json

    text = json.dumps({**data, "sglang": _SGLANG_SLOT, "timing_s": _TIMING_SLOT}, indent=2, default=str)
    if text.count(json.dumps(_SGLANG_SLOT)) != 1 or text.count(json.dumps(_TIMING_SLOT)) != 1:
        return None
    if _filled(text, data["sglang"], data["timing_s"]) != json.dumps(data, indent=2, default=str):
        return None
    return text


def _stored_couplings(tree: source.SourceTree, kept: list[str], text: str, entries: list[str],
                      every: bool) -> tuple[Path, tuple[str | None, bytes] | None]:
    """The answer's entry and what it holds: (its JSON template or None, the pickled answer)."""
    from eaglegate.analyzer import answers, cache

    request = {"flags": text, "env": entries, "categories": kept, "every": bool(every)}
    entry = answers.couplings_entry(tree, request, _answer_code())
    stored = cache.load_checked(entry)
    if (isinstance(stored, tuple) and len(stored) == 2 and isinstance(stored[1], bytes)
            and (stored[0] is None or isinstance(stored[0], str))):
        return entry, stored
    return entry, None


def _store_couplings(entry: Path, answer: Couplings) -> None:
    import pickle

    from eaglegate.analyzer import cache

    try:
        blob = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, RecursionError, TypeError, AttributeError):
        return
    cache.store_checked(entry, (_json_template(answer.to_json()), blob))


def _unpickled(blob: bytes) -> object:
    import gc
    import pickle

    enabled = gc.isenabled()
    gc.disable()
    try:
        return pickle.loads(blob)  # eaglegate's own cache entry, its digest checked
    except Exception:  # noqa: BLE001 - an unreadable answer is computed again
        return None
    finally:
        if enabled:
            gc.enable()


def couplings_for_launch(analysis: Analysis, flags: object = "", env: object = None) -> LaunchScope:
    """The couplings that apply to one launch (the version's default launch when both are empty)."""
    from eaglegate.analyzer.couplings.scope import for_launch

    text, entries = check_launch(flags, env)
    return for_launch(analysis, text, entries)


def check_categories(categories: object) -> list[str]:
    """The coupling categories to keep (one, or a list; none: every category)."""
    from eaglegate.analyzer.couplings.model import CATEGORIES

    if categories is None:
        return []
    values = [categories] if isinstance(categories, str) else categories
    if not isinstance(values, (list, tuple)):
        raise UsageError(f"category must be a string or a list of them, not {type(categories).__name__}")
    kept = []
    for value in values:
        name = check_text("category", value, TEXT_LIMITS["category"])
        if name is not None and name not in CATEGORIES:
            raise UsageError(f"category must be one of {', '.join(CATEGORIES)}, not {name!r}")
        if name is not None:
            kept.append(name)
    return kept


@dataclass
class Couplings:
    """What ties the runtime to speculation: the report (only the categories asked for) and,
    unless every launch's findings were asked for, the part the launch runs."""

    report: CouplingReport
    scoped: LaunchScope | None

    def to_json(self) -> dict[str, Any]:
        """`couplings --json`: the scoped report, or with `--all` the whole one."""
        return self.report.to_json() if self.scoped is None else self.scoped.to_json()


def check_couplings_request(flags: object = "", env: object = None, categories: object = None,
                            every: bool = False) -> tuple[list[str], str, list[str]]:
    """The categories, launch flags and environment of a couplings request (callers check
    them before locating a tree, `couplings` checks them again)."""
    kept = check_categories(categories)
    text, entries = check_launch(flags, env)
    if every and (text or entries):
        raise UsageError("--all (all_findings=) lists every finding of every launch: give either it "
                         "or --flags/--env (flags=, env=)")
    return kept, text, entries


def couplings(analysis: Analysis, flags: object = "", env: object = None, *, categories: object = None,
              every: bool = False) -> Couplings:
    """The couplings for one launch (the version's default launch when flags and env are
    empty), or with `every` all findings of every launch; kept to `categories` if given."""
    import dataclasses

    kept, text, entries = check_couplings_request(flags, env, categories, every)
    scoped = None if every else couplings_for_launch(analysis, text, entries)
    report = analysis.couplings
    if kept:
        # Copies: the analysis keeps its report for whoever asks next.
        report = dataclasses.replace(report, findings=[f for f in report.findings if f.category in kept])
        if scoped is not None:
            scoped = dataclasses.replace(scoped, report=report,
                                         kept=[f for f in scoped.kept if f.category in kept])
    return Couplings(report, scoped)


def check_launch_settings(analysis: Analysis, flags: str, env: list[str]) -> None:
    """A malformed launch (an unknown flag, a bad value) is the caller's error, refused before
    any part of an answer is computed."""
    from eaglegate.analyzer.settings import parse_env, parse_flags

    parse_flags(analysis.settings, flags)
    parse_env(analysis.settings, env)


def plan(analysis: Analysis, threshold: object = None, flags: object = "", env: object = None) -> GatePlan:
    """Which worker the launch runs and how to gate it in this version."""
    if threshold is not None:
        check_threshold(threshold)
    from eaglegate.patches.plan import build_plan

    text, entries = check_launch(flags, env)
    check_launch_settings(analysis, text, entries)
    return build_plan(analysis, threshold if isinstance(threshold, int) else None, text, entries)


# ---------------------------------------------------------------- the patch


def _check_patch_inputs(tree: source.SourceTree, confined: bool) -> None:
    """Confined, the files the generator reads and writes must not lead out of the tree."""
    from eaglegate.patches import generate

    if confined:
        check_inside(tree, [f"{tree.root.name}/{rel}" for rel in (generate.WORKER, generate.SERVER_ARGS, generate.GATE)])


def _launch_worker(tree: source.SourceTree, analysis: Analysis | None = None) -> str:
    """The worker a launch with no flags runs, which the patch's launch flags are for: the
    one family the tree has, or, where it has both, the launch decision of the analysis."""
    from eaglegate.patches import generate
    from eaglegate.patches.plan import default_worker

    family = generate.check_family(tree)
    if "+" not in family:
        return next(k for k, v in generate.WORKER_LABELS.items() if v == family)
    if analysis is None:
        from eaglegate.analyzer.analysis import analyze

        analysis = analyze(tree)
    return default_worker(analysis)


def _generate(tree: source.SourceTree, confined: bool, analysis: Analysis | None = None) -> PatchSet:
    from eaglegate.patches import generate

    patch = generate.generate_patch(tree, _launch_worker(tree, analysis))
    if confined:
        check_inside(tree, [c.path for c in patch.changes])
    return patch


@dataclass
class Patch:
    """The gate patch (the same bytes for every threshold) and the flags that launch its
    worker with this threshold: the one place the threshold meets a patch."""

    files: PatchSet
    threshold: int
    launch_flags: list[str]


def patch_files(tree: source.SourceTree, *, confined: bool = False) -> PatchSet:
    """The gate patch's file changes for this tree, the same for every threshold (nothing
    is written)."""
    _check_patch_inputs(tree, confined)
    return _generate(tree, confined)


def make_patch(tree: source.SourceTree, threshold: object, *, confined: bool = False) -> Patch:
    """The gate patch for this tree and its launch flags (nothing is written)."""
    from eaglegate.patches import generate

    checked = check_threshold(threshold)
    patch = patch_files(tree, confined=confined)
    return Patch(patch, checked, generate.launch_flags(tree, checked, patch.worker))


@dataclass
class Applied:
    """What `apply` did, the flags to launch with, and the tree's state afterwards."""

    outcome: transaction.Outcome
    launch_flags: list[str]
    status: transaction.Status
    recovered: str = ""  # an interrupted transaction finished first, said in one line


def apply(tree: source.SourceTree, threshold: object, *, allow_dirty: bool = False,
          progress: Progress | None = None, confined: bool = False) -> Applied:
    """Install the gate patch atomically, with a manifest for revert; a second apply of the
    same patch changes nothing."""
    from eaglegate.patches import generate, transaction

    checked = check_threshold(threshold)
    parent = writable_parent(tree, "apply")
    current = transaction.status(parent)
    manifest = current.manifest
    if manifest is not None and current.state != "interrupted":
        if current.state != "patched":
            raise UserError("patched, but files changed since; see `eaglegate status`")
        if manifest.generator != generate.generator_id():
            raise UserError(
                f"patched by another eaglegate's gate patch (applied {manifest.time}), which may lack "
                "edits this one makes: `eaglegate revert`, then `eaglegate apply`, installs this one's")
        # The same patch again: no file to write, and the patched files are no input to the
        # generator, which reads the original anchors. The threshold is read at launch, so
        # another one changes no byte of the tree: the manifest records it, for `status`.
        outcome = transaction.reapply(parent, checked)
        worker = manifest.worker
        if not worker:  # recorded by an older eaglegate: decide it as `patch` did
            worker = _launch_worker(tree)
        flags = generate.launch_flags(tree, checked, worker)
        return Applied(outcome, flags, transaction.status(parent))
    # Generation must read original bytes: finish an interrupted transaction first.
    recovered = transaction.recover(parent) if current.state == "interrupted" else ""
    _check_patch_inputs(tree, confined)
    # The map's files must parse (the scheduler, the workers): a gate patched into a tree
    # whose scheduler does not parse could never be verified.
    patch = _generate(tree, confined, analyse(tree, progress))
    outcome = transaction.apply(parent, patch, threshold=checked, tree_version=tree.version,
                                git_mode=tree.origin == "git", allow_dirty=allow_dirty)
    outcome.recovered = outcome.recovered or recovered
    return Applied(outcome, generate.launch_flags(tree, checked, patch.worker), transaction.status(parent),
                   recovered)


def revert(tree: source.SourceTree, *, force: bool = False,
           confined: bool = False) -> tuple[transaction.Outcome, transaction.Status]:
    """Restore every byte the gate patch changed and remove what it added."""
    from eaglegate.patches import transaction

    parent = writable_parent(tree, "revert")
    recorded = transaction.status(parent).manifest
    if confined and recorded is not None:
        check_inside(tree, [r.path for r in recorded.files])
    outcome = transaction.revert(parent, force=bool(force))
    return outcome, transaction.status(parent)


def status(tree: source.SourceTree) -> transaction.Status:
    """Pristine, patched, modified since the patch, or interrupted."""
    from eaglegate.patches import transaction

    return transaction.status(tree.root.parent)


def verify(tree: source.SourceTree) -> VerifyReport:
    """Check an applied gate: files compile, the gate sits on the decode path, it behaves."""
    from eaglegate.patches.verify import verify_tree

    return verify_tree(tree)


# ---------------------------------------------------------------- live measurement


def check_count(name: str, value: object, low: int = 1) -> int:
    """A count (requests, tokens, rounds, a concurrency): an integer from `low` on."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise UsageError(f"{name} must be an integer from {low} on, not {value!r}")
    return value


def check_positive(name: str, value: object) -> float:
    """A quantity that must be above zero (seconds, parameters, bandwidth)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise UsageError(f"{name} must be a number above 0, not {value!r}")
    return float(value)


def check_fraction(name: str, value: object) -> float:
    """A share of something, from 0 up to (not including) 1."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise UsageError(f"{name} must be in [0, 1), got {value!r}")
    return float(value)


def check_output(path: object) -> None:
    """An output file's folder must exist: a typo should not create a tree of folders, nor
    fail only after minutes of work."""
    if path is not None and not Path(str(path)).parent.is_dir():
        raise UsageError(f"no such folder: {Path(str(path)).parent} (create it first)")


def _endpoint(url: object, api: object) -> Endpoint:
    from eaglegate.live.client import check_api, resolve_endpoint

    text = check_text("--url", url)
    if text is None:
        raise UsageError("--url must name the server (host:port or a URL)")
    return resolve_endpoint(text, check_api(api))


def _prompts(path: object) -> list[str]:
    from eaglegate.live.client import load_prompts

    return load_prompts(check_text("--prompts", path))


@dataclass
class Swept:
    """The server a sweep measured and one record per concurrency level."""

    endpoint: Endpoint
    records: list[dict[str, Any]]


def sweep(url: object, *, concurrency: object = "1-256", prompts: object = None, output: object = "sweep.jsonl",
          api: object = "auto", model: object = None, max_tokens: object = 256, rounds: object = 2,
          min_requests: object = 8, ignore_eos: bool = True, timeout: object = 300.0, tag: object = None,
          progress: SweepProgress | None = None) -> Swept:
    """Measure output tokens/s, TTFT and inter-token latency at each concurrency level,
    appending one JSON line per finished level to `output`."""
    from eaglegate.live.sweep import parse_levels, run_sweep

    tokens, per_worker = check_count("--max-tokens", max_tokens), check_count("--rounds", rounds)
    least, seconds = check_count("--min-requests", min_requests), check_positive("--timeout", timeout)
    check_output(output)
    endpoint = _endpoint(url, api)
    levels = parse_levels(check_text("--concurrency", concurrency) or "")
    prompt_list = _prompts(prompts)
    records = run_sweep(endpoint, levels, prompt_list, str(output), model=check_text("--model", model),
                        max_tokens=tokens, rounds=per_worker, min_requests=least, ignore_eos=bool(ignore_eos),
                        timeout=seconds, tag=check_text("--tag", tag), progress=progress)
    return Swept(endpoint, records)


@dataclass(frozen=True)
class Estimate:
    """`calibrate --estimate`'s model of the server (docs/calibrate.md): what the roofline
    needs, the GPU by name or by its peak figures."""

    params_b: float | None = None
    draft_tokens: int | None = None
    accept_len: float | None = None
    gpu: str | None = None
    peak_tflops: float | None = None
    bandwidth_tbs: float | None = None
    draft_params_b: float | None = None
    num_steps: int | None = None
    # The model's own defaults, so the two cannot drift apart.
    context_len: int = Roofline.context_len
    kv_kib_per_token: float | None = None
    flops_efficiency: float = Roofline.flops_efficiency
    bandwidth_efficiency: float = Roofline.bandwidth_efficiency
    overhead_ms: float = Roofline.overhead_ms
    max_concurrency: int = 1024


@dataclass
class Calibrated:
    """Both curves, where speculation stops paying, and the estimate's figures (when estimated)."""

    base: Curve
    spec: Curve
    result: Calibration
    estimate: dict[str, Any] | None = None


def calibrate(baseline: object = None, spec: object = None, *, margin: float = 0.05,
              estimate: Estimate | None = None) -> Calibrated:
    """Find where speculation stops paying and recommend the gate's threshold and
    hysteresis: from two sweep files, or from a roofline `estimate`."""
    from eaglegate.live import calibrate as cal
    from eaglegate.live.sweep import read_results

    base_file = check_text("baseline", baseline, TEXT_LIMITS["baseline"])
    spec_file = check_text("spec", spec, TEXT_LIMITS["spec"])
    check_fraction("--margin", margin)
    figures: dict[str, Any] | None = None
    spread: cal.Spread | None = None
    if estimate is not None:
        for name in ESTIMATE_FIGURES:
            check_figure(name, getattr(estimate, name))
        check_text("gpu", estimate.gpu, TEXT_LIMITS["gpu"])
        if base_file or spec_file:
            raise UsageError("--estimate takes no sweep files")
        missing = [n for n, v in (("--params-b", estimate.params_b), ("--draft-tokens", estimate.draft_tokens),
                                  ("--accept-len", estimate.accept_len)) if v is None]
        if missing:
            raise UsageError(f"--estimate needs {', '.join(missing)}")
        assert estimate.params_b is not None and estimate.draft_tokens is not None
        assert estimate.accept_len is not None
        check_count("--context-len", estimate.context_len)
        check_count("--max-concurrency", estimate.max_concurrency, 2)
        flops, bw = cal.roofline_for_gpu(estimate.gpu, estimate.peak_tflops, estimate.bandwidth_tbs)
        model = cal.Roofline(
            params_b=estimate.params_b, draft_tokens=estimate.draft_tokens, accept_len=estimate.accept_len,
            peak_tflops=flops, bandwidth_tbs=bw, draft_params_b=estimate.draft_params_b,
            num_steps=estimate.num_steps, context_len=estimate.context_len,
            kv_kib_per_token=estimate.kv_kib_per_token, flops_efficiency=estimate.flops_efficiency,
            bandwidth_efficiency=estimate.bandwidth_efficiency, overhead_ms=estimate.overhead_ms,
        )
        base_curve, spec_curve = cal.estimate_curves(model, estimate.max_concurrency)
        figures = {
            "peak_tflops": flops, "bandwidth_tbs": bw, "draft_params_b": model.draft_b,
            "num_steps": model.steps, "kv_kib_per_token": model.kv_bytes / 1024,
            "context_len": estimate.context_len, "overhead_ms": estimate.overhead_ms,
        }
    else:
        if not base_file or not spec_file:
            raise UsageError("give two sweep files (baseline, spec), or --estimate with model parameters")
        base_points, spec_points = read_results(base_file), read_results(spec_file)
        base_curve = _curve(f"baseline ({base_file})", base_points)
        spec_curve = _curve(f"speculative ({spec_file})", spec_points)
        if any(p.low != p.high for p in base_points + spec_points):  # a level measured more than once
            spread = cal.Spread(_curve("baseline, lowest", base_points, "low"),
                                _curve("baseline, highest", base_points, "high"),
                                _curve("speculative, lowest", spec_points, "low"),
                                _curve("speculative, highest", spec_points, "high"))
    result = cal.calibrate(base_curve, spec_curve, margin=margin)
    return Calibrated(base_curve, spec_curve, cal.with_spread(result, spread) if spread else result, figures)


# The roofline's figures and whether each is a count; the roofline itself checks their ranges.
ESTIMATE_FIGURES = {"params_b": False, "draft_tokens": True, "accept_len": False, "peak_tflops": False,
                    "bandwidth_tbs": False, "draft_params_b": False, "num_steps": True, "context_len": True,
                    "kv_kib_per_token": False, "flops_efficiency": False, "bandwidth_efficiency": False,
                    "overhead_ms": False, "max_concurrency": True}


def check_figure(name: str, value: object) -> None:
    """An estimate's figure is a number (an integer where it counts): a JSON caller may send anything."""
    count = ESTIMATE_FIGURES[name]
    if value is not None and (isinstance(value, bool) or not isinstance(value, int if count else (int, float))):
        raise UsageError(f"--{name.replace('_', '-')} must be {'an integer' if count else 'a number'}, not {value!r}")


def _curve(label: str, points: list[Point], value: str = "output_throughput") -> Curve:
    from eaglegate.live.calibrate import Curve

    return Curve.of(label, [(p.concurrency, getattr(p, value)) for p in points])


def verify_live(url: object, baseline_url: object, *, low: object = 1, high: object = 128,
                tolerance: object = 0.1, prompts: object = None, max_tokens: object = 128, rounds: object = 2,
                logprobs: bool = True, api: object = "auto", model: object = None, timeout: object = 300.0,
                on_phase: Callable[[str, int, int], None] | None = None,
                on_request: Callable[[], None] | None = None) -> LiveReport:
    """Check that the gated server gives the plain server's greedy tokens and throughput."""
    from eaglegate.live.verify_live import verify_live as run

    levels = check_count("--low", low), check_count("--high", high)
    share = check_fraction("--tolerance", tolerance)
    tokens, per_worker = check_count("--max-tokens", max_tokens), check_count("--rounds", rounds)
    seconds = check_positive("--timeout", timeout)
    gated, plain = _endpoint(url, api), _endpoint(baseline_url, api)
    prompt_list = _prompts(prompts)
    return run(gated, plain, prompt_list, low=levels[0], high=levels[1], tolerance=share, max_tokens=tokens,
               rounds=per_worker, logprobs=bool(logprobs), timeout=seconds, model=check_text("--model", model),
               on_phase=on_phase, on_request=on_request)
