"""lab.probes.probe_foreign: the PTX rewrites and the argument lists it gives a foreign kernel. The
probe itself (torch.compile's kernels launched as ours) is for the GPU (gpu_pending.sh foreign);
here a hand-written kernel of the same outline stands in for Triton's."""

from __future__ import annotations

import numpy as np
import pytest

from factory.compile import compile_ptx
from lab.probes import probe_foreign as pf

# Three pointers, two sizes, two scratch pointers (as Triton's entries end); coherent loads with
# L1 eviction qualifiers and an L2 policy operand, one plain load, one plain store.
KERNEL = """
.version 8.7
.target sm_90a
.address_size 64

.visible .entry k(
	.param .u64 .ptr .global .align 1 k_param_0,
	.param .u64 .ptr .global .align 1 k_param_1,
	.param .u64 .ptr .global .align 1 k_param_2,
	.param .u32 k_param_3,
	.param .u32 k_param_4,
	.param .u64 .ptr .global .align 1 k_param_5,
	.param .u64 .ptr .global .align 1 k_param_6
)
.maxntid 128, 1, 1
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<16>;
	.reg .b64 	%rd<12>;
	ld.param.b64 	%rd1, [k_param_0];
	ld.param.b64 	%rd2, [k_param_1];
	ld.param.b64 	%rd3, [k_param_2];
	ld.param.b32 	%r1, [k_param_3];
	mov.u32 	%r2, %tid.x;
	setp.lt.u32 	%p1, %r2, %r1;
	mul.wide.u32 	%rd4, %r2, 16;
	add.s64 	%rd5, %rd1, %rd4;
	add.s64 	%rd6, %rd2, %rd4;
	add.s64 	%rd7, %rd3, %rd4;
	createpolicy.fractional.L2::evict_last.b64 %rd8, 1.0;
	createpolicy.fractional.L2::evict_first.b64 %rd9, 1.0;
	@%p1 ld.global.L1::evict_last.L2::cache_hint.v4.b32 { %r3, %r4, %r5, %r6 }, [ %rd5 + 0 ], %rd8;
	@%p1 ld.global.L1::evict_first.L2::cache_hint.v4.b32 { %r7, %r8, %r9, %r0 }, [ %rd5 + 0 ], %rd9;
	@%p1 ld.global.v4.b32 { %r11, %r12, %r13, %r14 }, [ %rd6 + 0 ];
	add.s32 	%r3, %r3, %r7;
	add.s32 	%r3, %r3, %r11;
	@%p1 st.global.v4.b32 [ %rd7 + 0 ], { %r3, %r4, %r5, %r6 };
	ret;
}
"""


def _loads(ptx: str) -> list[str]:
    return [ln.strip() for ln in ptx.splitlines() if "ld.global" in ln]


def test_the_entry_parameters_are_read_in_order():
    assert pf.entry_params(KERNEL) == ["ptr", "ptr", "ptr", "u32", "u32", "ptr", "ptr"]
    assert pf.ptx_arch(KERNEL) == "sm_90a"
    assert pf.ptx_arch(".version 9.0\n.address_size 64\n") == "sm_90"


def test_read_only_rewrite_moves_every_global_load_and_still_compiles():
    before = compile_ptx(KERNEL, "sm_90a")
    assert before.ok, before.log
    out = pf.to_read_only(KERNEL)
    loads = _loads(out)
    assert len(loads) == 3 and all("ld.global.nc." in ln for ln in loads)
    assert "ld.global.nc.nc" not in out and "st.global.v4" in out
    assert pf.to_read_only(out) == out  # already read-only: unchanged
    rep = compile_ptx(out, "sm_90a")
    assert rep.ok, rep.log


def test_hint_removal_drops_the_qualifiers_and_the_policy_operand_and_still_compiles():
    out = pf.without_load_hints(KERNEL)
    loads = _loads(out)
    assert len(loads) == 3
    for ln in loads:
        assert "evict" not in ln and "cache_hint" not in ln, ln
        assert ln.endswith("];"), ln
    assert "createpolicy" in out  # the policies are still made, just unused
    rep = compile_ptx(out, "sm_90a")
    assert rep.ok, rep.log
    # both rewrites together, as a read-only load without hints
    both = pf.without_load_hints(pf.to_read_only(KERNEL))
    assert all(ln.startswith("@%p1 ld.global.nc.v4.b32") for ln in _loads(both))
    assert compile_ptx(both, "sm_90a").ok


def test_arguments_are_the_pointers_then_zero_scratch_and_the_sizes_in_order():
    args = pf.foreign_args(pf.entry_params(KERNEL), [11, 22, 33], [16384, 8192])
    assert args[:3] == [11, 22, 33] and args[5:] == [0, 0]
    assert [type(a) for a in args[3:5]] == [np.uint32, np.uint32]
    assert [int(a) for a in args[3:5]] == [16384, 8192]


def test_a_kernel_that_does_not_fit_the_workload_is_refused():
    kinds = pf.entry_params(KERNEL)
    with pytest.raises(ValueError, match="32-bit"):
        pf.foreign_args(kinds, [1, 2, 3], [16384])
    with pytest.raises(ValueError, match="pointers"):
        pf.foreign_args(["ptr", "u32"], [1, 2], [5])


def test_triton_kernels_are_found_by_their_metadata(tmp_path):
    d = tmp_path / "triton" / "abcdef0123"
    d.mkdir(parents=True)
    (d / "triton_k.ptx").write_text(KERNEL)
    (d / "triton_k.cubin").write_bytes(b"\x7fELF")
    (d / "triton_k.json").write_text('{"name": "triton_k", "num_warps": 4, "shared": 64}')
    (d / "other.json").write_text('{"name": "other"}')  # no PTX or cubin beside it: not a kernel
    # a plain Triton kernel (not inductor's): other arguments, so left out
    (d / "softmax_row.ptx").write_text(KERNEL)
    (d / "softmax_row.cubin").write_bytes(b"\x7fELF")
    (d / "softmax_row.json").write_text('{"name": "softmax_row", "num_warps": 8, "shared": 0}')
    (found,) = pf.triton_kernels(str(tmp_path))
    assert (found["name"], found["warps"], found["shared"], found["hash"]) == (
        "triton_k",
        4,
        64,
        "abcdef01",
    )
    assert found["ptx"] == KERNEL and found["cubin"] == b"\x7fELF"


class _Buf:
    def __init__(self, ptr: int):
        self.ptr = ptr

    def data_ptr(self) -> int:
        return self.ptr


def test_a_placed_launcher_writes_where_the_baseline_last_wrote_one_launcher_per_placement():
    box, made, ran = {}, [], []

    def make(outs, dims):
        made.append((outs["y"].ptr, dims["M"]))
        return lambda: ran.append(outs["y"].ptr)

    run = pf.at_outputs_of(box, make, {"M": 4})
    for ptr in (100, 200, 100, 200, 300):  # the baseline's allocator cycling through buffers
        box["out"] = {"y": _Buf(ptr)}
        run()
    assert ran == [100, 200, 100, 200, 300]
    assert made == [(100, 4), (200, 4), (300, 4)]  # made once per placement
    assert len(run.made) == 3
