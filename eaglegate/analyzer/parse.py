"""Parse a tree of Python files into module summaries: in parallel, cached by content hash.

A second run re-parses nothing unchanged: each file's summary is stored under the
SHA-256 hash of its bytes (plus the summarizer's own source), so a moved or copied tree
hits the cache too.
"""

from __future__ import annotations

import gc
import hashlib
import os
import pickle
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eaglegate import __version__
from eaglegate.analyzer import cache
from eaglegate.analyzer import summary as summarizer
from eaglegate.analyzer.files import decode, read_bytes
from eaglegate.analyzer.summary import ModuleSummary, ParseFailure, summarize

# Summaries are named by the code that makes them: a changed summarizer never reads old ones.
SUMMARY_FORMAT = f"{__version__}-{cache.code_digest(summarizer.__file__, __file__)}"
_SKIP_DIRS = {"__pycache__", ".git", ".tox", ".venv", "venv", "node_modules", "build", "dist"}


@dataclass
class ParsedTree:
    root: Path
    modules: dict[str, ModuleSummary] = field(default_factory=dict)
    failures: list[ParseFailure] = field(default_factory=list)
    digest: str = ""  # hash over every file's hash: names this exact tree
    parsed: int = 0  # files parsed this run (the rest came from the cache)


def package_prefix(root: Path) -> list[str]:
    """The import path of `root` itself: it and each enclosing directory that is a package.

    So `sglang/srt` analysed alone still names its modules `sglang.srt.…`, and the
    package's absolute imports resolve."""
    names: list[str] = []
    current = root
    # A directory without __init__.py inside a package is a namespace subpackage (PEP 420).
    while current.name and ((current / "__init__.py").is_file() or (current.parent / "__init__.py").is_file()):
        names.insert(0, current.name)
        current = current.parent
    return names


def module_name(root: Path, file: Path, prefix: list[str] | None = None) -> tuple[str, bool]:
    """Dotted module name of `file` under `root` (see `package_prefix`)."""
    rel = file.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts.pop()
    return ".".join([*(package_prefix(root) if prefix is None else prefix), *parts]), is_package


def python_files(root: Path) -> list[Path]:
    """The tree's Python files; a symlink that leads outside the tree is not followed."""
    files: list[Path] = []
    resolved_root = root.resolve()
    for directory, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
        for name in sorted(names):
            path = Path(directory) / name
            if name.endswith(".py") and (not path.is_symlink() or path.resolve().is_relative_to(resolved_root)):
                files.append(path)
    return files


# Import statements anywhere in a file (module level, inside functions, under
# TYPE_CHECKING), found without parsing: enough to know which modules a question reaches.
_IMPORT = re.compile(
    rb"^[ \t]*(?:from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+\(?([^\n#]*)|import[ \t]+([^\n#]+))", re.M
)


def _imports(data: bytes, name: str, is_package: bool) -> set[str]:
    found: set[str] = set()
    package = name if is_package else name.rpartition(".")[0]
    for match in _IMPORT.finditer(data):
        if match.group(3):
            for part in match.group(3).decode(errors="replace").split(","):
                words = part.split()
                if words:
                    found.add(words[0])
            continue
        module = match.group(1).decode(errors="replace")
        level = len(module) - len(module.lstrip("."))
        base = module.lstrip(".")
        if level:
            anchor = package
            for _ in range(level - 1):
                anchor = anchor.rpartition(".")[0]
            base = f"{anchor}.{base}" if base else anchor
        found.add(base)
        for item in match.group(2).decode(errors="replace").replace("(", "").split(","):
            words = item.split()
            if words:
                found.add(f"{base}.{words[0]}")
    return found


def content_digest(data: bytes) -> str:
    """A file's bytes as a cache key. SHA-256: hashlib's fastest here (the CPU's SHA
    instructions), and every warm run hashes every file of the tree."""
    return hashlib.sha256(data).hexdigest()


def reachable_files(root: Path, class_names: tuple[str, ...],
                    digests: dict[Path, str] | None = None) -> list[Path]:
    """Files of the modules that define `class_names` and every module they import, transitively.

    A question about the scheduler and the EAGLE workers never needs the rest of the
    package (e.g. SGLang's separate multimodal generation runtime): parse only this.
    `digests` receives every file's `content_digest`, so `parse_tree` need not read and
    hash them again.
    """
    root = root.resolve()
    modules: dict[str, tuple[Path, bool]] = {}
    prefix = package_prefix(root)
    for file in python_files(root):
        name, is_package = module_name(root, file, prefix)
        modules[name] = (file, is_package)
    contents = {name: read_bytes(path) for name, (path, _) in modules.items()}
    # The answer depends only on the modules' names and bytes and on the question, and
    # scanning every file takes longer than hashing them: a second run reads it back.
    hashed = {name: content_digest(data) for name, data in contents.items()}
    if digests is not None:
        digests.update((modules[name][0], digest) for name, digest in hashed.items())
    key = hashlib.blake2b(repr(class_names).encode(), digest_size=20)
    for name in sorted(contents):
        key.update(f"{name}\0{hashed[name]}\0".encode())
    entry = f"reach-{key.hexdigest()}"
    cached = _load(entry)
    if isinstance(cached, list):
        return sorted(modules[name][0] for name in cached)
    defines = re.compile(rb"^[ \t]*class[ \t]+(?:" + b"|".join(re.escape(n.encode()) for n in class_names) + rb")\b",
                         re.M)
    stack = [name for name, data in contents.items() if defines.search(data)]
    seen: set[str] = set()
    while stack:
        name = stack.pop()
        if name in seen or name not in modules:
            continue
        seen.add(name)
        parts = name.split(".")
        stack.extend(".".join(parts[:i]) for i in range(1, len(parts)))  # parent packages run first
        for imported in _imports(contents[name], name, modules[name][1]):
            stack.append(imported if imported in modules else imported.rpartition(".")[0])
    _store(entry, sorted(seen))
    return sorted(modules[name][0] for name in seen)


@contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """Parsing and resolution allocate millions of small objects that reference counting frees
    (an AST has no cycles) or that live to the end (summaries, memo entries, edges): the
    cyclic GC would only re-scan them (it took half of `summarize` and of `build_all`). What
    survives the block is moved out of the GC's view (`gc.freeze`), or the first collection
    after it would scan it all once more; reference counting still frees it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


@contextmanager
def collecting_frozen() -> Iterator[None]:
    """For a process that outlives one analysis (the MCP server, a test session): frozen
    objects are never collected, so the cycles of every analysis it has dropped would stay in
    memory for good (half a gigabyte per SGLang tree). When the block froze anything, the
    frozen objects go back to the collector once, the garbage among them is collected, and
    what is still alive is frozen again (the point of freezing: later allocation bursts do not
    re-scan it). A command that analyses once and exits never needs this."""
    before = gc.get_freeze_count()
    try:
        yield
    finally:
        if gc.get_freeze_count() != before:
            gc.unfreeze()
            gc.collect()
            gc.freeze()


def _summarize_file(job: tuple[str, str, str, bool, str]) -> ModuleSummary | ParseFailure:
    with no_cyclic_gc():
        return _summarize_one(job)


def _summarize_one(job: tuple[str, str, str, bool, str]) -> ModuleSummary | ParseFailure:
    path, name, rel, is_package, digest = job
    data = read_bytes(path)
    try:
        text = decode(data)  # a BOM or a PEP 263 coding line, as Python reads them
    except UnicodeDecodeError as exc:
        return ParseFailure(rel, 0, f"not {exc.encoding}: {exc.reason} at byte {exc.start}")
    except SyntaxError as exc:  # a coding line naming an encoding Python does not know
        return ParseFailure(rel, exc.lineno or 0, str(exc.msg))
    result = summarize(text, name, rel, is_package)
    _store(digest, result)
    return result


def _store(key: str, result: object) -> None:
    cache.store(cache.entry(f"summaries/{SUMMARY_FORMAT}", key), result)


def _load(key: str) -> Any:
    return cache.load(cache.entry(f"summaries/{SUMMARY_FORMAT}", key))


def parse_tree(
    root: Path,
    files: Iterable[Path] | None = None,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    digests: Mapping[Path, str] | None = None,
) -> ParsedTree:
    """Summaries of every Python file under `root` (or of `files`), cached and in parallel.
    `digests`: files' `content_digest`s already computed (by `reachable_files`)."""
    with no_cyclic_gc():
        return _parse_tree(root, files, workers, progress, digests or {})


def _parse_tree(
    root: Path,
    files: Iterable[Path] | None,
    workers: int | None,
    progress: Callable[[int, int], None] | None,
    digests: Mapping[Path, str],
) -> ParsedTree:
    root = root.resolve()
    result = ParsedTree(root)
    pending: list[tuple[str, str, str, bool, str]] = []
    hashes = []
    keys: list[str] = []
    jobs: list[tuple[str, str, str, bool, str]] = []
    file_list = list(files) if files is not None else python_files(root)
    prefix = package_prefix(root)
    for file in file_list:
        rel = file.relative_to(root).as_posix()
        name, is_package = module_name(root, file, prefix)
        digest = digests.get(file) or content_digest(read_bytes(file))
        hashes.append(f"{name}:{rel}:{digest}")  # names are in the summaries, so in the key
        # The module name and path are part of the summary, so they are part of the key.
        key = hashlib.blake2b(f"{digest}|{name}|{rel}".encode(), digest_size=20).hexdigest()
        keys.append(key)
        jobs.append((str(file), name, rel, is_package, key))
    result.digest = hashlib.blake2b("\n".join(hashes).encode(), digest_size=20).hexdigest()
    cache.keep_generation(f"summaries/{SUMMARY_FORMAT}")
    packed = _load(f"tree-{result.digest}")
    if isinstance(packed, tuple):  # the whole tree, unchanged since the last run: one read
        blobs, result.failures = packed
        result.modules = {m.name: m for m in map(pickle.loads, blobs)}
        return result
    for job in jobs:
        cached = _load(job[4])
        if cached is None:
            pending.append(job)
        else:
            _add(result, cached)
    result.parsed = len(pending)
    total = len(pending)
    if progress:
        progress(0, total)
    workers = workers or min(os.cpu_count() or 1, 8)
    if total > 64 and workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for done, summary in enumerate(pool.map(_summarize_file, pending, chunksize=16), 1):
                _add(result, summary)
                if progress:
                    progress(done, total)
    else:
        for done, job in enumerate(pending, 1):
            _add(result, _summarize_file(job))
            if progress:
                progress(done, total)
    result.failures.sort(key=lambda f: f.path)
    # One pickle per module: a single pickle of the tree would hold a memo entry for every
    # object of every module until the end (hundreds of MB on the newest release).
    blobs = tuple(pickle.dumps(m, protocol=pickle.HIGHEST_PROTOCOL) for m in result.modules.values())
    _store(f"tree-{result.digest}", (blobs, result.failures))
    return result


def _add(result: ParsedTree, item: ModuleSummary | ParseFailure) -> None:
    if isinstance(item, ParseFailure):
        result.failures.append(item)
    else:
        result.modules[item.name] = item
