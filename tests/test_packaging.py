"""An installed (not editable) copy of the packages carries their data files: the catalogue, the
examples and the judge kernels the GPU worker loads at run time (gpuworker/kernels/judge.ptx)."""

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_data_file_of_a_package_is_named_in_package_data():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    globs = config["package-data"]
    missing = []
    for package in ("portal", "factory", "gpuworker"):
        base = ROOT / package
        for path in base.rglob("*"):
            rel = path.relative_to(base).as_posix()
            if (
                path.is_dir()
                or path.suffix in (".py", ".pyc")
                or "__pycache__" in rel
                or path.name == "README.md"  # documentation for readers of the checkout
                or rel.startswith("migrations/")
            ):
                continue
            if not any(fnmatch.fnmatch(rel, g) for g in globs.get(package, [])):
                missing.append(f"{package}/{rel}")
    assert missing == [], f"not in [tool.setuptools.package-data]: {missing}"
    # the worker's kernels are among them
    assert any(fnmatch.fnmatch("kernels/judge.ptx", g) for g in globs["gpuworker"])
