"""Find the SGLang source a user has, without importing it.

Every way of naming a tree ends in one `SourceTree`: the directory of the `sglang`
package, the version it declares, and where it came from. Importing sglang would pull
torch and CUDA, so versions come from distribution metadata or the package's own
`version.py`.
"""

from __future__ import annotations

import ast
import base64
import csv
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from eaglegate.analyzer import files
from eaglegate.errors import UserError

DEFAULT_RELEASE = "0.5.9"  # where the EAGLE-3 throughput plateau was first reported
PACKAGE = "sglang"

# Releases from 0.5.12 on ship only Linux x86-64 wheels for one CPython each; asking for
# such a wheel explicitly makes the fetch work from any OS and interpreter.
_WHEEL_PLATFORM = "manylinux_2_34_x86_64"
_WHEEL_PYTHONS = ("3.11", "3.12", "3.10", "3.13", "3.14")


class SourceError(UserError):
    """A tree could not be found or fetched; the message is one line for the user."""


@dataclass
class SourceTree:
    root: Path  # the `sglang` package directory (holds `srt/`)
    version: str
    origin: str  # installed | python | path | git | release
    detail: dict[str, str] = field(default_factory=dict)
    note: str = ""  # a one-line remark shown to the user (e.g. a default was used)

    @property
    def label(self) -> str:
        return f"SGLang {self.version} ({self.origin})"

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["root"] = str(self.root)
        return data


