"""Semantics-preserving edits of a customer's PTX kernel, each one justified statically.

An edit is a small frozen dataclass (`PtxEdit`), so the tuner mutates edits exactly as it mutates
generator schedules: field by field, neighbour values taken from the edit space.

- `ld_cache`: cache operators on global loads. `nc` (the read-only, non-coherent path) is applied
  only to loads whose address provably derives from kernel parameters bound to *input* tensors
  that no store, atomic or reduction of the kernel can reach (a register-provenance analysis over
  the whole kernel, to a fixed point, so loops are covered). Every tensor of a workload is its own
  allocation, so two parameters never alias. `cs`/`L1::evict_first` only change caching, never
  values, and apply to every plain global load.
- `st_cache`: `cs` (streaming, evict-first) on plain global stores: a caching hint only.
- `maxnreg`: a `.maxnreg` directive on the entry, the per-kernel spelling of ptxas's
  `-maxrregcount` (travels inside the PTX, so the GPU worker compiles it the same way).
- `nounroll`: a `.pragma "nounroll"` on the entry, so ptxas keeps the kernel's loops as written
  (smaller code and fewer registers where its unrolling bought nothing). A pragma changes how
  the code is scheduled, never what it computes; offered only for kernels that have a loop.
- `block`: a new block size, only when it is provably safe: the kernel is one-dimensional, reads
  %tid.x, %ntid.x and %ctaid.x once each and only to form i = ctaid*ntid + tid, exits at once when
  i >= D for a dim parameter D, the grid is `ceildiv(D, B0)`, and nothing couples the threads of
  a block (no shared memory, barriers, warp shuffles/votes/reductions, lane or warp ids). Then
  every block size executes the same set of indices, each with the same effect.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from factory.spec.types import KernelParam, Launch

# Fields added after edits were first recorded, at their defaults: left out of the schedule dict.
LATE_DEFAULTS = {"nounroll": False}

LD_CACHE = ("none", "nc", "cs", "L1::evict_first")
ST_CACHE = ("none", "cs")
MAXNREG = (0, 32, 40, 64, 128)  # 0: no directive
BLOCKS = (64, 128, 256, 512, 1024)


@dataclass(frozen=True)
class PtxEdit:
    ld_cache: str = "none"
    st_cache: str = "none"
    maxnreg: int = 0
    block: int = 0  # 0: keep the customer's block
    nounroll: bool = False  # added later: left out of the schedule dict when off

    def to_schedule(self) -> dict:
        d = {"ptx_edit": True, **asdict(self)}
        return {k: v for k, v in d.items() if LATE_DEFAULTS.get(k, object()) != v}

    @staticmethod
    def from_schedule(d: dict) -> PtxEdit:
        return PtxEdit(
            ld_cache=d.get("ld_cache", "none"),
            st_cache=d.get("st_cache", "none"),
            maxnreg=int(d.get("maxnreg", 0)),
            block=int(d.get("block", 0)),
            nounroll=bool(d.get("nounroll", False)),
        )

    def describe(self) -> str:
        parts = []
        if self.ld_cache != "none":
            parts.append(f"ld.global.{self.ld_cache}")
        if self.st_cache != "none":
            parts.append(f"st.global.{self.st_cache}")
        if self.maxnreg:
            parts.append(f".maxnreg {self.maxnreg}")
        if self.block:
            parts.append(f"block {self.block}")
        if self.nounroll:
            parts.append('.pragma "nounroll"')
        return ", ".join(parts) or "unchanged"


_INSTR = re.compile(r"^\s*(@!?%\w+\s+)?([a-z][\w.:]*)\s*([^;]*);", re.M)
_REG = re.compile(r"%[A-Za-z_][\w]*")
_ENTRY = re.compile(r"\.entry\s+([\w$]+)\s*\(([^)]*)\)", re.S)
_PARAM = re.compile(r"\.param\s+\.\w+\s+(?:\.ptr[\w.]*\s+)?([\w$]+)")
_SPECIAL = {"%tid", "%ntid", "%ctaid", "%nctaid", "%laneid", "%warpid", "%clock", "%clock64"}


def split_operands(text: str) -> list[str]:
    """The comma-separated operands of one PTX instruction, keeping `{a, b}` vectors and
    `[addr+off]` addresses whole."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def _instructions(ptx: str) -> list[tuple[str | None, str, list[str]]]:
    body = ptx[ptx.find("{", _ENTRY.search(ptx).end()) :] if _ENTRY.search(ptx) else ptx
    rows = []
    for m in _INSTR.finditer(body):
        guard, op, rest = m.groups()
        if op.startswith(".") or op in ("ret", "exit"):
            rows.append((guard, op, []))
            continue
        rows.append((guard, op, split_operands(rest)))
    return rows


