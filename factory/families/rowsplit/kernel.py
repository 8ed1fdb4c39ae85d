"""The split-row emitter: rows cut into chunks of `chunk` elements, a chunk a task, so that a
few long rows (or one flat tensor) spread over every SM instead of one block a row.

A task is (pass k, row r, chunk c). Pass k < P - 1 computes, over its chunk, the partial value
of each reduction whose operand needs k earlier reductions (the row IR's stages: LayerNorm's
mean, then its variance); pass P - 1 writes the outputs. Partials meet in a workspace the module
owns (module-scope `.global` arrays, zeroed when the module loads): thread 0 of the chunk's
block stores its partial, then counts it in the (row, pass) counter with a released atom.add
whose result nobody waits for. A task of the next pass (the first of its block for that row)
reads the row's finals where the (row, pass) flag is up; otherwise thread 0 spins (ld.acquire)
until all C chunks have counted in, and the block folds the C partials in chunk order (thread
i takes chunks i, i + T, ...; then the block's fixed-order fold) and publishes the finals and
the flag. Every fold is in a fixed order, so every block that folds a row gets the same bits,
and every run too.

Two ways to hand out tasks:
- "ticket" (passes with reductions): tasks from a module-scope ticket counter, the next ticket
  taken while the current task runs, in steps tau = 0, 1, ...: rows go in groups of `group`,
  and step tau holds pass k of group tau - k x `lag` for each k where that group exists, the
  step's (pass, row) slots chunk-major (a per-column input's chunk serves the step's rows one
  after the other; odd passes walk the row backwards, starting on what the previous pass
  read last). So a row's output pass runs `lag` steps after its statistics, beside the
  statistics of later groups: no grid drains between passes, and the second read of a row
  from L2 where the rows in between fit. A task waits only on tasks of earlier steps, so of
  smaller tickets, each taken by a block that is running (a block holds at most its current
  ticket and the next): the grid needs no co-residency, the smallest unfinished ticket can
  always proceed. The last block out (a second counter) resets the counters and flags for
  the next launch.
- "static" (no reduction: one pass): task = block index + i x grid, no workspace; several
  rows go chunk-major (task t: chunk t / rows of row t mod rows), so the tasks in flight
  together share a per-column input's chunks.

Within a task each thread walks the chunk `unroll` vectors of `vec` elements at a time (every
load issued before the first use), then one vector at a time for the row's tail; a vector that
is not whole (or rows not a multiple of vec, so not aligned) takes the element path, each
element under its own predicate. Indices are 32-bit: rows x length below 2^31.

L2 policies (createpolicy, once a kernel; `.L2::cache_hint` on the unpredicated vector loads
and stores): `stream` marks the output pass's reads of the row (their last) and its stores
evict-first, `keep` the statistics passes' reads of the row evict-last (they are read again);
a per-column input's loads and the element path keep the default policy."""

from __future__ import annotations

import math
from dataclasses import dataclass

from factory.device import device_for
from factory.emit import Emitted
from factory.emit import reduce as R
from factory.emit.module import module_text
from factory.emit.ptx import EmitError, f32_literal
from factory.families.colreduce.kernel import COMBINE, ESIZE, IDENTITY, ident
from factory.families.row.ir import (
    ROLE_COL,
    ROLE_ROW,
    ROLE_ROWSCALAR,
    ROLE_SCALAR,
    SCALAR,
    reduction_aliases,
)
from factory.families.row.schedules import fast_math_allowed
from factory.families.segnorm import SegNormKernel
from factory.spec import expr as E
from factory.spec.types import KernelParam, Launch

# Workspace capacity (module-scope arrays): partials for ROW_CHUNKS (row, chunk) pairs, finals,
# counters and flags for MAX_ROWS rows.
ROW_CHUNKS = 1 << 18
MAX_ROWS = 4096


@dataclass(frozen=True)
class Unit:
    """One reduction the passes compute, with its partial's words in the workspace from `slot`:
    "plain" (one reduction: 1 word), "online" (a softmax's max and sum of exp(F - max): the
    pair (m, s), 2 words, one pass) or "moments" (LayerNorm's mean and variance: count, mean
    and squared deviations and a pad, 4 words, one pass; its finals are the mean and the
    variance)."""

    kind: str
    nodes: tuple  # plain: (reduction,); online: (max, sum); moments: (mean, variance)
    operand: E.Node  # the per-element value reduced
    slot: int

    @property
    def words(self) -> int:
        return {"plain": 1, "online": 2, "moments": 4}[self.kind]  # moments: 3 and a pad


def plan(kir) -> tuple[list[Unit], dict]:
    """The reduction units and every node's stage once pairs are fused (a fused sum or variance
    is ready with its partner): pass k computes the units whose operand is at stage k."""
    alias = reduction_aliases(kir.reductions)
    uniq = [r for r in dict.fromkeys(kir.reductions) if r not in alias]
    units: list[Unit] = []
    taken: set = set()
    slot = 0
    # moments first (4 words: 16-byte aligned), then pairs (2 words), then plain values, so
    # that each unit's words are one aligned vector store
    for p in kir.moments:
        mn, var = alias.get(p.mean_node, p.mean_node), alias.get(p.var_node, p.var_node)
        if mn in uniq and var in uniq and not {mn, var} & taken:
            units.append(Unit("moments", (mn, var), p.x_node, slot))
            taken |= {mn, var}
            slot += 4
    for p in kir.online:
        mx, sm = alias.get(p.max_node, p.max_node), alias.get(p.sum_node, p.sum_node)
        if mx in uniq and sm in uniq and not {mx, sm} & taken:
            units.append(Unit("online", (mx, sm), p.f_node, slot))
            taken |= {mx, sm}
            slot += 2
    for r in uniq:
        if r not in taken:
            units.append(Unit("plain", (r,), r.x, slot))
            slot += 1
    partner = {u.nodes[1]: u.operand for u in units if u.kind != "plain"}
    stage: dict = {}
    for n in kir.order:
        if isinstance(n, E.Reduce):
            first = alias.get(n, n)
            stage[n] = 1 + stage[partner.get(first, first.x)]
        else:
            stage[n] = max((stage[c] for c in E.children(n)), default=0)
    return units, stage


