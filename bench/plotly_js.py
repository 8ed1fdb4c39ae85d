"""Where a chart written by a bench command finds plotly.js."""

from __future__ import annotations

import os
from pathlib import Path

VENDOR = Path(__file__).resolve().parents[1] / "static" / "vendor" / "plotly.min.js"


def plotly_src(path: str | os.PathLike) -> str | bool:
    """For a chart written inside this repository (bench/results), a relative path to the
    repository's own plotly.js in static/vendor, so each recorded run does not carry its own
    4.8 MB copy; elsewhere (a GPU host's output folder) True, plotly.js inline, so the file
    opens on its own."""
    target = Path(path).resolve()
    repo = VENDOR.parents[2]
    if not VENDOR.exists() or repo not in target.parents:
        return True
    return Path(os.path.relpath(VENDOR, target.parent)).as_posix()
