"""nvJitLink compilation and the resource report (CPU only)."""

from factory.compile import CompileReport, compile_ptx, parse_resource_log, rejection_reason

GOOD_PTX = r"""
.version 9.0
.target sm_90
.address_size 64
.visible .entry twice(.param .u64 p)
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<4>;
    .reg .f32 %f<2>;
    .shared .align 4 .b8 scratch[1024];
    ld.param.u64 %rd1, [p];
    cvta.to.global.u64 %rd1, %rd1;
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd2, %r1, 4;
    add.s64 %rd3, %rd1, %rd2;
    ld.global.f32 %f1, [%rd3];
    bar.sync 0;
    add.f32 %f1, %f1, %f1;
    st.global.f32 [%rd3], %f1;
    ret;
}
"""

LOCAL_ARRAY_PTX = r"""
.version 9.0
.target sm_90
.address_size 64
.visible .entry uses_stack(.param .u64 p, .param .u32 i)
{
    .local .align 4 .b8 buf[256];
    .reg .b32 %r<4>;
    .reg .b64 %rd<6>;
    .reg .f32 %f<2>;
    ld.param.u64 %rd1, [p];
    cvta.to.global.u64 %rd1, %rd1;
    ld.param.u32 %r1, [i];
    mov.u64 %rd2, buf;
    mul.wide.u32 %rd3, %r1, 4;
    add.s64 %rd4, %rd2, %rd3;
    ld.global.f32 %f1, [%rd1];
    st.local.f32 [%rd4], %f1;
    ld.local.f32 %f1, [%rd2+4];
    st.global.f32 [%rd1], %f1;
    ret;
}
"""


def test_it_compiles_valid_ptx_and_reports_resources():
    report = compile_ptx(GOOD_PTX)
    assert report.ok, report.log
    assert report.cubin and report.cubin[:4] == b"\x7fELF"
    assert report.registers > 0
    assert report.smem_bytes == 1024
    assert report.barriers == 1
    assert report.stack_bytes == 0 and report.spill_store_bytes == 0
    assert report.entries[0].name == "twice"
    assert report.compile_ms > 0
    assert rejection_reason(report, threads_per_block=256) == ""


def test_it_returns_the_error_log_with_line_numbers_for_invalid_ptx():
    report = compile_ptx(GOOD_PTX.replace("add.f32", "add.f33"))
    assert not report.ok
    assert report.cubin is None
    assert "line 18" in report.log and "f33" in report.log
    assert rejection_reason(report).startswith("compile error")


def test_it_compiles_for_blackwell_too():
    assert compile_ptx(GOOD_PTX.replace("sm_90", "sm_100"), arch="sm_100").ok


def test_it_rejects_a_kernel_with_a_stack_frame():
    report = compile_ptx(LOCAL_ARRAY_PTX)
    assert report.ok, report.log
    assert report.stack_bytes > 0
    assert "stack frame" in rejection_reason(report)


def test_it_rejects_more_registers_than_the_register_file_holds():
    report = CompileReport(ok=True, arch="sm_90", registers=128)
    assert rejection_reason(report, threads_per_block=512) == ""
    assert "register file" in rejection_reason(report, threads_per_block=1024)


def test_it_rejects_spills_and_oversized_shared_memory():
    assert "spills" in rejection_reason(CompileReport(ok=True, arch="sm_90", spill_store_bytes=8))
    big = CompileReport(ok=True, arch="sm_90", smem_bytes=200 * 1024)
    assert "shared memory" in rejection_reason(big, dynamic_smem_bytes=64 * 1024)


def test_to_dict_is_json_ready_and_summarises_the_cubin():
    import json

    d = compile_ptx(GOOD_PTX).to_dict()
    assert "cubin" not in d and d["cubin_bytes"] > 0
    json.dumps(d)


def test_it_parses_a_verbose_log_into_entries():
    log = (
        "ptxas info    : Compiling entry function 'a' for 'sm_90'\n"
        "ptxas info    : Function properties for a\n"
        "ptxas         .     16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n"
        "ptxas info    : Used 40 registers, used 1 barriers, 512 bytes smem, 380 bytes cmem[0]\n"
    )
    [e] = parse_resource_log(log)
    assert (e.registers, e.stack_bytes, e.spill_store_bytes, e.spill_load_bytes) == (40, 16, 8, 4)
    assert (e.smem_bytes, e.barriers, e.cmem_bytes) == (512, 1, 380)


def test_it_falls_back_to_the_linker_summary_when_ptxas_lines_are_missing():
    log = (
        "info    : 0 bytes gmem\n"
        "info    : Function properties for 'k':\n"
        "info    : used 30 registers, used 1 barriers, 0 stack, 2048 bytes smem, "
        "540 bytes cmem[0], 0 bytes lmem\n"
    )
    [e] = parse_resource_log(log)
    assert (e.name, e.registers, e.barriers, e.smem_bytes) == ("k", 30, 1, 1024)
