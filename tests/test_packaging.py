"""What a wheel user gets besides the code: the version both commands print, type information (py.typed) and a
changelog with an entry for the version."""

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import boltzmann_attention
from boltzmann_attention import provenance
from boltzmann_attention.experiments import cli
from boltzmann_attention.experiments.benchmarks import cli as bench_cli

REPO = Path(__file__).resolve().parents[1]
PACKAGE = Path(boltzmann_attention.__file__).parent
VERSION = re.search(r'^version = "([^"]+)"$', (REPO / "pyproject.toml").read_text(), re.M).group(1)


@pytest.mark.parametrize("main, prog", [(cli.main, "boltzmann-attention"),
                                        (bench_cli.main, "boltzmann-attention-bench")])
def test_both_commands_print_the_package_version(main, prog, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"{prog} {VERSION}"


def test_the_version_without_installed_metadata_is_the_packages(monkeypatch):
    from importlib import metadata

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    assert provenance.package_version() == boltzmann_attention.__version__ == VERSION


def test_py_typed_is_in_the_package_and_its_package_data():
    tomllib = pytest.importorskip("tomllib")
    assert (PACKAGE / "py.typed").is_file()
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "py.typed" in data["boltzmann_attention"]


@pytest.mark.slow
def test_the_wheel_ships_py_typed(tmp_path):
    """A wheel built by setuptools itself from a copy of the source tree (no network, no build isolation)."""
    pytest.importorskip("setuptools", minversion="77")
    tree = tmp_path / "tree"
    shutil.copytree(REPO / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, tree / name)
    subprocess.run([sys.executable, "-c", "from setuptools import build_meta; build_meta.build_wheel('dist')"],
                   cwd=tree, check=True, capture_output=True)
    (wheel,) = (tree / "dist").glob("*.whl")
    assert "boltzmann_attention/py.typed" in zipfile.ZipFile(wheel).namelist()


def test_the_changelog_has_an_unreleased_section_then_one_for_the_version():
    headings = re.findall(r"^## \[([^\]]+)\]", (REPO / "CHANGELOG.md").read_text(), re.M)
    assert headings[0] == "Unreleased" and VERSION in headings
