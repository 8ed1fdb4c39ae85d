"""The reviewer: rejects a compiled candidate with a reason before it costs GPU time.

What it checks, from the compile report and the PTX text alone:
- the compile failed (the compiler's first error lines are the reason);
- register spills and any local memory (a stack frame, `.local` state): local memory lives in
  device DRAM, so each spill is an extra round trip the memory-bound operators cannot afford;
- register or shared-memory pressure: on sm_90 an SM holds at most 64 warps, 32 blocks, 65,536
  registers (allocated per warp in units of 256, i.e. per thread in steps of 8) and 228 KiB of
  shared memory; a candidate that fits no block, or fewer than `min_warps_per_sm` warps, is
  rejected (too little memory traffic in flight to reach bandwidth);
- scalar global accesses where a vector access was possible: two or more unguarded scalar loads
  (or stores) off the same base register at adjacent offsets, the first aligned to the pair, with
  no vector access at the same address beside them, could have been one `.v2`/`.v4` access
  (a heuristic: base alignment is not known statically, so it is a warning rather than a
  rejection for edits of a customer's own kernel and for the generator's shifted tail, whose
  per-column vectors sit at a per-row alignment; predicated element-wise tails are exempt);
- forbidden patterns: managed memory (`.attribute(.managed)`), calls to functions not defined in
  the module (printf's `vprintf`, device `malloc`/`free`, any `.extern .func`), `brkpt`,
  `pmevent`, and launch blocks over 1,024 threads.

What it cannot do: prove termination. A loop without `trap` that never exits is not detectable
from the text; the GPU worker's per-candidate timeout in its own process is the guard for that.
"""

from __future__ import annotations

import re
from collections import defaultdict

from factory.agents.types import CandidateDraft
from factory.device import DEFAULT as DEVICE

MAX_THREADS_PER_SM = DEVICE.max_threads_per_sm
MAX_BLOCKS_PER_SM = DEVICE.max_blocks_per_sm
REGS_PER_SM = DEVICE.registers_per_sm
SMEM_PER_SM_BYTES = DEVICE.smem_per_sm_bytes
MAX_SMEM_PER_BLOCK_BYTES = DEVICE.smem_per_block_bytes
# The default floor of resident warps per SM (a family may set its own: Family.min_warps_per_sm).
MIN_WARPS_PER_SM = 12

_FORBIDDEN = [
    (re.compile(r"\.attribute\s*\(\s*\.managed\s*\)"), "managed memory (.attribute(.managed))"),
    (re.compile(r"\bvprintf\b"), "printf (vprintf) in a kernel"),
    (re.compile(r"\bcall(?:\.uni)?\s*(?:\([^)]*\)\s*,\s*)?\s*(malloc|free)\b"), "device heap"),
    (re.compile(r"\.extern\s+\.func"), "call to an external function"),
    (re.compile(r"^\s*brkpt\b", re.M), "breakpoint instruction (brkpt)"),
    (re.compile(r"^\s*pmevent\b", re.M), "performance-monitor event (pmevent)"),
]
_LOCAL = re.compile(r"\.local\b|\bld\.local\b|\bst\.local\b")
_SCALAR_ACCESS = re.compile(
    r"^\s*(@!?%\w+\s+)?(ld|st)\.global((?:\.[a-zA-Z0-9:_]+)*?)\.(f32|b32|u32|s32|f16|b16|u16|"
    r"s16|bf16|f64|b64|u64|s64)\s+[^;\[]*\[\s*(%\w+)\s*(?:\+\s*(-?\d+))?\s*\]",
    re.M,
)
_TYPE_BYTES = {
    "f16": 2,
    "b16": 2,
    "u16": 2,
    "s16": 2,
    "bf16": 2,
    "f64": 8,
    "b64": 8,
    "u64": 8,
    "s64": 8,
}


def _get(report, name, default=None):
    if report is None:
        return default
    if isinstance(report, dict):
        return report.get(name, default)
    return getattr(report, name, default)


