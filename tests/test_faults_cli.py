"""The fault catalogue outside apply's writes, replayed through the command line:
each case ends in one line on stderr and a non-zero exit (2 for a usage error, 1 otherwise),
never a traceback nor a wrong answer; a tree it must not touch keeps its hash.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from pathlib import Path

import pytest
import typer

from eaglegate import __version__
from eaglegate.analyzer import source
from eaglegate.cli import app

from txhelpers import VERSION, copy_full, copy_subset, tree_hash

REPO = Path(__file__).resolve().parents[1]
SCHEDULER = "sglang/srt/managers/scheduler.py"
SERVER_ARGS = "sglang/srt/server_args.py"


def eaglegate(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "eaglegate", *args], capture_output=True, text=True,
                          timeout=600, env={**os.environ, **(env or {})})


def error_line(proc: subprocess.CompletedProcess[str], code: int = 1) -> str:
    """The one stderr line of a failed command."""
    assert proc.returncode == code, proc.stdout[-2000:] + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def break_class(file: Path, name: str) -> int:
    """Leave `class name(` unclosed, as a botched edit would; returns its line."""
    lines = file.read_text(encoding="utf-8").splitlines(keepends=True)
    lineno = next(n for n, line in enumerate(lines, 1) if re.match(rf"class {name}\b", line))
    lines[lineno - 1] = lines[lineno - 1].replace(f"class {name}", f"class {name}((", 1)
    file.write_text("".join(lines), encoding="utf-8")
    return lineno


@pytest.fixture
def site(release_tree, tmp_path) -> Path:
    return copy_full(release_tree(VERSION).root, tmp_path / "site")


# ---------------------------------------------------------------- 2: a needed file does not parse


def test_a_scheduler_that_does_not_parse_stops_map_plan_and_apply(site):
    file = site / SCHEDULER
    lineno = break_class(file, "Scheduler")
    before = tree_hash(site)
    expected = re.compile(rf"error: {re.escape(str(file))}:{lineno}: .+; it defines Scheduler, "
                          "which the map starts from: fix or restore that file")
    for args in (["map"], ["plan", "--threshold", "32"], ["apply", "--threshold", "32"]):
        line = error_line(eaglegate(*args, "--path", str(site)))
        assert expected.fullmatch(line), (args, line)
    assert tree_hash(site) == before  # apply wrote nothing
    assert eaglegate("status", "--path", str(site)).stdout.startswith("pristine")


def test_a_broken_file_the_map_does_not_need_is_skipped_but_stops_plan(site):
    file = site / SERVER_ARGS
    lineno = break_class(file, "ServerArgs")
    mapped = eaglegate("map", "--path", str(site))
    assert mapped.returncode == 0, mapped.stderr
    assert "1 file(s) did not parse and were skipped" in mapped.stdout
    assert f"srt/server_args.py:{lineno}:" in mapped.stdout
    assert "EAGLEWorker" in mapped.stdout and "Traceback" not in mapped.stderr
    line = error_line(eaglegate("plan", "--path", str(site)))
    assert re.fullmatch(rf"error: {re.escape(str(file))}:{lineno}: .+; the server's flags and "
                        "defaults are read from it: fix or restore that file", line), line


# ---------------------------------------------------------------- 3: one line, not a traceback


def _wheel_of(package: Path, dest: Path) -> Path:
    """A wheel-shaped zip of a real release's package (what `pip download` would fetch)."""
    wheel = dest / "sglang-0.5.9-py3-none-any.whl"
    record = io.StringIO()  # the wheel's RECORD, as every wheel has: path, sha256, size (CSV)
    rows = csv.writer(record, lineterminator="\n")
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as archive:
        for file in sorted(package.rglob("*")):
            if file.is_file():
                name = f"sglang/{file.relative_to(package).as_posix()}"
                data = file.read_bytes()
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                rows.writerow([name, f"sha256={digest}", len(data)])
                archive.writestr(name, data)
        rows.writerow(["sglang-0.5.9.dist-info/RECORD", "", ""])
        archive.writestr("sglang-0.5.9.dist-info/RECORD", record.getvalue())
    return wheel


