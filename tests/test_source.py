"""Finding SGLang: installed (here or in another interpreter), a path, a git checkout, a release."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eaglegate.analyzer import source
from eaglegate.cli import app

from conftest import release

SMALL = "0.4.10.post2"


def copy_package(dest: Path, version: str = SMALL) -> Path:
    """A real SGLang package copied under dest/sglang (never the shared cache itself)."""
    shutil.copytree(release(version).root, dest / "sglang")
    return dest / "sglang"


def fake_install(site: Path, version: str = SMALL) -> None:
    copy_package(site, version)
    info = site / f"sglang-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    (info / "RECORD").write_text("")


def test_release_is_fetched_once_and_names_its_version():
    tree = release(SMALL)
    assert tree.version == SMALL and tree.origin == "release"
    assert (tree.root / "srt" / "managers" / "scheduler.py").is_file()
    assert "EAGLEWorker" in source.speculative_workers(tree)


def test_path_accepts_package_parent_or_checkout_layout(tmp_path):
    copy_package(tmp_path / "python")
    for given in (tmp_path, tmp_path / "python", tmp_path / "python" / "sglang"):
        tree = source.from_path(given)
        assert tree.version == SMALL
        assert tree.root == (tmp_path / "python" / "sglang").resolve()


def test_installed_in_this_interpreter_reads_metadata_without_importing(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    fake_install(site)
    monkeypatch.syspath_prepend(str(site))
    tree = source.from_installed()
    assert tree.version == SMALL and tree.origin == "installed"
    assert tree.root == (site / "sglang").resolve()
    assert "sglang" not in sys.modules


def test_installed_in_another_interpreter(tmp_path):
    env = tmp_path / "serving-venv"
    venv.EnvBuilder(with_pip=False).create(env)
    python = env / "bin" / "python"
    site = Path(subprocess.check_output([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        text=True).strip())
    fake_install(site)
    tree = source.from_python(python)
    assert tree.version == SMALL and tree.origin == "python"
    assert tree.root == (site / "sglang").resolve()


def test_another_interpreter_without_sglang(tmp_path):
    env = tmp_path / "empty-venv"
    venv.EnvBuilder(with_pip=False).create(env)
    with pytest.raises(source.SourceError, match="not installed"):
        source.from_python(env / "bin" / "python")


def test_git_checkout_reports_commit_dirty_state_and_reads_a_tag(tmp_path, monkeypatch):
    import git

    monkeypatch.setenv("EAGLEGATE_CACHE", str(tmp_path / "cache"))
    repo_dir = tmp_path / "sglang-repo"
    copy_package(repo_dir / "python")
    repo = git.Repo.init(repo_dir)
    with repo.config_writer() as cfg:
        cfg.set_value("user", "name", "t").set_value("user", "email", "t@example.com")
    repo.git.add(A=True)
    repo.index.commit("import")
    repo.create_tag("v0.4.10.post2")
    head = repo.head.commit.hexsha

    tree = source.from_git(repo_dir)
    assert tree.detail["commit"] == head and tree.detail["dirty"] == "false"

    version_file = repo_dir / "python" / "sglang" / "version.py"
    version_file.write_text('__version__ = "9.9.9"\n')
    tree = source.from_git(repo_dir)
    assert tree.detail["dirty"] == "true" and tree.version == "9.9.9"

    # A tag is read from git, not from the (now modified) working tree.
    tagged = source.from_git(repo_dir, "v0.4.10.post2")
    assert tagged.version == SMALL and tagged.detail["commit"] == head
    assert (tagged.root / "srt" / "managers" / "scheduler.py").is_file()
    with pytest.raises(source.SourceError, match="no such revision"):
        source.from_git(repo_dir, "v0.0.0")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--path", "/nonexistent-dir"], "no such directory"),
        (["--path", "/tmp"], "not a SGLang tree"),
        (["--git", "/tmp"], "not a git checkout"),
        (["--rev", "v1"], "--rev needs --git"),
        (["--path", "/tmp", "--version", "0.5.9"], "choose one source"),
        (["--version", "not a version"], "not a version"),
        (["--python", "/nonexistent/python"], "no such interpreter"),
    ],
)
def test_bad_input_is_one_line_and_non_zero(args, message):
    proc = subprocess.run([sys.executable, "-m", "eaglegate", "locate", *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_version_not_on_the_index():
    with pytest.raises(source.SourceError, match="not on the package index|cannot reach"):
        source.from_release("0.0.0.post99")


def test_default_release_when_nothing_is_installed(monkeypatch):
    release(source.DEFAULT_RELEASE)
    monkeypatch.setattr(source, "from_installed", lambda: (_ for _ in ()).throw(source.SourceError("none")))
    tree = source.locate()
    assert tree.version == source.DEFAULT_RELEASE
    assert "no SGLang installed" in tree.note


def test_locate_json(tmp_path):
    copy_package(tmp_path)
    result = CliRunner().invoke(app, ["locate", "--path", str(tmp_path), "--json"])
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["version"] == SMALL and "EAGLEWorker" in data["speculative_workers"]


def test_wheel_installs_everything_under_the_eaglegate_namespace(tmp_path):
    repo = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                    "-w", str(tmp_path), str(repo)], check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("eaglegate-*.whl")
    import zipfile

    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"eaglegate"}
    names = zipfile.ZipFile(wheel).namelist()
    for sub in ("analyzer", "agents", "reports", "patches"):
        assert f"eaglegate/{sub}/__init__.py" in names


def test_version_read_from_generated_version_file_in_newer_wheels():
    # From 0.5.9 on, version.py imports the version from the generated _version.py.
    tree = source.from_path(release("0.5.9").root)
    assert tree.version == "0.5.9"


def test_an_explicit_linux_wheel_is_fetched_whatever_the_local_platform(tmp_path):
    # 0.5.12 and later ship one Linux x86-64 CPython wheel; the fallback commands ask for
    # it by platform and Python version, so the fetch does not depend on this interpreter.
    commands = source.download_commands("0.5.12.post1", tmp_path)
    explicit = next(c for c in commands if "--platform" in c and c[c.index("--python-version") + 1] == "3.11")
    subprocess.run(explicit, check=True, capture_output=True, timeout=600)
    (wheel,) = tmp_path.glob("sglang-0.5.12.post1-*.whl")
    assert "manylinux" in wheel.name and "cp311" in wheel.name