def passes(kir) -> int:
    """Passes over a row: one per reduction stage (pairs fused), then the output pass."""
    _, stage = plan(kir)
    return 1 + max((stage[r] for r in kir.reductions), default=0)


def unique_reductions(kir) -> list[E.Reduce]:
    """The reductions to compute: those differing only in keepdims counted once."""
    alias = reduction_aliases(kir.reductions)
    return [r for r in dict.fromkeys(kir.reductions) if r not in alias]


class SplitKernel(SegNormKernel):
    """Renders a row IR (factory.families.row.ir.KernelIR) split into chunk tasks. `flat`: the
    whole tensor is one row (every input of the output's shape or a scalar)."""

    def __init__(self, kir, s, arch: str, *, flat: bool, family: str):
        self.kir, self.s, self.arch = kir, s, arch
        self.flat, self.family = flat, family
        from factory.emit.ptx import Builder

        self.b = Builder()
        self.V, self.U, self.T = s.vec, s.unroll, s.threads
        self.W = s.threads // 32
        self.units, self.stage = plan(kir)
        self.P = passes(kir)
        self.alias = reduction_aliases(kir.reductions)
        self.mode = "ticket" if self.P > 1 else "static"
        # approximate div/sqrt/tanh where every output's tolerance is bf16-sized, as the row
        # family allows (GELU's precise tanh divides: a subroutine an element)
        self.fast = fast_math_allowed(kir)
        # segnorm's element() reads self.ir only through scalar_input (overridden here)
        self.ir = kir
        # L2 evict-first on the last reads of the row and on the stores (Schedule.stream);
        # evict-last on the statistics passes' reads of the row (Schedule.keep)
        self.stream = bool(getattr(s, "stream", False)) and not flat
        self.keep = bool(getattr(s, "keep", False)) and not flat and self.P > 1
        self.hint_loads: dict = {}  # input name -> the policy register its loads take
        self.hint_stores = False

    # -- what segnorm's helpers ask -----------------------------------------------------------

    def scalar_input(self, name: str) -> bool:
        return self.kir.input_by_name[name].role in (ROLE_SCALAR, ROLE_ROWSCALAR)

    def seg_of(self, finals: dict) -> dict:
        """Reduction values keyed by every node that names them (aliases included)."""
        out = dict(finals)
        for r, first in self.alias.items():
            if first in finals:
                out[r] = finals[first]
        return out

    # -- the walk over a chunk ----------------------------------------------------------------

    def addr_of(self, name: str, dtype: str, rowbase: str, j: str) -> str:
        b = self.b
        idx = j
        if self.kir.input_by_name.get(name) is None or (
            self.kir.input_by_name[name].role == ROLE_ROW
        ):
            idx = b.reg("b32")
            b.op(f"add.u32 {idx}, {rowbase}, {j}")
        addr = b.reg("b64")
        b.op(f"mul.wide.u32 {addr}, {idx}, {ESIZE[dtype]}")
        b.op(f"add.u64 {addr}, {addr}, {self.base[name]}")
        return addr

    def load_hinted(self, name: str, addr: str, dtype: str) -> list[str]:
        """load_vector, with the L2 policy hint_loads gives `name` (if any)."""
        since = len(self.b.lines)
        vals = self.load_vector(addr, dtype)
        if name in self.hint_loads:
            self.with_hint(since, "ld.global.nc.", self.hint_loads[name])
        return vals

    def with_hint(self, since: int, op: str, policy: str) -> None:
        """The unpredicated `op` instructions emitted since line `since` take the L2 policy
        in register `policy` (`.L2::cache_hint` and the register)."""
        lines = self.b.lines
        for i in range(since, len(lines)):
            text = lines[i].strip()
            if text.startswith(op):
                text = text.replace(op, f"{op}L2::cache_hint.", 1)
                lines[i] = f"    {text[:-1]}, {policy};"

    def inputs_of(self, nodes, seg: dict) -> set:
        """The names of the inputs these nodes read at an element; what `seg` holds (a row's
        finals and per-row values) is not descended into."""
        seen, out, stack = set(), set(), list(nodes)
        while stack:
            n = stack.pop()
            if n in seen or n in seg:
                continue
            seen.add(n)
            if isinstance(n, E.Input):
                out.add(n.name)
            stack.extend(E.children(n))
        return out

    def walk(self, start, end, rowbase, aligned, per_vectors, needs=None) -> None:
        """per_vectors(elems, preds, js) over this thread's elements of [start, end): elems a
        list of dicts (input name -> f32 register) one an element, preds None (all in range)
        or one predicate an element, js the column of each vector's first element. `needs`:
        the inputs to load (None: every row and per-column input)."""
        b, V, U, T = self.b, self.V, self.U, self.T
        vecs_in = [
            (t.name, t.dtype)
            for t in self.kir.inputs
            if t.role in (ROLE_ROW, ROLE_COL) and (needs is None or t.name in needs)
        ]
        j = b.reg("b32")
        b.op(f"mad.lo.u32 {j}, {self.tid}, {V}, {start}")
        if U > 1:
            top, out = b.new_label("main"), b.new_label("main_end")
            b.label(top)
            last = b.reg("b32")
            b.op(f"add.u32 {last}, {j}, {(U - 1) * T * V + V}")
            p = b.reg("pred")
            b.op(f"setp.gt.u32 {p}, {last}, {end}")
            b.op(f"@{p} bra {out}")
            b.op(f"@!{aligned} bra {out}")
            js = [j]
            for u in range(1, U):
                ju = b.reg("b32")
                b.op(f"add.u32 {ju}, {j}, {u * T * V}")
                js.append(ju)
            loaded = {name: [] for name, _ in vecs_in}
            for ju in js:
                for name, dtype in vecs_in:
                    addr = self.addr_of(name, dtype, rowbase, ju)
                    loaded[name] += self.load_hinted(name, addr, dtype)
            elems = [
                {**{n: loaded[n][e] for n in loaded}, **self.scalar_vals} for e in range(U * V)
            ]
            per_vectors(elems, None, js)
            b.op(f"add.u32 {j}, {j}, {U * T * V}")
            b.op(f"bra.uni {top}")
            b.label(out)
        top, end_l = b.new_label("tail"), b.new_label("tail_end")
        b.label(top)
        pe = b.reg("pred")
        b.op(f"setp.ge.u32 {pe}, {j}, {end}")
        b.op(f"@{pe} bra {end_l}")
        jend = b.reg("b32")
        b.op(f"add.u32 {jend}, {j}, {V}")
        whole = b.reg("pred")
        b.op(f"setp.le.u32 {whole}, {jend}, {end}")
        b.op(f"and.pred {whole}, {whole}, {aligned}")
        el, nxt = b.new_label("elems"), b.new_label("next")
        b.op(f"@!{whole} bra {el}")
        per = {
            name: self.load_hinted(name, self.addr_of(name, dtype, rowbase, j), dtype)
            for name, dtype in vecs_in
        }
        per_vectors([{**{n: per[n][e] for n in per}, **self.scalar_vals} for e in range(V)], None,
                    [j])  # fmt: skip
        b.op(f"bra.uni {nxt}")
        b.label(el)
        vals, preds = [], []
        for e in range(V):
            qe, pq = b.reg("b32"), b.reg("pred")
            b.op(f"add.u32 {qe}, {j}, {e}")
            b.op(f"setp.lt.u32 {pq}, {qe}, {end}")
            ins = {}
            for name, dtype in vecs_in:
                addr = self.addr_of(name, dtype, rowbase, qe)
                ins[name] = self.load_scalar(addr, dtype, pq)
            vals.append({**ins, **self.scalar_vals})
            preds.append(pq)
        per_vectors(vals, preds, [j])
        b.label(nxt)
        b.op(f"add.u32 {j}, {j}, {T * V}")
        b.op(f"bra.uni {top}")
        b.label(end_l)

    def store_outputs(self, elems, preds, js, rowbase, seg) -> None:
        """Each per-element output at these elements: vectors when whole, else one element at a
        time under its predicate."""
        b, V = self.b, self.V
        for o in self.kir.outputs:
            if o.role != ROLE_ROW:
                continue
            es = ESIZE[o.dtype]
            outs = []
            for loaded in elems:
                outs.append(self.reg_of(self.element(o.node, loaded, seg, {})))
            for u, ju in enumerate(js):
                addr = self.addr_of(o.name, o.dtype, rowbase, ju)
                part = outs[u * V : (u + 1) * V]
                if preds is None:
                    since = len(b.lines)
                    self.store_vector(addr, o.dtype, part)
                    if self.hint_stores:
                        self.with_hint(since, "st.global.", self.policy)
                    continue
                for e, v in enumerate(part):
                    if es == 4:
                        b.op(f"@{preds[e]} st.global.f32 [{addr}+{4 * e}], {v}")
                    else:
                        h = b.reg("b16")
                        b.op(f"cvt.rn.{'bf16' if o.dtype == 'bf16' else 'f16'}.f32 {h}, {v}")
                        b.op(f"@{preds[e]} st.global.b16 [{addr}+{2 * e}], {h}")

    # -- the kernel ----------------------------------------------------------------------------

    def scalar_nodes(self, k: int, loaded: dict, seg: dict) -> None:
        """Per-row values (not reductions) that pass k can use, computed once a task into seg."""
        for n in self.kir.order:
            if (
                self.kir.level[n] == SCALAR
                and not isinstance(n, E.Reduce | E.Input | E.Const)
                and self.stage[n] <= k
                and n not in seg
            ):
                seg[n] = self.reg_of(self.element(n, loaded, seg, {}))

    def render(self) -> Emitted:  # noqa: C901 - one kernel, top to bottom
        kir, s, b = self.kir, self.s, self.b
        V, T, P = self.V, self.T, self.P
        names = [t.name for t in kir.inputs] + [o.name for o in kir.outputs]
        dims = (*kir.batch_dims, kir.row_dim)
        params = [KernelParam("tensor", "u64", n) for n in names]
        params += [KernelParam("dim", "u32", d) for d in dims]
        entry = f"{ident(kir.name)}_{self.family}_{s.tag()}"
        self.base = {}
        for name in names:
            r = b.reg("b64")
            b.op(f"ld.param.u64 {r}, [p_{ident(name)}]")
            b.op(f"cvta.to.global.u64 {r}, {r}")
            self.base[name] = r
        if self.flat:
            R, N = self.u32(1), self.product(dims)
        else:
            R, N = self.product(kir.batch_dims), self.dim_reg(kir.row_dim)
        self.tid = self.u32("%tid.x")
        if self.stream:
            self.policy = b.reg("b64")
            b.op(f"createpolicy.fractional.L2::evict_first.b64 {self.policy}, 1.0")
        if self.keep:
            self.keep_policy = b.reg("b64")
            b.op(f"createpolicy.fractional.L2::evict_last.b64 {self.keep_policy}, 1.0")
        self.lane, self.warp = b.reg("b32"), b.reg("b32")
        b.op(f"and.b32 {self.lane}, {self.tid}, 31")
        b.op(f"shr.u32 {self.warp}, {self.tid}, 5")
        self.smem = self.u32("red_smem")
        t0 = b.reg("pred")
        b.op(f"setp.eq.u32 {t0}, {self.tid}, 0")
        self.scalar_vals = {}
        for t in kir.inputs:
            if t.role == ROLE_SCALAR:
                self.scalar_vals[t.name] = self.load_scalar(self.base[t.name], t.dtype, "%p_true")

        nf = b.reg("f32")
        b.op(f"cvt.rn.f32.u32 {nf}, {N}")
        lc = int(math.log2(s.chunk))
        C = b.reg("b32")
        b.op(f"add.u32 {C}, {N}, {s.chunk - 1}")
        b.op(f"shr.u32 {C}, {C}, {lc}")
        S = b.reg("b32")
        b.op(f"mul.lo.u32 {S}, {R}, {C}")
        total = b.reg("b32")
        b.op(f"mul.lo.u32 {total}, {S}, {P}")
        nred = max(sum(u.words for u in self.units), 1)
        # a (row, chunk)'s words start 16-byte aligned where a unit stores a vector
        widest = max((u.words for u in self.units), default=1)
        nred = -(-nred // widest) * widest
        # shared words: 3 a warp for the block folds, then the last-chunk flag and the ticket
        slot_last, slot_ticket = 12 * self.W, 12 * self.W + 4
        globals_ = []
        t = b.reg("b32")
        if self.mode == "ticket":
            g = ident(entry)
            ws = {
                "part": f"{g}_part",
                "final": f"{g}_final",
                "count": f"{g}_count",
                "ready": f"{g}_ready",
                "ticket": f"{g}_ticket",
                "done": f"{g}_done",
            }
            globals_ = [
                f".global .align 16 .f32 {ws['part']}[{ROW_CHUNKS * nred}];",
                f".global .align 16 .f32 {ws['final']}[{MAX_ROWS * nred}];",
                f".global .align 4 .u32 {ws['count']}[{MAX_ROWS * P}];",
                f".global .align 4 .u32 {ws['ready']}[{MAX_ROWS * P}];",
                f".global .align 4 .u32 {ws['ticket']};",
                f".global .align 4 .u32 {ws['done']};",
            ]
            wr = {}
            for key, sym in ws.items():
                wr[key] = b.reg("b64")
                b.op(f"mov.u64 {wr[key]}, {sym}")
            first = b.new_label("first")
            b.op(f"@!{t0} bra {first}")
            b.op(f"atom.relaxed.gpu.global.add.u32 {t}, [{wr['ticket']}], 1")
            b.op(f"st.shared.b32 [{self.smem}+{slot_ticket}], {t}")
            b.label(first)
            b.op("bar.sync 0")
            b.op(f"ld.shared.b32 {t}, [{self.smem}+{slot_ticket}]")
            b.op("bar.sync 0")
            # the ticket order (module docstring): a cursor over the steps tau; a block's
            # tickets only grow, so its cursor only moves forward
            tau, tb, tn, NG = (b.reg("b32") for _ in range(4))
            b.op(f"add.u32 {NG}, {R}, {s.group - 1}")
            b.op(f"div.u32 {NG}, {NG}, {s.group}")  # row groups
            b.op(f"mov.u32 {tau}, 0")
            b.op(f"mov.u32 {tb}, 0")
            slots, _ = self.step_slots(tau, R, NG)
            b.op(f"mul.lo.u32 {tn}, {slots}, {C}")
        else:
            b.op(f"mov.u32 {t}, %ctaid.x")
            grid = self.u32("%nctaid.x")
        nxt = b.reg("b32")
        last_key = b.reg("b32")  # the (row, pass) whose finals the registers hold
        b.op(f"mov.u32 {last_key}, 0xFFFFFFFF")
        top, finish = b.new_label("task"), b.new_label("finish")
        b.label(top)
        pt = b.reg("pred")
        b.op(f"setp.ge.u32 {pt}, {t}, {total}")
        b.op(f"@{pt} bra.uni {finish}")
        k, r, c = b.reg("b32"), b.reg("b32"), b.reg("b32")
        if self.mode == "ticket":
            b.op(f"@{t0} atom.relaxed.gpu.global.add.u32 {nxt}, [{wr['ticket']}], 1")
            self.decode_ticket(t, tau, tb, tn, R, NG, C, k, r, c)
        elif self.flat:
            b.op(f"mov.u32 {k}, 0")
            b.op(f"mov.u32 {r}, 0")
            b.op(f"mov.u32 {c}, {t}")
        else:
            # chunk-major: the tasks in flight together share a per-column input's chunks
            b.op(f"mov.u32 {k}, 0")
            b.op(f"div.u32 {c}, {t}, {R}")
            b.op(f"mul.lo.u32 {r}, {c}, {R}")
            b.op(f"sub.u32 {r}, {t}, {r}")
        rowbase, start, end = b.reg("b32"), b.reg("b32"), b.reg("b32")
        b.op(f"mul.lo.u32 {rowbase}, {r}, {N}")
        b.op(f"shl.b32 {start}, {c}, {lc}")
        b.op(f"add.u32 {end}, {start}, {s.chunk}")
        b.op(f"min.u32 {end}, {end}, {N}")
        # whole vectors where the row starts on a vector (every row when the length is a
        # multiple of vec; the first, or a flat tensor's one, always)
        nmod = b.reg("b32")
        b.op(f"and.b32 {nmod}, {rowbase}, {V - 1}")
        aligned = b.reg("pred")
        b.op(f"setp.eq.u32 {aligned}, {nmod}, 0")
        # per-row inputs: one value a task
        for tr in kir.inputs:
            if tr.role == ROLE_ROWSCALAR:
                addr = b.reg("b64")
                b.op(f"mul.wide.u32 {addr}, {r}, {ESIZE[tr.dtype]}")
                b.op(f"add.u64 {addr}, {addr}, {self.base[tr.name]}")
                self.scalar_vals[tr.name] = self.load_scalar(addr, tr.dtype, "%p_true")
        task_end = b.new_label("task_end")
        for kk in range(P):
            skip = b.new_label(f"pass{kk}_end")
            if P > 1:
                pk = b.reg("pred")
                b.op(f"setp.ne.u32 {pk}, {k}, {kk}")
                b.op(f"@{pk} bra.uni {skip}")
            finals: dict = {}
            if kk > 0:
                # the row's finals, read once a (row, pass) in a row of tasks: a block whose
                # last task of this pass was of the same row keeps them in registers
                key = b.reg("b32")
                b.op(f"mad.lo.u32 {key}, {r}, {P}, {kk}")
                same = b.reg("pred")
                b.op(f"setp.eq.u32 {same}, {key}, {last_key}")
                have = b.new_label("have_finals")
                b.op(f"@{same} bra.uni {have}")
                self.acquire_finals(wr, r, C, kk, nred, nf, t0, slot_last, finals)
                b.op(f"mov.u32 {last_key}, {key}")
                b.label(have)
            seg = self.seg_of(finals)
            self.scalar_nodes(kk, self.scalar_vals, seg)
            if kk < P - 1:
                mine = [u for u in self.units if self.stage[u.operand] == kk]
                self.partial_pass(mine, seg, start, end, rowbase, aligned, wr, r, c, C, kk,
                                  nred, t0)  # fmt: skip
            else:

                def out(elems, preds, js, seg=seg):
                    self.store_outputs(elems, preds, js, rowbase, seg)

                outs = [o.node for o in kir.outputs if o.role == ROLE_ROW]
                # the output pass reads the row for the last time and writes: evict-first, so
                # neither pushes out of L2 the rows a statistics pass read for a later one
                if self.stream:
                    rows_in = (t.name for t in kir.inputs if t.role == ROLE_ROW)
                    self.hint_loads = dict.fromkeys(rows_in, self.policy)
                    self.hint_stores = True
                self.walk(start, end, rowbase, aligned, out, self.inputs_of(outs, seg))
                self.hint_loads, self.hint_stores = {}, False
                self.store_row_values(seg, r, c, t0)
            if P > 1:
                b.op(f"bra.uni {task_end}")
            b.label(skip)
        b.label(task_end)
        if self.mode == "ticket":
            b.op(f"@{t0} st.shared.b32 [{self.smem}+{slot_ticket}], {nxt}")
            b.op("bar.sync 0")
            b.op(f"ld.shared.b32 {t}, [{self.smem}+{slot_ticket}]")
            b.op("bar.sync 0")
        else:
            b.op(f"add.u32 {t}, {t}, {grid}")
        b.op(f"bra.uni {top}")
        b.label(finish)
        if self.mode == "ticket":
            self.last_out_resets(wr, R, t0, slot_last)
        b.op("ret")
        body = b.declarations() + [f"    .shared .align 16 .f32 red_smem[{3 * self.W + 2}];"]
        lines = b.lines
        if self.scalar_vals and "%p_true" in "\n".join(lines):
            lines = ["    setp.eq.u32 %p_true, 0, 0;", *lines]
            body.append("    .reg .pred %p_true;")
        ptx = module_text(
            family=self.family, workload=kir.name, schedule=s.to_dict(), arch=self.arch,
            entry=entry, params=params, threads=T, body=body, lines=lines, globals_=globals_,
        )  # fmt: skip
        ptx = self.with_residency(ptx)
        if self.flat:
            tasks = f"ceildiv({'*'.join(dims)}, {s.chunk})"
        else:
            rows = "*".join(kir.batch_dims) or "1"
            tasks = f"({rows})*ceildiv({kir.row_dim}, {s.chunk})"
        grid = f"min({tasks}, {s.blocks})" if self.mode == "static" else f"{s.blocks}"
        return Emitted(ptx, entry, tuple(params), Launch((grid, 1, 1), (T, 1, 1)))

    def with_residency(self, ptx: str) -> str:
        """Split rows with a grid of three or more blocks an SM: `.minnctapersm` asks ptxas to
        fit that many (at most 4), so that they are resident and keep their loads in flight
        together, where the registers that leaves a thread cover an estimate of what a step
        needs without spilling: 32 + a word for each 4 bytes a thread loads a step, 8 more
        past 128 bytes (measured with nvJitLink: softmax and RMSNorm bf16 with 4 x 16 bytes
        of each input fit 64 registers; LayerNorm fp32 with 4 x 16 bytes of x, w and b
        spills in 80, fits 88). The flat family's PTX is left as it is."""
        if self.flat:
            return ptx
        vectors = sum(t.role in (ROLE_ROW, ROLE_COL) for t in self.kir.inputs)
        step = self.U * 16 * max(vectors, 1)  # bytes a thread loads a step
        need = 32 + step // 4 + (8 if step > 128 else 0)
        per_sm = min(self.s.blocks // device_for(self.arch).sms, 4, 65536 // (self.T * need))
        if per_sm < 3:
            return ptx
        head = f".maxntid {self.T}, 1, 1"
        assert ptx.count(head) == 1
        return ptx.replace(head, f"{head}\n.minnctapersm {per_sm}")

    def step_slots(self, tau, R, NG) -> tuple[str, list]:
        """The (pass, row) slots of step tau: for each pass k whose row group g = tau - k x lag
        exists (0 <= g < NG), the rows of g (group rows, fewer in the last group). Returns the
        slot count and, a pass each, (valid, g, rows of g) registers."""
        b, G, L = self.b, self.s.group, self.s.lag
        count = b.reg("b32")
        b.op(f"mov.u32 {count}, 0")
        per = []
        for kk in range(self.P):
            g, rows, x = b.reg("b32"), b.reg("b32"), b.reg("b32")
            ok, inr = b.reg("pred"), b.reg("pred")
            b.op(f"sub.u32 {g}, {tau}, {kk * L}")
            b.op(f"setp.ge.u32 {ok}, {tau}, {kk * L}")
            b.op(f"setp.lt.u32 {inr}, {g}, {NG}")
            b.op(f"and.pred {ok}, {ok}, {inr}")
            b.op(f"mul.lo.u32 {x}, {g}, {G}")
            b.op(f"sub.u32 {rows}, {R}, {x}")
            b.op(f"min.u32 {rows}, {rows}, {G}")
            b.op(f"selp.b32 {rows}, {rows}, 0, {ok}")
            b.op(f"add.u32 {count}, {count}, {rows}")
            per.append((ok, g, rows))
        return count, per

    def decode_ticket(self, t, tau, tb, tn, R, NG, C, k, r, c) -> None:
        """Ticket t -> (pass k, row r, chunk c). Step tau holds, for each pass k, the rows of
        group tau - k x lag (where that group exists), as slots in order (pass, row); the
        step's chunks go chunk-major over its slots (its i-th ticket: slot i mod slots, chunk
        i / slots), so a per-column input's chunk is read by the step's rows one after the
        other. The cursor (tau, its first ticket tb, its tickets tn) moves forward until it
        holds t."""
        b, G = self.b, self.s.group
        adv, found = b.new_label("advance"), b.new_label("found")
        b.label(adv)
        nxt_tb = b.reg("b32")
        b.op(f"add.u32 {nxt_tb}, {tb}, {tn}")
        pin = b.reg("pred")
        b.op(f"setp.lt.u32 {pin}, {t}, {nxt_tb}")
        b.op(f"@{pin} bra.uni {found}")
        b.op(f"mov.u32 {tb}, {nxt_tb}")
        b.op(f"add.u32 {tau}, {tau}, 1")
        slots, _ = self.step_slots(tau, R, NG)
        b.op(f"mul.lo.u32 {tn}, {slots}, {C}")
        b.op(f"bra.uni {adv}")
        b.label(found)
        slots, per = self.step_slots(tau, R, NG)
        i, q, x = b.reg("b32"), b.reg("b32"), b.reg("b32")
        b.op(f"sub.u32 {i}, {t}, {tb}")
        b.op(f"div.u32 {q}, {i}, {slots}")
        b.op(f"mul.lo.u32 {x}, {q}, {slots}")
        b.op(f"sub.u32 {x}, {i}, {x}")  # the slot
        # the slot's pass: the last valid k whose slots start at or before it (slots in
        # order of pass, then row)
        b.op(f"mov.u32 {k}, 0")
        b.op(f"mov.u32 {r}, 0")
        before = b.reg("b32")
        b.op(f"mov.u32 {before}, 0")
        for kk, (ok, g, rows) in enumerate(per):
            m = b.reg("pred")
            b.op(f"setp.ge.u32 {m}, {x}, {before}")
            b.op(f"and.pred {m}, {m}, {ok}")
            row = b.reg("b32")
            b.op(f"sub.u32 {row}, {x}, {before}")
            b.op(f"mad.lo.u32 {row}, {g}, {G}, {row}")
            b.op(f"selp.b32 {r}, {row}, {r}, {m}")
            b.op(f"selp.b32 {k}, {kk}, {k}, {m}")
            b.op(f"add.u32 {before}, {before}, {rows}")
        # odd passes walk the row backwards: they start on the chunks the previous pass read
        # last, the likeliest still in L2
        odd = b.reg("pred")
        b.op(f"and.b32 {x}, {k}, 1")
        b.op(f"setp.ne.u32 {odd}, {x}, 0")
        b.op(f"sub.u32 {x}, {C}, 1")
        b.op(f"sub.u32 {x}, {x}, {q}")
        b.op(f"selp.b32 {c}, {x}, {q}, {odd}")

    def acquire_finals(self, wr, r, C, kk, nred, nf, t0, slot_last, finals) -> None:
        """The finals pass kk reads for row r, into registers (`finals`, node -> register).
        Units of earlier passes are read from the workspace. Those of pass kk - 1: read where
        the (row, pass) flag is up; else, once all C chunks have counted their partials in,
        folded here in chunk order (the same bits in every block that folds) and published
        (thread 0: the finals, then the flag, released)."""
        b, P = self.b, self.P
        ia = b.reg("b64")
        b.op(f"mul.wide.u32 {ia}, {r}, {4 * P}")
        ra, ca = b.reg("b64"), b.reg("b64")
        b.op(f"add.u64 {ra}, {ia}, {wr['ready']}")
        b.op(f"add.u64 {ca}, {ia}, {wr['count']}")
        mode = b.reg("b32")
        b.op(f"mov.u32 {mode}, 1")
        told, spin = b.new_label("told"), b.new_label("spin")
        decided = b.new_label("decided")
        b.op(f"@!{t0} bra {told}")
        f = b.reg("b32")
        b.op(f"ld.acquire.gpu.global.b32 {f}, [{ra}+{4 * (kk - 1)}]")
        pf = b.reg("pred")
        b.op(f"setp.ne.u32 {pf}, {f}, 0")
        b.op(f"@{pf} bra {decided}")
        b.op(f"mov.u32 {mode}, 0")
        b.label(spin)
        b.op(f"ld.acquire.gpu.global.b32 {f}, [{ca}+{4 * (kk - 1)}]")
        b.op(f"setp.lt.u32 {pf}, {f}, {C}")
        b.op(f"@{pf} bra {spin}")
        b.label(decided)
        b.op(f"st.shared.b32 [{self.smem}+{slot_last}], {mode}")
        b.label(told)
        b.op("bar.sync 0")
        b.op(f"ld.shared.b32 {mode}, [{self.smem}+{slot_last}]")
        b.op("bar.sync 0")
        b.op("fence.acq_rel.gpu")
        fa = b.reg("b64")
        b.op(f"mul.wide.u32 {fa}, {r}, {4 * nred}")
        b.op(f"add.u64 {fa}, {fa}, {wr['final']}")
        earlier = [u for u in self.units if self.stage[u.nodes[0]] < kk]
        last = [u for u in self.units if self.stage[u.nodes[0]] == kk]
        for u in earlier:
            for i, node in enumerate(u.nodes):
                v = b.reg("f32")
                b.op(f"ld.relaxed.gpu.global.f32 {v}, [{fa}+{4 * (u.slot + i)}]")
                finals[node] = v
        regs = {u: [b.reg("f32") for _ in u.nodes] for u in last}
        for u in last:
            finals.update(zip(u.nodes, regs[u], strict=True))
        fold, done = b.new_label("fold_finals"), b.new_label("finals_done")
        pm = b.reg("pred")
        b.op(f"setp.eq.u32 {pm}, {mode}, 0")
        b.op(f"@{pm} bra.uni {fold}")
        for u in last:
            for i, v in enumerate(regs[u]):
                b.op(f"ld.relaxed.gpu.global.f32 {v}, [{fa}+{4 * (u.slot + i)}]")
        b.op(f"bra.uni {done}")
        b.label(fold)
        for u in last:
            out = self.fold_unit(u, r, C, nred, nf, wr)
            for v, o in zip(regs[u], out, strict=True):
                b.op(f"mov.f32 {v}, {o}")
            self.store_words(f"[{fa}+{4 * u.slot}]", regs[u], f"@{t0} ")
        one = b.reg("b32")
        b.op(f"mov.u32 {one}, 1")
        b.op(f"@{t0} st.release.gpu.global.b32 [{ra}+{4 * (kk - 1)}], {one}")
        b.label(done)

    def fold_unit(self, u: Unit, r, C, nred, nf, wr) -> list[str]:
        """Row r's C partials of unit u folded by the block in a fixed order (thread i takes
        chunks i, i + T, ... in order, then the block's fixed-order fold): its finals, the
        same in every thread (a mean divided by the row length, moments -> mean, variance)."""
        b = self.b
        if u.kind == "plain":
            acc = [b.const_f32(IDENTITY[u.nodes[0].op])]
        elif u.kind == "online":
            acc = [b.const_f32(-math.inf), b.const_f32(0.0)]
        else:
            acc = [b.const_f32(0.0) for _ in range(3)]
        base = b.reg("b32")
        b.op(f"mul.lo.u32 {base}, {r}, {C}")
        i = b.reg("b32")
        b.op(f"mov.u32 {i}, {self.tid}")
        loop, done = b.new_label("fold"), b.new_label("fold_end")
        b.label(loop)
        pi = b.reg("pred")
        b.op(f"setp.ge.u32 {pi}, {i}, {C}")
        b.op(f"@{pi} bra {done}")
        q = b.reg("b32")
        b.op(f"add.u32 {q}, {base}, {i}")
        qa = b.reg("b64")
        b.op(f"mul.wide.u32 {qa}, {q}, {4 * nred}")
        b.op(f"add.u64 {qa}, {qa}, {wr['part']}")
        got = []
        for w in range(3 if u.kind == "moments" else u.words):
            v = b.reg("f32")
            b.op(f"ld.relaxed.gpu.global.f32 {v}, [{qa}+{4 * (u.slot + w)}]")
            got.append(v)
        if u.kind == "plain":
            b.op(f"{COMBINE[u.nodes[0].op]} {acc[0]}, {acc[0]}, {got[0]}")
        elif u.kind == "online":
            R.pair_combine(b, acc[0], acc[1], got[0], got[1])
        else:
            R.chan_merge(b, acc, got)
        b.op(f"add.u32 {i}, {i}, {self.T}")
        b.op(f"bra {loop}")
        b.label(done)
        if u.kind == "plain":
            tot = self.block_fold(acc[0], u.nodes[0].op)
            if u.nodes[0].op == "mean":
                m = b.reg("f32")
                b.op(f"div.rn.f32 {m}, {tot}, {nf}")
                tot = m
            return [tot]
        if u.kind == "online":
            return self.block_fold_unit(u, acc)
        _, mean, m2 = self.block_fold_unit(u, acc)
        var = b.reg("f32")
        b.op(f"div.rn.f32 {var}, {m2}, {nf}")
        return [mean, var]

    def partial_pass(self, mine, seg, start, end, rowbase, aligned, wr, r, c, C, kk, nred,
                     t0) -> None:  # fmt: skip
        """Pass kk over the chunk: the partials of its units to the workspace, counted in."""
        b, V, U = self.b, self.V, self.U
        width = U * V
        accs = {}
        for u in mine:
            if u.kind == "plain":
                accs[u] = [b.const_f32(IDENTITY[u.nodes[0].op]) for _ in range(width)]
            elif u.kind == "online":
                accs[u] = [b.const_f32(-math.inf), b.const_f32(0.0)]
            else:
                accs[u] = [b.const_f32(0.0) for _ in range(3)]

        def accumulate(elems, preds, js):
            vals = {u: [] for u in mine}
            for e, loaded in enumerate(elems):
                memo: dict = {}
                for u in mine:
                    v = self.reg_of(self.element(u.operand, loaded, seg, memo))
                    if preds is not None and u.kind != "moments":
                        idv = IDENTITY[u.nodes[0].op] if u.kind == "plain" else -math.inf
                        w = b.reg("f32")
                        b.op(f"selp.f32 {w}, {v}, {f32_literal(idv)}, {preds[e]}")
                        v = w
                    vals[u].append(v)
            for u in mine:
                acc = accs[u]
                if u.kind == "plain":
                    for e, v in enumerate(vals[u]):
                        b.op(f"{COMBINE[u.nodes[0].op]} {acc[e]}, {acc[e]}, {v}")
                elif u.kind == "online":
                    R.online_update(b, acc[0], acc[1], vals[u], by_tree=True)
                else:
                    ps = list(preds) if preds is not None else [None] * len(vals[u])
                    R.group_moments(b, acc, lambda u=u: vals[u], ps)

        # only the inputs the pass's operands read (RMSNorm's statistics: x, not w); with
        # `keep` the row's reads evict-last (a later pass reads them again), a per-column
        # input's with the default policy (read by every row: kept by use)
        needs = self.inputs_of([u.operand for u in mine], seg)
        if self.keep:
            rows_in = (t.name for t in self.kir.inputs if t.role == ROLE_ROW)
            self.hint_loads = dict.fromkeys(rows_in, self.keep_policy)
        self.walk(start, end, rowbase, aligned, accumulate, needs)
        self.hint_loads = {}
        words = {}
        for u in mine:
            acc = accs[u]
            if u.kind == "plain":
                for a in acc[1:]:
                    b.op(f"{COMBINE[u.nodes[0].op]} {acc[0]}, {acc[0]}, {a}")
                words[u] = [self.block_fold(acc[0], u.nodes[0].op)]
            else:
                words[u] = self.block_fold_unit(u, acc)
        # thread 0: the chunk's partials, then count the chunk in (released after them); nothing
        # waits on the count here: the next pass's blocks fold (acquire_finals)
        slot = b.reg("b32")
        b.op(f"mad.lo.u32 {slot}, {r}, {C}, {c}")
        pa = b.reg("b64")
        b.op(f"mul.wide.u32 {pa}, {slot}, {4 * nred}")
        b.op(f"add.u64 {pa}, {pa}, {wr['part']}")
        counted = b.new_label("counted")
        b.op(f"@!{t0} bra {counted}")
        for u in mine:
            vals = words[u] + words[u][:1] if u.kind == "moments" else words[u]
            self.store_words(f"[{pa}+{4 * u.slot}]", vals, "")
        ca = b.reg("b64")
        b.op(f"mul.wide.u32 {ca}, {r}, {4 * self.P}")
        b.op(f"add.u64 {ca}, {ca}, {wr['count']}")
        old = b.reg("b32")  # never read: the count's add goes on while the block does
        b.op(f"atom.release.gpu.global.add.u32 {old}, [{ca}+{4 * kk}], 1")
        b.label(counted)

    def store_words(self, where: str, vals: list[str], guard: str) -> None:
        """One store of 1, 2 or 4 f32 words at `where` (aligned to their size)."""
        if len(vals) == 1:
            self.b.op(f"{guard}st.global.f32 {where}, {vals[0]}")
        else:
            self.b.op(f"{guard}st.global.v{len(vals)}.f32 {where}, {{{', '.join(vals)}}}")

    def block_fold_unit(self, u: Unit, acc: list[str]) -> list[str]:
        """An online pair or a moments triple combined over the block, the same in every
        thread: the warp's lanes by butterfly, then the warps in order through shared memory."""
        b, W = self.b, self.W
        if u.kind == "online":
            R.butterfly(b, R.WARP_OFFSETS, [], [(acc[0], acc[1])])
        else:
            R.moments_butterfly(b, R.WARP_OFFSETS, self.lane, [acc])
        l0 = b.reg("pred")
        b.op(f"setp.eq.u32 {l0}, {self.lane}, 0")
        at = b.reg("b32")
        b.op(f"mad.lo.u32 {at}, {self.warp}, 4, {self.smem}")
        for k, v in enumerate(acc):
            b.op(f"@{l0} st.shared.f32 [{at}+{4 * W * k}], {v}")
        b.op("bar.sync 0")
        out = []
        for k in range(len(acc)):
            r = b.reg("f32")
            b.op(f"ld.shared.f32 {r}, [{self.smem}+{4 * W * k}]")
            out.append(r)
        for w in range(1, W):
            other = []
            for k in range(len(acc)):
                t = b.reg("f32")
                b.op(f"ld.shared.f32 {t}, [{self.smem}+{4 * (W * k + w)}]")
                other.append(t)
            if u.kind == "online":
                R.pair_combine(b, out[0], out[1], other[0], other[1])
            else:
                R.chan_merge(b, out, other)
        b.op("bar.sync 0")
        return out

    def store_row_values(self, seg, r, c, t0) -> None:
        """Per-row outputs (a logsumexp, a row's sum): the row's first chunk, thread 0."""
        b = self.b
        rows_out = [o for o in self.kir.outputs if o.role == ROLE_ROWSCALAR]
        if not rows_out:
            return
        p = b.reg("pred")
        b.op(f"setp.eq.u32 {p}, {c}, 0")
        b.op(f"and.pred {p}, {p}, {t0}")
        for o in rows_out:
            v = self.reg_of(self.element(o.node, self.scalar_vals, seg, {}))
            addr = b.reg("b64")
            b.op(f"mul.wide.u32 {addr}, {r}, {ESIZE[o.dtype]}")
            b.op(f"add.u64 {addr}, {addr}, {self.base[o.name]}")
            if ESIZE[o.dtype] == 4:
                b.op(f"@{p} st.global.f32 [{addr}], {v}")
            else:
                h = b.reg("b16")
                b.op(f"cvt.rn.{'bf16' if o.dtype == 'bf16' else 'f16'}.f32 {h}, {v}")
                b.op(f"@{p} st.global.b16 [{addr}], {h}")

    def last_out_resets(self, wr, R, t0, slot_last) -> None:
        """The last block to leave zeroes the counters, flags and tickets for the next launch
        (every other block has left its task loop, so nothing reads them any more)."""
        b = self.b
        islast = b.reg("b32")
        b.op(f"mov.u32 {islast}, 0")
        counted = b.new_label("out")
        b.op(f"@!{t0} bra {counted}")
        old = b.reg("b32")
        b.op("fence.acq_rel.gpu")
        b.op(f"atom.acq_rel.gpu.global.add.u32 {old}, [{wr['done']}], 1")
        n1 = b.reg("b32")
        b.op(f"mov.u32 {n1}, %nctaid.x")
        b.op(f"sub.u32 {n1}, {n1}, 1")
        pl = b.reg("pred")
        b.op(f"setp.eq.u32 {pl}, {old}, {n1}")
        b.op(f"selp.u32 {islast}, 1, 0, {pl}")
        b.op(f"st.shared.b32 [{self.smem}+{slot_last}], {islast}")
        b.label(counted)
        b.op("bar.sync 0")
        b.op(f"ld.shared.b32 {islast}, [{self.smem}+{slot_last}]")
        pz = b.reg("pred")
        b.op(f"setp.eq.u32 {pz}, {islast}, 0")
        end = b.new_label("reset_end")
        b.op(f"@{pz} bra.uni {end}")
        n = b.reg("b32")
        b.op(f"mul.lo.u32 {n}, {R}, {self.P}")
        i = b.reg("b32")
        b.op(f"mov.u32 {i}, {self.tid}")
        loop, done = b.new_label("reset"), b.new_label("reset_done")
        b.label(loop)
        pi = b.reg("pred")
        b.op(f"setp.ge.u32 {pi}, {i}, {n}")
        b.op(f"@{pi} bra {done}")
        a = b.reg("b64")
        b.op(f"mul.wide.u32 {a}, {i}, 4")
        ac, ar = b.reg("b64"), b.reg("b64")
        b.op(f"add.u64 {ac}, {a}, {wr['count']}")
        b.op(f"add.u64 {ar}, {a}, {wr['ready']}")
        b.op(f"st.global.b32 [{ac}], 0")
        b.op(f"st.global.b32 [{ar}], 0")
        b.op(f"add.u32 {i}, {i}, {self.T}")
        b.op(f"bra {loop}")
        b.label(done)
        b.op(f"@{t0} st.global.b32 [{wr['ticket']}], 0")
        b.op(f"@{t0} st.global.b32 [{wr['done']}], 0")
        b.label(end)


def check_emittable(kir) -> None:
    for t in kir.inputs:
        if t.dtype not in ESIZE:
            raise EmitError(f"input {t.name} is {t.dtype}")
