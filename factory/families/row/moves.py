"""The row family's moves for the tuner: steps of several fields at once that one-field
mutation cannot make."""

from __future__ import annotations

# The fields that say how a row layout spreads the work (threads and rows a block, vector,
# chunks, mode): the agents keep a generation from crowding into one layout by them.
LAYOUT_FIELDS = ("threads_per_row", "rows_per_block", "vec_elems", "chunks", "mode")


def reshapes(value) -> list[tuple[dict, str]]:
    """Two-field moves that keep the block or the row's work the same size: more threads per
    row with fewer rows per block or fewer chunks each (and the reverse). One-field steps cannot
    make them, since a multi-warp row needs a block of its own: on the H200 a streaming
    cross-entropy stuck at one warp per row left 7% on the table (bench/results/
    2026-12-02-h200-loop2)."""
    t = getattr(value, "threads_per_row", None)
    r = getattr(value, "rows_per_block", None)
    c = getattr(value, "chunks", None)
    if not isinstance(t, int) or not isinstance(r, int) or not isinstance(c, int):
        return []
    out = []
    if r > 1:
        out.append(({"threads_per_row": t * 2, "rows_per_block": r // 2}, "2x threads, rows/2"))
        out.append(({"threads_per_row": t * r, "rows_per_block": 1}, f"{r}x threads, 1 row"))
    if t >= 64:
        out.append(({"threads_per_row": t // 2, "rows_per_block": r * 2}, "threads/2, 2x rows"))
        out.append(({"threads_per_row": t // 2, "chunks": c * 2}, "threads/2, 2x chunks"))
    if c > 1:
        out.append(({"threads_per_row": t * 2, "chunks": c // 2}, "2x threads, chunks/2"))
        if r > 1:
            out.append(
                (
                    {"threads_per_row": t * 2, "rows_per_block": r // 2, "chunks": c // 2},
                    "2x threads, rows/2, chunks/2",
                )
            )
    # Past 1024 threads a row is shared by a cluster of 1024-thread blocks: the cluster size
    # moves with the thread count.
    return [(_with_cluster(change, value), why) for change, why in out]


def _with_cluster(change: dict, value) -> dict:
    if not hasattr(value, "cluster_blocks"):
        return change
    t = change.get("threads_per_row", value.threads_per_row)
    return change | {"cluster_blocks": max(1, t // 1024)}
