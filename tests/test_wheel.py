"""The distribution: ``python -m build`` gives a wheel and an sdist that ``twine check`` accepts,
the wheel carries every file the library reads at run time, and the wheel installed into a clean
virtual environment (not editable) answers ``memlab estimate``, ``memlab bits`` and ``memlab
plan`` from a folder outside the checkout exactly as the checkout's library does.

The three that build are marked ``slow``: the build takes seconds, the install into a fresh
environment a minute or more (torch; pip's cache makes a second run quicker). The install is held to requirements.txt's pins
through a constraints file, so it brings nothing the book's own environment does not have.
"""

from __future__ import annotations

import fnmatch
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import tomllib

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGE = REPO_ROOT / "src" / "memlab"
DISTRIBUTION = "memlab-book"  # the import name and the command stay memlab
# What torch's CUDA build brings beside it where pip finds that build (requirements.txt pins the
# CPU machine's set): not the wheel's to pin.
CUDA_TORCH_DEPS = ("nvidia-", "triton", "cuda-")
COMMANDS = (
    ("estimate", "--model", "llama2-7b", "--precision", "bf16-mixed", "--optimizer", "adamw",
     "--batch-size", "1", "--seq-len", "2048"),
    ("bits", "3.14159265", "--format", "fp16"),
    ("plan", "--model", "llama2-7b", "--gpu", "a100-80gb", "--global-batch", "8", "--seq-len", "2048"),
)


def _pyproject() -> dict:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())


def _run(cmd: list[str], *, cwd: Path, env: dict | None = None, timeout: int = 900) -> str:
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{' '.join(map(str, cmd))} exited {out.returncode}:\n{out.stdout}\n{out.stderr}"
    return out.stdout


def _clean_env(**extra: str) -> dict:
    """The environment without anything that would put the checkout on the import path."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")}
    env.update(OMP_NUM_THREADS="1", PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)
    return env


def runtime_files() -> list[str]:
    """The package's files, relative to ``src/``: its modules and every file package-data names.

    A file in the package that is neither a module nor matched by package-data is reported by
    :func:`test_package_data_names_every_data_file`, so a new data file cannot be left out quietly.
    """
    globs = _pyproject()["tool"]["setuptools"]["package-data"]["memlab"]
    files = []
    for p in sorted(PACKAGE.rglob("*")):
        if not p.is_file() or "__pycache__" in p.parts:
            continue
        rel = p.relative_to(PACKAGE).as_posix()
        if p.suffix == ".py" or any(fnmatch.fnmatch(rel, g) for g in globs):
            files.append(f"memlab/{rel}")
    return files


def test_package_data_names_every_data_file():
    globs = _pyproject()["tool"]["setuptools"]["package-data"]["memlab"]
    data = [p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts]
    unlisted = [rel for rel in data if not any(fnmatch.fnmatch(rel, g) for g in globs)]
    assert data and not unlisted, f"files in src/memlab that package-data does not name: {unlisted}"
    assert _pyproject()["project"]["name"] == DISTRIBUTION


def test_the_book_links_the_packaged_fsdp_config():
    from memlab.distributed.accel import ACCELERATE_FSDP_CONFIG, fsdp_config_file

    assert fsdp_config_file().is_file() and fsdp_config_file().is_relative_to(PACKAGE)
    assert (REPO_ROOT / ACCELERATE_FSDP_CONFIG).resolve() == fsdp_config_file()


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """The sdist and the wheel (built from the sdist, as ``python -m build`` does)."""
    pytest.importorskip("build", reason="the build package is not installed (requirements.txt pins it)")
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--outdir", str(out), str(REPO_ROOT)], cwd=out,
         env=_clean_env())
    return out


def _one(dist: Path, pattern: str) -> Path:
    found = sorted(dist.glob(pattern))
    assert len(found) == 1, f"expected one {pattern} in {dist}, found {[p.name for p in found]}"
    return found[0]


@pytest.mark.slow
def test_twine_accepts_the_wheel_and_the_sdist(dist):
    pytest.importorskip("twine", reason="twine is not installed (requirements.txt pins it)")
    wheel, sdist = _one(dist, "memlab_book-*.whl"), _one(dist, "memlab_book-*.tar.gz")
    out = _run([sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)], cwd=dist)
    assert out.count("PASSED") == 2, out


@pytest.mark.slow
def test_wheel_carries_every_runtime_file(dist):
    from memlab._version import __version__

    wheel = _one(dist, "memlab_book-*.whl")
    assert wheel.name.startswith(f"memlab_book-{__version__}-py3-none-any"), wheel.name
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = runtime_files()
    missing = [f for f in wanted if f not in names]
    assert not missing, f"the wheel lacks {missing}"
    assert any(not f.endswith(".py") for f in wanted)  # the data files are among them
    entry_points = zipfile.ZipFile(wheel).read(
        f"memlab_book-{__version__}.dist-info/entry_points.txt").decode()
    assert "memlab = memlab.cli:main" in entry_points


def _canonical(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(".", "-")


def _constraints(tmp: Path) -> Path:
    """requirements.txt as a constraints file: whatever the wheel needs, at the book's pins."""
    path = tmp / "constraints.txt"
    path.write_text((REPO_ROOT / "requirements.txt").read_text())
    return path


@pytest.mark.slow
def test_installed_wheel_answers_like_the_checkout(dist, tmp_path):
    wheel = _one(dist, "memlab_book-*.whl")
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    py, memlab = venv / "bin" / "python", venv / "bin" / "memlab"
    _run([str(py), "-m", "pip", "install", "--quiet", "-c", str(_constraints(tmp_path)), str(wheel)],
         cwd=tmp_path, env=_clean_env(), timeout=1800)
    pins = {_canonical(line.split("==")[0]): line.split("==")[1]
            for line in (REPO_ROOT / "requirements.txt").read_text().splitlines() if "==" in line}
    installed = _run([str(py), "-m", "pip", "list", "--format=freeze", "--exclude", DISTRIBUTION,
                      "--exclude", "pip", "--exclude", "setuptools"], cwd=tmp_path, env=_clean_env())
    unpinned = [line for line in installed.split()
                if pins.get(_canonical(line.split("==")[0])) != line.split("==")[1].split("+")[0]
                and not _canonical(line).startswith(CUDA_TORCH_DEPS)]
    assert not unpinned, f"the install brought packages requirements.txt does not pin: {unpinned}"

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = _clean_env()

    where = _run([str(py), "-c", "import memlab, sysconfig; print(memlab.__file__); "
                  "print(sysconfig.get_paths()['purelib'])"], cwd=outside, env=env).split("\n")
    module, site = Path(where[0]).resolve(), Path(where[1]).resolve()
    assert module.is_relative_to(site) and module.is_relative_to(venv.resolve()), (module, site)
    assert not module.is_relative_to(REPO_ROOT)
    assert Path(sysconfig.get_paths()["purelib"]).resolve() != site

    checkout_env = _clean_env(PYTHONPATH=str(REPO_ROOT / "src"))
    for args in COMMANDS:
        installed = _run([str(memlab), *args], cwd=outside, env=env)
        checkout = _run([sys.executable, "-m", "memlab", *args], cwd=outside, env=checkout_env)
        assert installed == checkout, f"memlab {' '.join(args)} differs:\n{installed}\n---\n{checkout}"
        assert installed.strip()
