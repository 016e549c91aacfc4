"""eaglegate's on-disk cache: pickles named by what they were computed from.

An entry's name hashes its inputs (file contents, a tree digest) together with the
source of the code that computed it (`code_digest`), so editing the analyzer can never
serve a stale answer. Writes are atomic; an entry that cannot be written or read only
costs time.
"""

from __future__ import annotations

import gc
import hashlib
import os
import pickle
import shutil
import sys
import tempfile
import time
from functools import cache
from pathlib import Path

from eaglegate.analyzer.source import cache_dir


@cache
def code_digest(*files: str) -> str:
    """A short hash of these source files (and the Python version, which pickles depend on)."""
    hasher = hashlib.blake2b(digest_size=8)
    hasher.update(f"py{sys.version_info[0]}.{sys.version_info[1]}".encode())
    for name in files:
        hasher.update(Path(name).read_bytes())
    return hasher.hexdigest()


def analyzer_digest(*also: str) -> str:
    """`code_digest` of the whole analyzer package (this file's folder), and of the files
    `also` (the code that goes on from the analysis to an answer)."""
    folder = Path(__file__).resolve().parent
    return code_digest(*sorted(str(p) for p in folder.rglob("*.py")), *also)


def entry(kind: str, key: str) -> Path:
    return cache_dir() / kind / key[:2] / f"{key}.pkl"


STALE_AFTER_S = 7 * 24 * 3600


def keep_generation(kind: str) -> None:
    """Mark `kind` (`summaries/<format>`) as in use, and delete its siblings written by other
    versions of the code that no run has used for a week: each upgrade of eaglegate (or
    edit of its analyzer) starts a new generation, and old ones would otherwise pile up."""
    current = cache_dir() / kind
    try:
        current.mkdir(parents=True, exist_ok=True)
        os.utime(current)
        cutoff = time.time() - STALE_AFTER_S
        for sibling in current.parent.iterdir():
            if sibling != current and sibling.is_dir() and sibling.stat().st_mtime < cutoff:
                shutil.rmtree(sibling, ignore_errors=True)
    except OSError:
        pass  # a cache that cannot be tidied only costs disk


def store(path: Path, value: object) -> None:
    """`value` pickled into `path` atomically; a value that does not pickle is not cached."""
    try:
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, RecursionError, TypeError, AttributeError):
        return
    _write(path, data)


# A checked entry: this tag, the digest of the pickle, the pickle. A whole answer is served
# as it is read, so bytes damaged on disk must be noticed, not unpickled into another answer.
_CHECKED = b"eaglegate-checked/1\n"
_CHECK_SIZE = 32


def store_checked(path: Path, value: object) -> None:
    """`store`, with the pickle's digest in front (see `load_checked`)."""
    try:
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, RecursionError, TypeError, AttributeError):
        return
    _write(path, _CHECKED + hashlib.blake2b(data, digest_size=_CHECK_SIZE).digest() + data)


def load_checked(path: Path) -> object:
    """The value `store_checked` wrote, or None when there is none, or when the entry is
    not whole and intact: such an entry is recomputed (and overwritten) by the caller."""
    try:
        blob = path.read_bytes()
    except OSError:
        return None
    head = len(_CHECKED) + _CHECK_SIZE
    if not blob.startswith(_CHECKED) or len(blob) < head:
        return None
    data = memoryview(blob)[head:]
    if hashlib.blake2b(data, digest_size=_CHECK_SIZE).digest() != blob[len(_CHECKED):head]:
        return None
    enabled = gc.isenabled()
    gc.disable()
    try:
        return pickle.loads(data)  # our own cache, written by this code, and intact
    except Exception:  # noqa: BLE001 - an unreadable entry only costs the time to recompute it
        return None
    finally:
        if enabled:
            gc.enable()


def _write(path: Path, data: bytes) -> None:
    """`data` into `path` atomically (a temporary file beside it, then `os.replace`)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError:
        pass


def load(path: Path) -> object:
    """The stored value, or None when there is none (or it cannot be read)."""
    # Unpickling many small objects triggers the cyclic GC over and over; pausing it
    # makes a warm load several times faster.
    enabled = gc.isenabled()
    gc.disable()
    try:
        with path.open("rb") as handle:
            return pickle.load(handle)  # our own cache, written by this code
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError, TypeError, ValueError):
        return None
    finally:
        if enabled:
            gc.enable()