def entry_params(ptx: str) -> list[str]:
    m = _ENTRY.search(ptx)
    return _PARAM.findall(m.group(2)) if m else []


def _is_store(op: str) -> bool:
    return op.startswith(("st.", "atom.", "red.", "cp.", "multimem.")) or op.startswith("st")


def param_provenance(ptx: str, pointer_params: set[str] | None = None) -> dict[str, set[str]]:
    """For every register, the set of pointer parameters its value may derive from ("?" when it
    may derive from a 64-bit value loaded from memory, which could be any pointer). Values of
    dim/scalar parameters and 32-bit loads are offsets, not pointers ("." marks a 32-bit load,
    which becomes "?" if two halves are packed into a 64-bit value)."""
    params = set(entry_params(ptx)) if pointer_params is None else set(pointer_params)
    prov: dict[str, set[str]] = {}
    rows = _instructions(ptx)
    changed = True
    while changed:
        changed = False
        for _guard, op, ops in rows:
            if not ops or _is_store(op) or op.startswith(("bra", "call", "bar", "setp")):
                if op.startswith("setp") and ops:
                    pass  # predicates carry no addresses
                continue
            dst = ops[0]
            if not dst.startswith("%") or "{" in dst:
                dsts = _REG.findall(dst)
            else:
                dsts = [dst]
            new: set[str] = set()
            srcs = " ".join(ops[1:])
            if op.startswith("ld.param"):
                name = srcs.strip("[] ").split("+")[0].strip()
                new = {name} if name in params else set()
            elif op.startswith(("ld.", "atom", "tex", "suld", "shfl")):
                new = {"?"} if re.search(r"\.[bsu]64$|\.v\d\.[bsu]64$", op) else {"."}
            else:
                for reg in _REG.findall(srcs):
                    base = reg.split(".")[0]
                    if base in _SPECIAL:
                        continue
                    new |= prov.get(reg, set())
                if "{" in srcs and "." in new:
                    new.add("?")
            new.discard(".") if op.startswith("cvta") else None
            for d in dsts:
                cur = prov.setdefault(d, set())
                if not new <= cur:
                    cur |= new
                    changed = True
    return prov


def _address_register(operand: str) -> str | None:
    m = re.match(r"\[\s*(%[\w]+)", operand)
    return m.group(1) if m else None


def readonly_input_params(ptx: str, params: tuple[KernelParam, ...], inputs: set[str]) -> set[str]:
    """Entry parameter names that are input tensors never reached by a store/atomic/reduction
    (empty when any store's address is of unknown provenance)."""
    names = entry_params(ptx)
    pointers = {n for n, kp in zip(names, params, strict=False) if kp.kind == "tensor"}
    prov = param_provenance(ptx, pointers)
    written: set[str] = set()
    for _g, op, ops in _instructions(ptx):
        if op.startswith(("st.", "atom.", "red.")) and ops:
            space = op.split(".")[1]
            if space in ("shared", "local", "param"):
                continue  # not global memory: cannot reach a tensor
            addr = _address_register(ops[0] if op.startswith(("st.", "red.")) else ops[1])
            if addr is None:
                return set()
            src = prov.get(addr, set()) - {"."}
            # an address derived from no pointer parameter could be anything: assume the worst
            written |= src or {"?"}
    if "?" in written:
        return set()
    safe = set()
    for name, kp in zip(names, params, strict=False):
        if kp.kind == "tensor" and kp.name in inputs and name not in written:
            safe.add(name)
    return safe


_PLAIN_LD = re.compile(
    r"(?P<pre>^\s*(?:@!?%\w+\s+)?)ld\.global(?P<vec>\.v[248])?\.(?P<ty>[bfsu]\d+|bf16)\s+"
    r"(?P<rest>[^;]*);",
    re.M,
)
_PLAIN_ST = re.compile(
    r"(?P<pre>^\s*(?:@!?%\w+\s+)?)st\.global(?P<vec>\.v[248])?\.(?P<ty>[bfsu]\d+|bf16)\s", re.M
)


