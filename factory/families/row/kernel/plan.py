"""The plan of a row kernel: the stage of every node, the passes over the row and what each
finishes (reductions, online pairs, moments, row outputs), and which intermediates a row held in
registers keeps between passes (materialisation). Analysis only: nothing here emits PTX."""

from __future__ import annotations

from factory.families.row.ir import ROLE_ROW, ROW, KernelIR
from factory.spec import expr as E

EXPENSIVE_UNARY = {"exp", "log", "tanh", "erf", "sigmoid", "sqrt", "rsqrt"}
# Registers (f32) the materialised intermediates of a row may take, all nodes together.
MAX_MATERIALISED_REGS = 64


def compute_stages(ir: KernelIR, online: bool, moments: bool = False) -> dict[E.Node, int]:
    """Stage of every node; with `online`, a paired sum finishes with its max; with `moments`,
    a variance with its mean."""
    pair_max = {p.sum_node: p.max_node for p in ir.online} if online else {}
    if moments:
        pair_max |= {q.var_node: q.mean_node for q in ir.moments}
    st: dict[E.Node, int] = {}
    for n in ir.order:
        if isinstance(n, E.Input | E.Const):
            st[n] = 0
        elif isinstance(n, E.Reduce):
            st[n] = st[pair_max[n].x] + 1 if n in pair_max else st[n.x] + 1
        elif isinstance(n, E.Gather):
            st[n] = st[n.x]
        else:
            st[n] = max(st[c] for c in E.children(n))
    return st


class PlanMixin:
    """Stages, passes and materialisation (see the module)."""

    def _num_passes(self) -> int:
        last = 0
        for r in self.ir.reductions:
            if r in self.pair_sums or r in self.fused:
                continue
            last = max(last, self.stages[r.x])
        for q in self.moments:
            last = max(last, self.stages[q.x_node])
        for o in self.ir.outputs:
            if o.role == ROLE_ROW:
                last = max(last, self.stages[o.node])
        return last + 1

    def _count_reduce_regs(self) -> int:
        n = sum(
            1
            for r in self.ir.reductions
            if r not in self.pair_sums and r not in self.alias and r not in self.fused
        )
        # a pair carries two values, its max is already counted; moments carry three
        return n + len(self.pairs) + 3 * len(self.moments)

    def _canon(self, r: E.Reduce) -> E.Reduce:
        return self.alias.get(r, r)

    def _pass_roots(self, p: int):
        """(regular reductions, online pairs, row outputs) finishing their work in pass p."""
        reds = [
            r
            for r in self.ir.reductions
            if r not in self.pair_sums
            and r not in self.alias
            and r not in self.fused
            and self.stages[r.x] == p
            and not any(self._canon(q.max_node) == r for q in self.pairs)
        ]
        pairs = [q for q in self.pairs if self.stages[q.f_node] == p]
        outs = [o for o in self.ir.outputs if o.role == ROLE_ROW and self._out_pass(o) == p]
        return reds, pairs, outs

    def _out_pass(self, o) -> int:
        """The pass that writes row output o: where its value is ready, or with late_stores (the
        row in registers) the last pass, so that every store follows every load."""
        if self.s.late_stores and getattr(self, "mode", None) == "cached":
            return self.num_passes - 1
        return self.stages[o.node]

    def _pass_moments(self, p: int) -> list:
        """Mean/variance pairs computed together in pass p (the `moments` schedule)."""
        return [q for q in self.moments if self.stages[q.x_node] == p]

    def _root_nodes(self, p: int) -> list[E.Node]:
        reds, pairs, outs = self._pass_roots(p)
        return (
            [r.x for r in reds]
            + [q.f_node for q in pairs]
            + [o.node for o in outs]
            + [q.x_node for q in self._pass_moments(p)]
        )

    def _row_closure(self, roots, stop=frozenset()) -> list[E.Node]:
        """Row-level nodes reachable from roots through row-level nodes, operands first."""
        seen: set = set()
        order: list = []

        def visit(n):
            if n in seen or self.level[n] != ROW:
                return
            seen.add(n)
            if n not in stop:
                for c in E.children(n):
                    visit(c)
            order.append(n)

        for r in roots:
            visit(r)
        return order

    def _is_expensive(self, n: E.Node) -> bool:
        if isinstance(n, E.Unary):
            return n.op in EXPENSIVE_UNARY
        if isinstance(n, E.Binary):
            return n.op in ("div", "pow") and self.level.get(n.b) == ROW
        return False

    def _plan_materialised(self) -> list[E.Node]:
        """Cached mode: expensive row intermediates computed in one pass and needed in a later
        one are kept in registers instead of recomputed (softmax's exp(x - max))."""
        chosen: list[E.Node] = []
        if not self.s.keep_intermediates:
            return chosen
        per_node = self.s.chunks * self.V
        for p in range(1, self.num_passes):
            for n in self._row_closure(self._root_nodes(p)):
                if (
                    self.stages[n] < p
                    and not isinstance(n, E.Input)
                    and self._is_expensive(n)
                    and n not in chosen
                    and (len(chosen) + 1) * per_node <= MAX_MATERIALISED_REGS
                ):
                    chosen.append(n)
        return chosen

    def _used_inputs(self, mode: str) -> list[str]:
        """The inputs this row's passes read, in first use; sets the row's plan (materialised
        intermediates, the last pass that reads each input)."""
        self.mode = mode
        self.materialised = self._plan_materialised() if mode == "cached" else []
        mat_set = set(self.materialised)
        used_inputs: list[str] = []
        self.last_read: dict[str, int] = {}  # the last pass that reads each input
        for p in range(self.num_passes):
            stop = {n for n in mat_set if self.stages[n] < p}
            for n in self._row_closure(self._root_nodes(p) + self._mat_roots(p), stop):
                if isinstance(n, E.Input):
                    self.last_read[n.name] = p
                    if n.name not in used_inputs:
                        used_inputs.append(n.name)
        return used_inputs

    def _mat_roots(self, p: int) -> list[E.Node]:
        return [n for n in getattr(self, "materialised", []) if self.stages[n] == p]

    def _cached_row_inputs(self) -> list[str]:
        """Row-tensor inputs the cached path holds in registers."""
        self.materialised = self._plan_materialised()
        mat_set = set(self.materialised)
        names: list[str] = []
        for p in range(self.num_passes):
            stop = {n for n in mat_set if self.stages[n] < p}
            for n in self._row_closure(self._root_nodes(p) + self._mat_roots(p), stop):
                if (
                    isinstance(n, E.Input)
                    and self.tensors[n.name].role == ROLE_ROW
                    and n.name not in names
                ):
                    names.append(n.name)
        return names
