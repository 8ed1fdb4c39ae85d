"""The catalogue: common operators as manifests in factory/catalogue/<name>.toml."""

from __future__ import annotations

import functools
import re
from pathlib import Path

from factory.spec.types import SpecError, Workload

CATALOGUE_DIR = Path(__file__).resolve().parent.parent / "catalogue"
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


def catalogue_names() -> list[str]:
    """Names of the catalogue operators, sorted."""
    return sorted(p.stem for p in CATALOGUE_DIR.glob("*.toml"))


def catalogue_manifest(name: str) -> str:
    """The TOML text of catalogue operator `name`. Raises SpecError for an unknown name."""
    if not isinstance(name, str) or not _NAME.match(name) or name not in catalogue_names():
        raise SpecError([("name", f"no catalogue operator named {str(name)[:64]!r}")])
    return (CATALOGUE_DIR / f"{name}.toml").read_text(encoding="utf-8")


@functools.cache
def _load_all() -> dict[str, Workload]:
    from factory.spec.manifest import load_manifest

    return {name: load_manifest(catalogue_manifest(name)) for name in catalogue_names()}


def load_catalogue() -> dict[str, Workload]:
    """Every catalogue operator, validated: {name: Workload}. Parsed once per process."""
    return dict(_load_all())