def _apply_ld_cache(
    ptx: str, mode: str, safe_params: set[str], pointers: set[str]
) -> tuple[str, int]:
    prov = param_provenance(ptx, pointers) if mode == "nc" else {}
    count = 0

    def repl(m: re.Match) -> str:
        nonlocal count
        vec = m.group("vec") or ""
        if mode == "nc":
            ops = split_operands(m.group("rest"))
            addr = _address_register(ops[-1]) if ops else None
            src = (prov.get(addr, {"?"}) if addr else {"?"}) - {"."}
            if not src or "?" in src or not src <= safe_params:
                return m.group(0)
        count += 1
        return f"{m.group('pre')}ld.global.{mode}{vec}.{m.group('ty')} {m.group('rest')};"

    return _PLAIN_LD.sub(repl, ptx), count


def _apply_st_cache(ptx: str, mode: str) -> tuple[str, int]:
    count = 0

    def repl(m: re.Match) -> str:
        nonlocal count
        count += 1
        return f"{m.group('pre')}st.global.{mode}{m.group('vec') or ''}.{m.group('ty')} "

    return _PLAIN_ST.sub(repl, ptx), count


def _apply_maxnreg(ptx: str, n: int) -> str:
    m = _ENTRY.search(ptx)
    if not m or ".maxnreg" in ptx:
        return ptx
    return ptx[: m.end()] + f"\n.maxnreg {n}\n" + ptx[m.end() :]


_LABEL = re.compile(r"^\s*([$\w]+):", re.M)
_BRANCH = re.compile(r"\bbra(?:\.uni)?\s+([$\w]+)\s*;")


def has_loop(ptx: str) -> bool:
    """A branch back to a label defined above it: the kernel has a loop."""
    labels = {m.group(1): m.start() for m in _LABEL.finditer(ptx)}
    return any(labels.get(m.group(1), len(ptx)) < m.start() for m in _BRANCH.finditer(ptx))


def _apply_nounroll(ptx: str) -> str:
    """The entry-level pragma goes between the parameter list and the body, with the other
    performance directives."""
    m = _ENTRY.search(ptx)
    if not m or not has_loop(ptx):
        return ptx
    if '"nounroll"' in ptx[m.end() : ptx.find("{", m.end())]:
        return ptx  # already on the entry (statement-level ones, as NVRTC writes, do not count)
    return ptx[: m.end()] + '\n.pragma "nounroll";\n' + ptx[m.end() :]


_COUPLING = re.compile(
    r"\.shared\b|\bbar\.|\bbarrier\.|\bshfl\.|\bvote\.|\bredux\.|\bmatch\.|activemask|%laneid|"
    r"%warpid|\belect\.|\.reqntid|\.maxntid|%tid\.[yz]|%ntid\.[yz]|%ctaid\.[yz]|%nctaid|%cluster|"
    r"mbarrier|cp\.async|%dynamic_smem|\batom\.|\bred\.|%smid|%globaltimer|%clock"
)
_GRID = re.compile(r"^\s*ceildiv\(\s*([A-Za-z_]\w*)\s*,\s*(\d+)\s*\)\s*$")


