"""One-off: the norms' shifted layouts at 16384x4999 (those of ../2026-12-05-h100-colwindow),
emitted by this checkout's emitter into DIR (a probe_tail --sets folder).

    python3 bench/results/2026-12-05-h100-shiftpreds/emit_sets.py DIR

run1's sets f111, f011, f101 and f001 came from the working tree before the commit, with three
switches in the shifted step (since removed; see README.md); "head" is
../2026-12-05-h100-colwindow's "words" set, the emitter at 6aa455c.
"""

import importlib.util
import sys
from pathlib import Path

here = Path(__file__).resolve()
spec = importlib.util.spec_from_file_location(
    "colwindow_sets", here.parents[1] / "2026-12-05-h100-colwindow" / "emit_sets.py"
)
sets = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sets)  # (puts the checkout on sys.path)
sets.emit_to(Path(sys.argv[1]))
