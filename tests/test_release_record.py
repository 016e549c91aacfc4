"""A cached release is checked against its wheel's RECORD before it is trusted (issue 45): a
file deleted from the cache, changed in it or added to it is noticed and the release fetched
again, with one line; an intact one is trusted on its stamp, fast. On a copy of a real
release's cache entry (never the shared cache itself)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from eaglegate.analyzer import source

from conftest import release

VERSION = "0.4.10.post2"


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A cache holding a verified copy of the release; fetching copies the genuine entry."""
    genuine = Path(release(VERSION).detail["cache"])
    assert source._record_of(genuine) is not None  # the shared entry carries its wheel's RECORD
    shutil.copytree(genuine, tmp_path / "releases" / VERSION)
    monkeypatch.setenv("EAGLEGATE_CACHE", str(tmp_path))

    def fetch(version: str, tmp: Path) -> Path:  # the wheel's files, without the network
        shutil.copytree(genuine, tmp / "tree", ignore=shutil.ignore_patterns(source._VERIFIED))
        return tmp / "tree"

    monkeypatch.setattr(source, "_fetch_release", fetch)
    return tmp_path / "releases" / VERSION


def _load(said: list[str]) -> source.SourceTree:
    return source.from_release(VERSION, said.append)


def test_an_intact_release_is_trusted_on_its_stamp(cache):
    said: list[str] = []
    _load(said)
    start = time.perf_counter()
    for _ in range(5):
        _load(said)
    assert said == [] and (time.perf_counter() - start) / 5 < 0.5


@pytest.mark.parametrize("damage, says", [
    ("delete", "is missing"), ("change", "differs from the wheel"), ("add", "is not in the wheel")])
def test_a_damaged_release_is_fetched_again_with_one_line(cache, damage, says):
    _load([])
    worker = cache / "sglang" / "srt" / "speculative" / "eagle_worker.py"
    original = worker.read_bytes()
    if damage == "delete":
        worker.unlink()
    elif damage == "change":
        worker.write_bytes(original.replace(b"class EAGLEWorker", b"class EAGLEWorkerX", 1))
        (cache / "sglang" / "srt" / "speculative" / "touch.tmp").touch()  # as an atomic write would
        (cache / "sglang" / "srt" / "speculative" / "touch.tmp").unlink()
    else:
        (cache / "sglang" / "srt" / "speculative" / "batch_gate.py").write_text("x = 1\n")
    said: list[str] = []
    tree = _load(said)
    assert len(said) == 1 and says in said[0] and said[0].startswith(f"cached sglang {VERSION} does not match")
    assert worker.read_bytes() == original and not (tree.root / "srt" / "speculative" / "batch_gate.py").exists()
    assert source.release_damage(cache, source._record_of(cache)) == ""


def test_a_release_an_older_eaglegate_cached_is_checked_and_kept_when_whole(cache):
    shutil.rmtree(source._record_of(cache).parent)
    (cache / source._VERIFIED).unlink(missing_ok=True)
    inode = (cache / "sglang" / "srt" / "server_args.py").stat().st_ino
    said: list[str] = []
    _load(said)
    assert len(said) == 1 and "RECORD" in said[0]
    assert source._record_of(cache) is not None
    assert (cache / "sglang" / "srt" / "server_args.py").stat().st_ino == inode  # kept, not replaced