def _flock_waiters(lock: Path) -> int:
    """How many processes or threads wait for an flock on `lock` (Linux /proc/locks)."""
    if not lock.exists():
        return 0
    inode = f":{lock.stat().st_ino} "
    return sum(1 for line in Path("/proc/locks").read_text().splitlines()
               if "->" in line and "FLOCK" in line and inode in line + " ")


def test_two_first_fetches_of_one_release_share_one_download(release_tree, tmp_path, monkeypatch):
    """The second fetch waits for the first and then reads its tree: before the lock it
    downloaded again and deleted the tree the first one was reading."""
    wheel = _wheel_of(release_tree(VERSION).root, tmp_path)  # from the shared cache, first
    cache = tmp_path / "cache"
    monkeypatch.setenv("EAGLEGATE_CACHE", str(cache))
    downloads: list[str] = []
    first_downloading, finish = threading.Event(), threading.Event()

    def download(version: str, dest: Path) -> Path:
        downloads.append(version)
        first_downloading.set()
        assert finish.wait(120)
        return Path(shutil.copy(wheel, dest))

    monkeypatch.setattr(source, "_pip_download", download)
    trees: dict[str, source.SourceTree] = {}
    told: list[str] = []  # what the CLI shows on stderr while the wheel downloads
    threads = {name: threading.Thread(target=lambda n=name: trees.__setitem__(
                   n, source.from_release(VERSION, on_fetch=told.append)))
               for name in ("first", "second")}
    threads["first"].start()
    assert first_downloading.wait(120)
    threads["second"].start()
    lock = cache / "releases" / f".{VERSION}.lock"
    # Let the first finish once the second is either queued on the lock or downloading too.
    deadline = time.monotonic() + 120
    while _flock_waiters(lock) == 0 and len(downloads) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    finish.set()
    for thread in threads.values():
        thread.join(120)
    assert downloads == [VERSION]
    assert told == [f"fetching sglang {VERSION} (pip download --no-deps) into {cache / 'releases' / VERSION}"]
    assert trees["first"].root == trees["second"].root == (cache / "releases" / VERSION / "sglang").resolve()
    assert source.is_sglang_package(trees["first"].root)
    assert [p.name for p in (cache / "releases").iterdir() if not p.name.endswith(".lock")] == [VERSION]


def test_an_unusable_cache_folder_is_one_line(tmp_path):
    not_a_folder = tmp_path / "cache"
    not_a_folder.write_text("a file where the cache should be\n")
    line = error_line(eaglegate("locate", "--version", "0.4.7", env={"EAGLEGATE_CACHE": str(not_a_folder)}))
    assert line == (f"error: cannot use the cache folder {not_a_folder}: Not a directory "
                    f"({not_a_folder}/releases); set EAGLEGATE_CACHE to a writable folder")


def test_a_malformed_url_is_one_line():
    line = error_line(eaglegate("sweep", "--url", "http://[::1", "-c", "1"), 2)
    assert line == "error: not a URL: 'http://[::1' (Invalid IPv6 URL)"


@pytest.mark.parametrize("exe, says", [
    ("/bin/true", "gave no answer to the metadata query; is it a Python interpreter?"),
    ("/bin/false", "failed the metadata query (exit status 1); is it a Python interpreter?"),
])
def test_an_interpreter_that_is_not_python_is_one_line(exe, says):
    assert error_line(eaglegate("locate", "--python", exe)) == f"error: {exe} {says}"


# ---------------------------------------------------------------- 4: Python 3.11.2