def occupancy_warps(registers: int, threads_per_block: int, smem_bytes: int) -> int:
    """Resident warps per SM on sm_90 for a block shape and its resources (0: cannot launch)."""
    if threads_per_block <= 0 or threads_per_block > 1024:
        return 0
    warps = -(-threads_per_block // 32)
    regs_per_thread = max(8, -(-max(int(registers or 0), 1) // 8) * 8)
    if regs_per_thread > 255 + 1:
        return 0
    regs_per_block = regs_per_thread * 32 * warps
    limits = [MAX_BLOCKS_PER_SM, MAX_THREADS_PER_SM // (warps * 32), REGS_PER_SM // regs_per_block]
    if smem_bytes:
        if smem_bytes > MAX_SMEM_PER_BLOCK_BYTES:
            return 0
        limits.append(SMEM_PER_SM_BYTES // smem_bytes)
    return min(limits) * warps


def scalar_vector_opportunities(ptx: str) -> list[str]:
    """Places where adjacent scalar global accesses off one base register could be one vector
    access: a list of short descriptions (empty when none)."""
    groups: dict[tuple, set[int]] = defaultdict(set)
    vector_at: set[tuple] = set()
    for m in _SCALAR_ACCESS.finditer(ptx):
        guard, op, quals, ty, base, off = m.groups()
        if ".v2" in quals or ".v4" in quals or ".v8" in quals:
            vector_at.add((op, base, int(off or 0)))
            continue
        if guard:
            continue  # element-wise guarded accesses: the tail of a row, where vectors cannot go
        size = _TYPE_BYTES.get(ty, 4)
        groups[(op, base, size)].add(int(off or 0))
    found = []
    for (op, base, size), offsets in groups.items():
        for o in sorted(offsets):
            if (op, base, o) in vector_at:
                continue  # a vector path for the same addresses exists beside this one
            if o % (2 * size) == 0 and o + size in offsets:
                found.append(f"{op}.global at [{base}+{o}] and [{base}+{o + size}]")
                break
    return found


def _block_threads(launch) -> int:
    block = launch.block if hasattr(launch, "block") else launch["block"]
    n = 1
    for b in block:
        n *= int(b)
    return n


def _static_smem(launch) -> int:
    smem = launch.smem_bytes if hasattr(launch, "smem_bytes") else launch.get("smem_bytes", 0)
    return smem if isinstance(smem, int) else 0


def _family(schedule: dict | None):
    """The family of a generator schedule (factory.families), None for anything else."""
    if not schedule or schedule.get("ptx_edit") or not schedule.get("family"):
        return None
    from factory import families

    try:
        return families.of_schedule(schedule)
    except KeyError:
        return None


def review(
    draft: CandidateDraft, compile_report, *, min_warps_per_sm: int | None = None
) -> tuple[bool, str]:
    """(ok, reason). `compile_report` is a CompileReport or its dict. The reason is empty when
    the candidate passes, or names the first problem found; warnings that do not reject are
    returned with ok=True as ``"warning: ..."``. The floor of resident warps is the draft's
    family's (`Family.min_warps_per_sm`) unless given."""
    schedule = draft.schedule or {}
    fam = _family(schedule)
    if min_warps_per_sm is None:
        min_warps_per_sm = fam.min_warps_per_sm if fam is not None else MIN_WARPS_PER_SM
    if not _get(compile_report, "ok", False):
        log = (_get(compile_report, "log", "") or "").strip()
        first = "; ".join(line.strip() for line in log.splitlines()[:3] if line.strip())
        return False, f"compile error: {first or 'the compiler gave no log'}"[:500]
    for pattern, what in _FORBIDDEN:
        if pattern.search(draft.ptx):
            return False, f"forbidden: {what}"
    threads = _block_threads(draft.launch)
    if threads > 1024 or threads <= 0:
        return False, f"forbidden: a block of {threads} threads (sm_90 allows 1..1024)"
    spill_st = int(_get(compile_report, "spill_store_bytes", 0) or 0)
    spill_ld = int(_get(compile_report, "spill_load_bytes", 0) or 0)
    if spill_st or spill_ld:
        return False, f"spills: {spill_st} bytes stored, {spill_ld} bytes loaded to local memory"
    stack = int(_get(compile_report, "stack_bytes", 0) or 0)
    if stack:
        return False, f"local memory: a {stack}-byte stack frame"
    if _LOCAL.search(draft.ptx):
        return False, "local memory: the PTX declares or accesses .local state"
    regs = int(_get(compile_report, "registers", 0) or 0)
    smem = int(_get(compile_report, "smem_bytes", 0) or 0) + _static_smem(draft.launch)
    warps = occupancy_warps(regs, threads, smem)
    if warps == 0:
        return False, (
            f"occupancy: a {threads}-thread block with {regs} registers/thread and {smem} bytes "
            "of shared memory does not fit an SM"
        )
    if warps < min_warps_per_sm:
        return False, (
            f"register pressure: {regs} registers/thread x {threads} threads leaves {warps} "
            f"warps/SM (< {min_warps_per_sm})"
        )
    vec = scalar_vector_opportunities(draft.ptx)
    if vec:
        message = "scalar global accesses where a vector access was possible: " + vec[0]
        if schedule.get("ptx_edit"):
            return True, "warning: " + message
        why = fam.scalar_access_note(schedule) if fam is not None else None
        if why:
            return True, f"warning: {message} ({why})"
        return False, message
    return True, ""