def cache_dir() -> Path:
    """eaglegate's own cache: `$EAGLEGATE_CACHE`, else the XDG cache directory."""
    env = os.environ.get("EAGLEGATE_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "eaglegate"


def portable_text(text: str, repo: Path | None = None) -> str:
    """`text` with this machine's paths written as they read on anyone's: eaglegate's cache as
    `~/.cache/eaglegate`, the repository `repo` (when given) as relative paths, the temp
    folder as `$TMPDIR`, the home folder as `~`. For generated documents that are committed."""
    swaps = [(cache_dir(), "~/.cache/eaglegate"), (Path(tempfile.gettempdir()), "$TMPDIR"),
             (Path.home(), "~")]
    if repo is not None:
        swaps.insert(0, (repo, "."))
    for folder, shown in swaps:
        for form in sorted({str(folder), str(folder.resolve())}, key=len, reverse=True):
            if shown == ".":  # inside the repository: plain relative paths
                text = text.replace(form + "/", "")
            text = re.sub(re.escape(form) + r"(?![\w.-])", shown, text)
    return text


def is_sglang_package(path: Path) -> bool:
    return (path / "__init__.py").is_file() and (path / "srt").is_dir()


def read_package_version(package_dir: Path) -> str | None:
    """The version the package declares in `version.py` or `_version.py` (no import)."""
    for name in ("_version.py", "version.py"):  # newer wheels keep it in the generated _version.py
        version_file = package_dir / name
        if not version_file.is_file():
            continue
        tree = files.tree(version_file)
        if tree is None:
            continue
        for node in tree.body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            if "__version__" in names and isinstance(value, ast.Constant) and isinstance(value.value, str):
                return value.value
    return None


def _package_in(directory: Path) -> Path | None:
    """The sglang package at, inside, or under `python/` of a directory."""
    for candidate in (directory, directory / PACKAGE, directory / "python" / PACKAGE):
        if is_sglang_package(candidate):
            return candidate.resolve()
    return None


def from_path(path: str | Path) -> SourceTree:
    directory = Path(path).expanduser()
    if not directory.exists():
        raise SourceError(f"no such directory: {directory}")
    package = _package_in(directory)
    if package is None:
        raise SourceError(f"not a SGLang tree: {directory} (no sglang package with srt/ found)")
    version = read_package_version(package) or "unknown"
    return SourceTree(package, version, "path")


# A script run by another interpreter: reads metadata only, never imports sglang.
_PROBE = r"""
import json, sys
from importlib import metadata
try:
    dist = metadata.distribution("sglang")
except metadata.PackageNotFoundError:
    print(json.dumps({"error": "not-installed"})); sys.exit(0)
direct = dist.read_text("direct_url.json") or ""
print(json.dumps({"version": dist.version, "location": str(dist.locate_file("sglang")),
                  "direct_url": direct}))
"""


def _from_metadata(version: str, location: str, direct_url: str, origin: str) -> SourceTree:
    package = Path(location)
    detail: dict[str, str] = {}
    if not is_sglang_package(package) and direct_url:
        # Editable installs point at the checkout through direct_url.json.
        url = json.loads(direct_url).get("url", "")
        if url.startswith("file://"):
            found = _package_in(Path(url[len("file://") :]))
            if found:
                package = found
                detail["editable"] = url
    if not is_sglang_package(package):
        raise SourceError(f"sglang {version} is installed but its source is not at {package}")
    return SourceTree(package.resolve(), version, origin, detail)


def from_installed() -> SourceTree:
    """The SGLang installed in this interpreter."""
    # Imported here: it costs a warm `map --version` (which never reads it) a tenth of its start.
    from importlib import metadata

    try:
        dist = metadata.distribution(PACKAGE)
    except metadata.PackageNotFoundError:
        raise SourceError(f"sglang is not installed in {sys.executable}") from None
    return _from_metadata(
        dist.version, str(dist.locate_file(PACKAGE)), dist.read_text("direct_url.json") or "", "installed"
    )


def from_python(python: str | Path) -> SourceTree:
    """The SGLang installed in another interpreter (a serving venv)."""
    exe = shutil.which(str(python)) or str(python)
    if not Path(exe).exists():
        raise SourceError(f"no such interpreter: {python}")
    try:
        proc = subprocess.run([exe, "-I", "-c", _PROBE], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise SourceError(f"{exe} did not answer the metadata query within 60 s") from None
    except OSError as exc:
        raise SourceError(f"cannot run {exe}: {exc.strerror}") from None
    if proc.returncode != 0:
        last = next((line for line in reversed(proc.stderr.splitlines()) if line.strip()), "")
        raise SourceError(f"{exe} failed the metadata query (exit status {proc.returncode})"
                          + (f": {last.strip()}" if last else "; is it a Python interpreter?"))
    try:
        info = json.loads(proc.stdout.strip().splitlines()[-1])
        if not isinstance(info, dict):
            raise ValueError(info)
    except (ValueError, IndexError):
        raise SourceError(f"{exe} gave no answer to the metadata query; is it a Python interpreter?") from None
    if info.get("error") == "not-installed":
        raise SourceError(f"sglang is not installed in {exe}")
    tree = _from_metadata(info["version"], info["location"], info["direct_url"], "python")
    tree.detail["python"] = exe
    return tree


def from_git(path: str | Path, rev: str | None = None) -> SourceTree:
    """A git checkout: its working tree, or the tree of `rev` exported into the cache."""
    import git  # GitPython; imported here so plain analysis does not pay for it

    try:
        repo = git.Repo(Path(path).expanduser(), search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise SourceError(f"not a git checkout: {path}") from None
    work = Path(repo.working_tree_dir or path)
    if rev is None:
        tree = from_path(work)
        commit = repo.head.commit.hexsha if repo.head.is_valid() else ""
        tree.origin = "git"
        tree.detail.update(commit=commit, dirty=str(repo.is_dirty(untracked_files=True)).lower())
        return tree
    try:
        commit = repo.commit(rev).hexsha
    except (git.BadName, ValueError, git.GitCommandError):
        raise SourceError(f"no such revision in {work}: {rev}") from None
    package = _package_in(work)
    if package is None:
        raise SourceError(f"not a SGLang tree: {work}")
    rel = package.relative_to(work.resolve()).as_posix()
    target = cache_dir() / "git" / commit
    with _cache_entry(target) as tmp:
        if tmp is not None:
            archive = tmp / "tree.tar"
            with archive.open("wb") as handle:
                repo.archive(handle, treeish=commit, path=rel)
            staging = tmp / "out"
            with tarfile.open(archive) as tar:
                _extract(tar, staging)
            (staging / rel).rename(_ensure(staging / "pkg") / PACKAGE)
            (staging / "pkg").rename(target)
    version = read_package_version(target / PACKAGE) or rev
    return SourceTree(
        (target / PACKAGE).resolve(), version, "git", {"commit": commit, "rev": rev, "checkout": str(work)}
    )


def _ensure(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _extract(tar: tarfile.TarFile, dest: Path) -> None:
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, filter="data")
    else:
        # Python before 3.11.4 (Debian 12's 3.11.2) has no extraction filters; the archive is
        # `git archive` of the user's own checkout, whose paths all stay inside the tree.
        tar.extractall(dest)


@contextmanager
def _entry_lock(target: Path) -> Iterator[None]:
    """The cache entry's exclusive lock (one fetch or check of it at a time)."""
    try:
        with (target.parent / f".{target.name}.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield
    except OSError as exc:
        raise _cache_error(exc) from None


def _cache_error(exc: OSError) -> SourceError:
    return SourceError(f"cannot use the cache folder {cache_dir()}: {exc.strerror}"
                       f"{f' ({exc.filename})' if exc.filename else ''}; "
                       "set EAGLEGATE_CACHE to a writable folder")


@contextmanager
def _cache_entry(target: Path) -> Iterator[Path | None]:
    """Fill the cache entry `target` once, safely against concurrent runs.

    Yields a scratch folder beside `target` when the entry is missing (the caller builds the
    tree there and renames it to `target`), or None when it is complete. An exclusive lock
    per entry makes a second run wait for the first, then find the entry complete; a
    complete entry is never deleted, so nobody's tree vanishes while they read it.
    """
    try:
        _ensure(target.parent)
        if is_sglang_package(target / PACKAGE):
            yield None
            return
        with (target.parent / f".{target.name}.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if is_sglang_package(target / PACKAGE):
                yield None
                return
            shutil.rmtree(target, ignore_errors=True)  # debris of an older, killed fetch
            with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}-") as tmp:
                yield Path(tmp)
    except OSError as exc:
        raise _cache_error(exc) from None


def download_commands(version: str, dest: Path) -> list[list[str]]:
    """The `pip download` commands to try in turn: a wheel for this interpreter, then a
    Linux x86-64 CPython wheel for each Python a release may have been built for."""
    base = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
            "--no-input", "-q", "-d", str(dest), f"{PACKAGE}=={version}", "--only-binary=:all:"]
    return [base] + [base + ["--platform", _WHEEL_PLATFORM, "--python-version", py, "--implementation", "cp"]
                     for py in _WHEEL_PYTHONS]


def _pip_download(version: str, dest: Path) -> Path:
    """Fetch the sglang wheel of `version` into `dest`; returns the wheel path."""
    last = ""
    for cmd in download_commands(version, dest):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        wheels = sorted(dest.glob("*.whl"))
        if proc.returncode == 0 and wheels:
            return wheels[0]
        last = proc.stderr
        if _looks_offline(last):
            raise SourceError(f"cannot reach the package index to fetch sglang {version} (offline?)")
    if "No matching distribution" in last or "Could not find a version" in last:
        raise SourceError(f"sglang {version} is not on the package index")
    lines = [line for line in last.splitlines() if line.strip()]
    raise SourceError(f"pip could not fetch sglang {version}: {lines[-1] if lines else 'unknown error'}")


def _looks_offline(stderr: str) -> bool:
    return bool(re.search(r"NewConnectionError|Network is unreachable|Temporary failure in name"
                          r"|Name or service not known|Max retries exceeded", stderr))


def from_release(version: str, on_fetch: Callable[[str], None] | None = None) -> SourceTree:
    """A released version, fetched as a wheel with `pip download --no-deps` and cached, and
    checked against the wheel's RECORD before it is trusted (`_check_release`).

    `on_fetch` is told, in one line, when a download starts (it takes seconds)."""
    if not re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", version):
        raise SourceError(f"not a version: {version!r}")
    target = cache_dir() / "releases" / version
    package = target / PACKAGE
    with _cache_entry(target) as tmp:
        if tmp is not None:
            if on_fetch:
                on_fetch(f"fetching sglang {version} (pip download --no-deps) into {target}")
            _fetch_release(version, tmp).rename(target)  # atomic: a half-extracted tree never looks complete
    _check_release(version, target, on_fetch)
    declared = read_package_version(package) or version
    return SourceTree(package.resolve(), declared, "release", {"cache": str(target)})


def _fetch_release(version: str, tmp: Path) -> Path:
    """The wheel's sglang package and its RECORD, extracted under `tmp`; the folder to rename."""
    wheel = _pip_download(version, tmp)
    staging = tmp / "tree"
    with zipfile.ZipFile(wheel) as archive:
        members = [m for m in archive.namelist()
                   if m.startswith(f"{PACKAGE}/") or re.fullmatch(rf"{PACKAGE}-[^/]+\.dist-info/RECORD", m)]
        archive.extractall(staging, members)
    if not is_sglang_package(staging / PACKAGE):
        raise SourceError(f"the wheel for sglang {version} holds no sglang/srt package")
    return staging


# A cached release's stamp: written once its files matched the wheel's RECORD, it holds the
# digest of its folders' modification times (`_folders_stamp`). Adding, deleting or renaming
# a file (an atomic write included) changes its folder's time, and the next run checks again.
_VERIFIED = ".eaglegate-verified"


def _folders_stamp(package: Path) -> str:
    """A digest of every folder's path and modification time under the package: about 600
    `stat` calls on 0.5.23, where reading every file would cost a warm `map` seconds."""
    hasher = hashlib.blake2b(digest_size=16)
    stack = [package]
    while stack:
        folder = stack.pop()
        hasher.update(f"{folder}\0{folder.stat().st_mtime_ns}\n".encode())
        with os.scandir(folder) as entries:
            stack += sorted((Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)), reverse=True)
    return hasher.hexdigest()


def _record_of(target: Path) -> Path | None:
    return next(iter(sorted(target.glob(f"{PACKAGE}-*.dist-info/RECORD"))), None)


def release_damage(target: Path, record: Path) -> str:
    """What differs between a cached release and its wheel's RECORD (sha256 and size per
    file): a file missing or changed, or a module the wheel does not hold; "" when none."""
    expected: dict[str, tuple[str, str]] = {}
    for row in csv.reader(record.read_text(encoding="utf-8").splitlines()):
        if len(row) >= 3 and row[0].startswith(f"{PACKAGE}/"):
            expected[row[0]] = (row[1], row[2])
    for rel, (digest, size) in sorted(expected.items()):
        path = target / rel
        if not path.is_file():
            return f"{rel} is missing"
        if size and path.stat().st_size != int(size):
            return f"{rel} differs from the wheel"
        algorithm, _, want = digest.partition("=")
        if algorithm == "sha256":
            got = base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()
            if got != want:
                return f"{rel} differs from the wheel"
    for path in sorted((target / PACKAGE).rglob("*.py")):
        rel = path.relative_to(target).as_posix()
        if rel not in expected:
            return f"{rel} is not in the wheel"
    return ""


def _check_release(version: str, target: Path, on_fetch: Callable[[str], None] | None) -> None:
    """Trust a cached release only once its files match its wheel's RECORD: checked in full
    when its folders changed since the last check (or it has never been checked), else by
    the stamp alone. A damaged entry is fetched again; one an older eaglegate cached without
    its RECORD is checked against the RECORD of the wheel fetched again, and kept when whole
    (one line to `on_fetch` either way); a fetch that fails says why in one line."""
    stamp_file = target / _VERIFIED
    try:
        record = _record_of(target)
        if record is not None and stamp_file.read_text(encoding="utf-8") == _folders_stamp(target / PACKAGE):
            return
    except OSError:
        pass  # no stamp yet, or unreadable: check in full
    with _entry_lock(target):
        record = _record_of(target)
        damage = release_damage(target, record) if record is not None else ""
        if record is None or damage:
            if on_fetch:
                on_fetch(f"cached sglang {version} does not match its wheel ({damage}): fetching it again" if damage
                         else f"fetching sglang {version}'s RECORD to check the copy an older eaglegate cached")
            with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}-") as tmp:
                fresh = _fetch_release(version, Path(tmp))
                record = _record_of(fresh)
                if record is None:
                    raise SourceError(f"the wheel for sglang {version} has no RECORD to check the cached copy against")
                if not damage and not release_damage(target, record):
                    record.parent.rename(target / record.parent.name)  # the old copy is whole: keep it
                else:  # the damaged tree moves aside in one rename, the fresh one in in another
                    os.rename(target, Path(tmp) / "damaged")
                    fresh.rename(target)
        try:
            (target / _VERIFIED).write_text(_folders_stamp(target / PACKAGE), encoding="utf-8")
        except OSError:
            pass  # a cache that cannot keep the stamp is checked in full next time


def locate(
    *,
    path: str | Path | None = None,
    python: str | Path | None = None,
    git_path: str | Path | None = None,
    rev: str | None = None,
    version: str | None = None,
    on_fetch: Callable[[str], None] | None = None,
) -> SourceTree:
    """Resolve the user's options to one tree; with none, the installed SGLang or the default release.

    `on_fetch` is told when a release must be downloaded first."""
    chosen = [name for name, value in
              (("--path", path), ("--python", python), ("--git", git_path), ("--version", version))
              if value]
    if len(chosen) > 1:
        raise SourceError(f"choose one source, not {' and '.join(chosen)}")
    if rev and not git_path:
        raise SourceError("--rev needs --git")
    if path:
        return from_path(path)
    if python:
        return from_python(python)
    if git_path:
        return from_git(git_path, rev)
    if version:
        return from_release(version, on_fetch)
    try:
        return from_installed()
    except SourceError:
        tree = from_release(DEFAULT_RELEASE, on_fetch)
        tree.note = f"no SGLang installed here: using release {DEFAULT_RELEASE} (fetched and cached)"
        return tree


def speculative_workers(tree: SourceTree) -> list[str]:
    """Worker classes declared under the package's `speculative` directories (fast scan)."""
    found: set[str] = set()
    for spec_dir in tree.root.rglob("speculative"):
        if not spec_dir.is_dir():
            continue
        for file in spec_dir.rglob("*.py"):
            for match in re.finditer(r"^class\s+(\w*Worker\w*)\s*[(:]", _read(file), re.M):
                found.add(match.group(1))
    return sorted(found)


def _read(file: Path) -> str:
    try:
        return files.read_bytes(file).decode("utf-8", errors="replace")
    except OSError:
        return ""