def test_git_rev_export_without_tar_filters(tmp_path, monkeypatch, release_tree):
    """Python before 3.11.4 (Debian 12's 3.11.2) has no `extractall(filter=)`; CI also runs
    the suite on that interpreter, this replays it on any."""
    import git

    release = release_tree(VERSION).root  # from the shared cache, before it is redirected
    monkeypatch.setenv("EAGLEGATE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delattr(tarfile, "data_filter", raising=False)
    real = tarfile.TarFile.extractall

    def old_extractall(self, path=".", members=None, *, numeric_owner=False, **kwargs):
        if kwargs:
            raise TypeError(f"extractall() got an unexpected keyword argument {next(iter(kwargs))!r}")
        return real(self, path, members, numeric_owner=numeric_owner)

    monkeypatch.setattr(tarfile.TarFile, "extractall", old_extractall)
    checkout = tmp_path / "sglang-repo"
    copy_subset(release, checkout / "python")
    repo = git.Repo.init(checkout)
    repo.git.add(A=True)
    repo.git.commit("-q", "-m", "import", env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                                               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})
    repo.create_tag("v0.5.9")
    tree = source.from_git(checkout, "v0.5.9")
    assert tree.version == VERSION and tree.detail["commit"] == repo.head.commit.hexsha
    assert (tree.root / "srt" / "managers" / "scheduler.py").read_bytes() == (
        checkout / "python" / SCHEDULER).read_bytes()


# ---------------------------------------------------------------- 7 and 8: README promises, small things


def test_usage_errors_are_one_line_with_exit_2(site):
    assert error_line(eaglegate("map", "--bogus"), 2) == "error: No such option: --bogus (see `eaglegate map --help`)"
    assert error_line(eaglegate("apply", "--path", str(site)), 2).startswith("error: Missing option '--threshold'")
    line = error_line(eaglegate("apply", "--threshold", "99999999999999999999", "--path", str(site)), 2)
    # The application layer's words, as `eaglegate tool` and MCP give them for the same value.
    assert line == "error: threshold must be an integer batch size from 1 to 2147483647, not 99999999999999999999"


def test_version_option():
    proc = eaglegate("--version")
    assert proc.returncode == 0 and proc.stdout == f"eaglegate {__version__}\n"


def test_a_flag_without_its_value_is_refused():
    line = error_line(eaglegate("plan", "--version", VERSION, "--threshold", "32",
                                "--flags=--speculative-algorithm"))
    assert line == ("error: --speculative-algorithm needs a value in --flags "
                    "(--speculative-algorithm VALUE or --speculative-algorithm=VALUE)")
    # A switch (`action="store_true"` in this version's server_args) takes none.
    proc = eaglegate("plan", "--version", VERSION, "--threshold", "32", "--json",
                     "--flags=--speculative-algorithm EAGLE3 --disable-overlap-schedule")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["worker"] == "EAGLEWorker"


def test_output_into_a_missing_folder_is_refused_before_any_work(tmp_path):
    missing = tmp_path / "no" / "such"
    for args in (["report", "--version", VERSION, "-f", "md"], ["graph", str(tmp_path)],
                 ["sweep", "--url", "localhost:1"]):
        line = error_line(eaglegate(*args, "-o", str(missing / "out.txt")), 2)
        assert f"no such folder: {missing} (create it first)" in line, line
    assert not (tmp_path / "no").exists()


def test_piped_output_is_not_wrapped_at_80_columns():
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    wide = subprocess.run([sys.executable, "-m", "eaglegate", "couplings", "--version", VERSION],
                          capture_output=True, text=True, timeout=600, env=env)
    narrow = eaglegate("couplings", "--version", VERSION, env={"COLUMNS": "80"})
    assert wide.returncode == narrow.returncode == 0
    assert max(map(len, wide.stdout.splitlines())) > 80
    assert max(map(len, narrow.stdout.splitlines())) <= 80  # COLUMNS still decides
    assert len(wide.stdout.splitlines()) < len(narrow.stdout.splitlines())


def test_calibrate_help_keeps_the_plot_extra():
    assert "eaglegate[plot]" in eaglegate("calibrate", "--help", env={"COLUMNS": "200"}).stdout


def test_every_command_but_graph_mcp_and_tool_has_json_as_the_readme_says():
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    without = {name for name, command in commands.items()
               if not any("--json" in p.opts for p in command.params)}
    assert without == {"graph", "mcp", "tool"}
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "Every command except `graph`, `mcp` and `tool` has `--json`" in readme
