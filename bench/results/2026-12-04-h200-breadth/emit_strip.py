"""One-off: emit with the tail path and the long-row stream path left out (valid only where
every row takes the fast path), to test whether code size costs small shapes time."""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout
from factory.emit import rowkernel as rk

rk.RowKernel._tail = lambda self, emit_tail: None
_orig = rk.RowKernel._row_body
def _row_body(self, mode):
    if mode == "stream":
        return
    return _orig(self, mode)
rk.RowKernel._row_body = _row_body
import bench.probe_tail as pt
pt.CASES = [(c.split(":")[0], *map(int, c.split(":")[1].split("x"))) for c in sys.argv[2].split(",")]
pt.emit_to(Path(sys.argv[1]))