def block_change_is_safe(ptx: str, params: tuple[KernelParam, ...], launch: Launch) -> str:
    """The proof that the block size may change, or "" when none was found (see module doc)."""
    if _COUPLING.search(ptx):
        return ""
    if tuple(launch.grid[1:]) != (1, 1) or tuple(launch.block[1:]) != (1, 1):
        return ""
    g = _GRID.match(str(launch.grid[0]))
    if not g or int(g.group(2)) != int(launch.block[0]):
        return ""
    dim = g.group(1)
    rows = _instructions(ptx)
    special: dict[str, str] = {}
    for _g, op, ops in rows:
        if op.startswith("mov") and len(ops) == 2 and ops[1] in ("%tid.x", "%ntid.x", "%ctaid.x"):
            if ops[1] in special.values():
                return ""
            special[ops[0]] = ops[1]
    if set(special.values()) != {"%tid.x", "%ntid.x", "%ctaid.x"}:
        return ""
    if len(re.findall(r"%tid\.x|%ntid\.x|%ctaid\.x", ptx)) != 3:
        return ""
    index_reg, mad_at = None, None
    for k, (_g, op, ops) in enumerate(rows):
        used = [r for r in (_REG.findall(" ".join(ops[1:])) if ops else []) if r in special]
        if not used:
            continue
        if index_reg is not None or not op.startswith("mad.lo") or len(ops) != 4:
            return ""
        names = {special.get(ops[1]), special.get(ops[2])}
        if names != {"%ctaid.x", "%ntid.x"} or special.get(ops[3]) != "%tid.x":
            return ""
        index_reg, mad_at = ops[0], k
    if index_reg is None:
        return ""
    # The dim register: loaded from the parameter bound to `dim`.
    names = entry_params(ptx)
    dim_params = {
        n for n, kp in zip(names, params, strict=False) if kp.kind == "dim" and kp.name == dim
    }
    dim_regs = {
        ops[0]
        for _g, op, ops in rows
        if op.startswith("ld.param") and len(ops) == 2 and ops[1].strip("[] ") in dim_params
    }
    labels_to_exit = set(re.findall(r"^\s*([$\w]+):\s*\n\s*(?:ret|exit)\s*;", ptx, re.M))
    for k in range(mad_at + 1, min(mad_at + 6, len(rows) - 1)):
        _g, op, ops = rows[k]
        if op.startswith("setp.") and len(ops) == 3 and ops[1] == index_reg and ops[2] in dim_regs:
            guard, nxt, nops = rows[k + 1]
            if not nxt.startswith("bra") or not nops or nops[0] not in labels_to_exit:
                return ""
            pred = ops[0]
            if op.startswith(("setp.ge.", "setp.gt.")) and guard and guard.strip() == f"@{pred}":
                return f"index {index_reg} = ctaid*ntid+tid exits when >= {dim}; grid ceildiv"
            if op.startswith("setp.lt.") and guard and guard.strip() == f"@!{pred}":
                return f"index {index_reg} = ctaid*ntid+tid exits when >= {dim}; grid ceildiv"
            return ""
    return ""


def apply_edit(
    ptx: str,
    params: tuple[KernelParam, ...],
    launch: Launch,
    edit: PtxEdit,
    inputs: set[str],
) -> tuple[str, Launch, str] | None:
    """The edited (ptx, launch, justification), or None when the edit does not apply (no load
    was provably read-only, the block size is not provably free, or nothing would change)."""
    out, why = ptx, []
    if edit.ld_cache != "none":
        safe = readonly_input_params(ptx, params, inputs) if edit.ld_cache == "nc" else set()
        names = entry_params(ptx)
        pointers = {n for n, kp in zip(names, params, strict=False) if kp.kind == "tensor"}
        out, n = _apply_ld_cache(out, edit.ld_cache, safe, pointers)
        if n == 0:
            return None
        why.append(f"{n} loads -> ld.global.{edit.ld_cache}")
    if edit.st_cache != "none":
        out, n = _apply_st_cache(out, edit.st_cache)
        if n == 0:
            return None
        why.append(f"{n} stores -> st.global.{edit.st_cache}")
    if edit.maxnreg:
        if ".maxnreg" in ptx:
            return None
        out = _apply_maxnreg(out, edit.maxnreg)
        why.append(f".maxnreg {edit.maxnreg}")
    if edit.nounroll:
        unrolled = _apply_nounroll(out)
        if unrolled == out:
            return None
        out = unrolled
        why.append('.pragma "nounroll" (the kernel has a loop)')
    new_launch = launch
    if edit.block and edit.block != int(launch.block[0]):
        proof = block_change_is_safe(ptx, params, launch)
        if not proof:
            return None
        dim = _GRID.match(str(launch.grid[0])).group(1)
        new_launch = Launch(
            grid=(f"ceildiv({dim}, {edit.block})", 1, 1),
            block=(edit.block, 1, 1),
            smem_bytes=launch.smem_bytes,
            cluster=launch.cluster,
        )
        why.append(f"block {edit.block} ({proof})")
    if out == ptx and new_launch == launch:
        return None
    return out, new_launch, "; ".join(why)


def edit_space() -> list[PtxEdit]:
    """Every combination of edit values (block 0 = the customer's own)."""
    return [
        PtxEdit(ld, st, reg, blk, nounroll)
        for ld in LD_CACHE
        for st in ST_CACHE
        for reg in MAXNREG
        for blk in (0, *BLOCKS)
        for nounroll in (False, True)
    ]
