"""Reductions across the threads of a row, through the library in factory.emit.reduce.

Per-thread accumulators, a butterfly over the warp (shfl.sync.bfly), then, when a row spans
W > 1 warps, one shared-memory slot per warp and a barrier per row group (`WarpSlots`), then
across a cluster's blocks through distributed shared memory (`ClusterSlots`); every thread ends
with the row's value. A row of T < 32 threads shares its warp with 32 / T others and its
butterfly stays within its T lanes; a row group past the last row works on the last row with its
stores off, so that every lane of a warp reaches each shuffle. max(F) and sum(exp(F - max F))
can run as one online pass; a mean and a variance as one pass of (count, mean, M2) moments.

Every stage takes its own shared slots (red_slot, counted in advance by _count_reduce_regs), so
that no thread overwrites a word another may still be reading within a row.
"""

from __future__ import annotations

from factory.emit import reduce as R
from factory.emit.ptx import EmitError
from factory.emit.reduce import COMBINE
from factory.families.row.kernel.evaluation import _Ctx


class ReductionsMixin:
    """Row reductions, online pairs and moments across threads (see the module)."""

    def _warp_slots(self) -> R.WarpSlots:
        """The row group's shared slots (red_smem, laid out [group][slot][warp]: _prologue) and
        its barrier."""
        return R.WarpSlots(
            group=self.red_group, write=self.red_write, lane0=self.lane0, warps=self.W, bar=self.bar
        )

    def _take_slots(self, n: int) -> int:
        """The first of `n` shared slots of the next reduction stage of this row."""
        slot0 = self.red_slot
        self.red_slot += n
        if self.red_slot > self.red_items_total:
            raise EmitError("internal: more reduction slots used than counted")
        return slot0

    def _finish_reductions(self, reds, accs, pairs, pair_accs) -> None:
        """The row's value of each reduction in `reds` (accumulators `accs`, each with its
        acc_split partials) and online pair (`pairs`, accumulators (m, s) in `pair_accs`) in
        every thread of the row, published in self.scal (a mean divided by N)."""
        b = self.b
        if not (reds or pairs):
            return
        for r, a in zip(reds, accs, strict=True):
            parts = self.partials[a]
            if len(parts) > 1:
                b.comment(f"{r.op}: this thread's {len(parts)} partials, by a tree")
                R.tree(b, COMBINE[r.op], parts, dst=a)
        b.comment("row reduction: warp butterfly" + (", then across warps" if self.W > 1 else ""))
        values = [(r.op, a) for r, a in zip(reds, accs, strict=True)]
        R.butterfly(b, self.bfly, values, pair_accs)
        if self.W > 1:
            slot0 = self._take_slots(len(accs) + len(pair_accs))
            R.across_warps(b, self._warp_slots(), slot0, values, pair_accs)
            if self.C > 1:
                cl = R.ClusterSlots(symbol="cl_smem", writer=self.cta_t0, blocks=self.C)
                R.across_cluster(b, cl, slot0, values, pair_accs)
        for r, a in zip(reds, accs, strict=True):
            if r.op == "mean":
                v = b.reg("f32")
                b.op(f"mul.f32 {v}, {a}, {self.inv_n}")
                self.scal[r] = (v, "f32")
            else:
                self.scal[r] = (a, "f32")
        for q, (m, s_) in zip(pairs, pair_accs, strict=True):
            self.scal[q.max_node] = (m, "f32")
            self.scal[self._canon(q.max_node)] = (m, "f32")
            self.scal[q.sum_node] = (s_, "f32")
            self.scal[self._canon(q.sum_node)] = (s_, "f32")
        self._publish_aliases()

    def _publish_aliases(self) -> None:
        """A reduction that differs from a computed one only in keepdims gets its value."""
        for src, dst in self.alias.items():
            if dst in self.scal and src not in self.scal:
                self.scal[src] = self.scal[dst]
            if src in self.scal and dst not in self.scal:
                self.scal[dst] = self.scal[src]

    # ---------------------------------------------------------------- mean and variance together

    def _moment_groups(
        self, regs, chunks: int, *, fast: bool, n_minus=None, vec: bool = False
    ) -> None:
        """Fold this thread's elements in `regs` into each moment pair's (count, mean, squared
        deviations): the group's own mean first, then its deviations from it (both over the
        registers), then Chan's merge into the running triple (R.group_moments)."""
        V = self.V
        p, moms = self.mom_pass
        for q, acc in zip(moms, self.mom_accs, strict=True):
            preds = []
            for k in range(chunks):
                pk = None if fast else self._chunk_preds(self._chunk_rem(n_minus, k), vec)
                preds += [None if fast else pk[j] for j in range(V)]
            R.group_moments(self.b, acc, lambda q=q: self._x_values(q, p, regs, chunks), preds)

    def _x_values(self, q, p: int, regs, chunks: int):
        """X of each element of the group, evaluated afresh on every call: between the two sweeps
        of a group nothing is held but the packed row already in registers (holding 32 f32
        values costs LayerNorm 17 registers at 256 threads x 4 chunks)."""
        for e in range(chunks * self.V):
            yield self._as_f32(*self._eval(q.x_node, _Ctx("elem", p, e=e, chunk_regs=regs)))

    def _finish_moments(self, moms, accs) -> None:
        """Merge the threads' triples across the row (a butterfly over the warp, then the warps
        through shared memory) and publish the row's mean and variance."""
        b = self.b
        if not moms:
            return
        b.comment("mean and variance across the row: Chan's merge, lower lane first")
        R.moments_butterfly(b, self.bfly, self.lane, accs)
        if self.W > 1:
            slot0 = self._take_slots(3 * len(accs))
            R.moments_across_warps(b, self._warp_slots(), slot0, accs)
        for q, (_n, m, m2) in zip(moms, accs, strict=True):
            var = b.reg("f32")
            b.op(f"mul.f32 {var}, {m2}, {self.inv_n}")
            for node, val in ((q.mean_node, m), (q.var_node, var)):
                self.scal[node] = (val, "f32")
                self.scal[self._canon(node)] = (val, "f32")
        self._publish_aliases()

    # ---------------------------------------------------------------- online max and sum

    def _online_update(self, m: str, s_: str, vals: list[str]) -> None:
        """Fold a group of values into (running max m, running sum s of exp(v - m)); with
        acc_split, by trees."""
        R.online_update(self.b, m, s_, vals, by_tree=self.s.acc_split > 1)

    def _online_update_packed(self, m: str, s_: str, words: list[str], dtype: str) -> None:
        """_online_update over the 16-bit elements packed two to a word in `words`: the max by
        a tree of packed max instructions, then each element unpacked for its exponential."""
        R.online_update_packed(
            self.b,
            m,
            s_,
            words,
            dtype,
            lambda w, half: self._unpack_word(dtype, w, half),
            by_tree=self.s.acc_split > 1,
        )
