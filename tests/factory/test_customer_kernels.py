"""Customer baseline kernels: the shipped examples validate; PTX header and signature checks;
CUDA C compiled by NVRTC in a sandbox, with every include but the fp16/bf16 headers refused
before compiling and the compiler log filtered to the customer's own lines."""

from pathlib import Path

import pytest

from factory.spec import SpecError, load_manifest
from factory.spec.kernels import (
    check_cuda_includes,
    check_ptx,
    compile_cuda,
    filter_log,
    parse_ptx,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "factory" / "examples"
CUDA_MANIFEST = (EXAMPLES / "rmsnorm_cuda.toml").read_text()
CUDA_SOURCE = (EXAMPLES / "rmsnorm_cuda.cu").read_text()
PTX_MANIFEST = (EXAMPLES / "softmax_ptx.toml").read_text()
PTX_SOURCE = (EXAMPLES / "softmax_ptx.ptx").read_text()


def fields(exc: SpecError) -> list[str]:
    return [f for f, _ in exc.errors]


def text_of(exc: SpecError) -> str:
    return str(exc)


# -- the shipped examples ------------------------------------------------------------------------


def test_the_example_cuda_rmsnorm_kernel_compiles_and_validates():
    w = load_manifest(
        CUDA_MANIFEST, baseline_source=CUDA_SOURCE.encode(), baseline_filename="rmsnorm_cuda.cu"
    )
    b = w.baseline
    assert b.language == "cuda" and b.source == CUDA_SOURCE
    assert ".visible .entry rmsnorm_naive(" in b.ptx
    assert [p.kind for p in b.params] == ["tensor", "tensor", "tensor", "dim", "scalar"]
    assert b.launch.grid == ("M", 1, 1) and b.launch.block == (256, 1, 1)


def test_the_example_ptx_softmax_kernel_validates():
    w = load_manifest(PTX_MANIFEST, baseline_source=PTX_SOURCE, baseline_filename="softmax_ptx.ptx")
    assert w.baseline.language == "ptx"
    assert w.baseline.ptx == PTX_SOURCE
    assert w.baseline.entry == "softmax_naive"
    assert w.baseline.launch.block == (128, 1, 1)


def test_the_example_ptx_is_what_nvcc_makes_of_the_checked_in_source():
    # Keeps the .cu next to the .ptx honest: same entry, same signature.
    info = parse_ptx(PTX_SOURCE)
    assert info.entries["softmax_naive"].param_types == ("u64", "u64", "u32")
    assert "softmax_naive" in (EXAMPLES / "softmax_ptx.cu").read_text()


def test_a_manifest_with_a_baseline_but_no_uploaded_file_is_refused():
    with pytest.raises(SpecError) as e:
        load_manifest(PTX_MANIFEST)
    assert "baseline.file" in fields(e.value)


def test_an_uploaded_file_with_another_name_is_refused():
    with pytest.raises(SpecError) as e:
        load_manifest(PTX_MANIFEST, baseline_source=PTX_SOURCE, baseline_filename="other.ptx")
    assert "baseline.file" in fields(e.value)


def test_a_binding_with_the_wrong_parameter_count_is_refused():
    manifest = PTX_MANIFEST.replace('    { kind = "dim", name = "N" },\n', "")
    with pytest.raises(SpecError) as e:
        load_manifest(manifest, baseline_source=PTX_SOURCE)
    assert fields(e.value) == ["baseline.params"]
    assert "takes 3 parameters" in text_of(e.value)


def test_a_binding_with_the_wrong_parameter_type_is_refused():
    manifest = PTX_MANIFEST.replace(
        '{ kind = "dim", name = "N" }', '{ kind = "scalar", value = 1.0 }'
    )
    with pytest.raises(SpecError) as e:
        load_manifest(manifest, baseline_source=PTX_SOURCE)
    assert fields(e.value) == ["baseline.params[2].ptx_type"]


def test_an_unknown_entry_is_refused_with_the_entries_found():
    manifest = PTX_MANIFEST.replace('entry = "softmax_naive"', 'entry = "softmax_fast"')
    with pytest.raises(SpecError) as e:
        load_manifest(manifest, baseline_source=PTX_SOURCE)
    assert fields(e.value) == ["baseline.entry"]
    assert "softmax_naive" in text_of(e.value)


def test_an_impossible_launch_is_refused_naming_the_shape():
    manifest = PTX_MANIFEST.replace("block = [128]", "block = [2048]")
    with pytest.raises(SpecError) as e:
        load_manifest(manifest, baseline_source=PTX_SOURCE)
    assert "baseline.launch" in fields(e.value)
    manifest = PTX_MANIFEST.replace('grid = ["M"]', 'grid = ["M", "N * 100"]')
    with pytest.raises(SpecError) as e:
        load_manifest(manifest, baseline_source=PTX_SOURCE)
    assert "grid[1]" in text_of(e.value)


def test_launch_arithmetic_is_shape_arithmetic_not_python():
    manifest = PTX_MANIFEST.replace('grid = ["M"]', "grid = [\"__import__('os').getpid()\"]")
    with pytest.raises(SpecError) as e:
        load_manifest(manifest, baseline_source=PTX_SOURCE)
    assert e.value.errors[0][0].startswith("baseline.launch.grid")


# -- PTX checks ----------------------------------------------------------------------------------


def test_ptx_with_a_newer_version_is_refused():
    newer = PTX_SOURCE.replace(".version 9.0", ".version 9.1")
    with pytest.raises(SpecError) as e:
        check_ptx(newer)
    assert "newer than the supported 9.0" in text_of(e.value)
    with pytest.raises(SpecError):
        load_manifest(PTX_MANIFEST, baseline_source=newer)


@pytest.mark.parametrize(
    ("target", "ok"),
    [("sm_80", True), ("sm_86", True), ("sm_89", True), ("sm_90", True), ("sm_90a", True),
     ("sm_100", False), ("sm_75", False), ("sm_120", False), ("compute_90", False)],
)  # fmt: skip
def test_ptx_targets_must_be_known_and_runnable_on_sm_90(target, ok):
    ptx = PTX_SOURCE.replace(".target sm_90", f".target {target}")
    if ok:
        assert check_ptx(ptx, target="sm_90").target == target
    else:
        with pytest.raises(SpecError):
            check_ptx(ptx, target="sm_90")


def test_sm_100_workloads_accept_sm_100_ptx_but_not_sm_90a():
    assert check_ptx(PTX_SOURCE.replace(".target sm_90", ".target sm_100"), target="sm_100")
    with pytest.raises(SpecError):
        check_ptx(PTX_SOURCE.replace(".target sm_90", ".target sm_90a"), target="sm_100")


def test_ptx_must_be_64_bit_and_have_a_visible_entry():
    with pytest.raises(SpecError, match="address_size 64"):
        check_ptx(PTX_SOURCE.replace(".address_size 64", ".address_size 32"))
    with pytest.raises(SpecError, match="visible"):
        check_ptx(PTX_SOURCE.replace(".visible .entry", ".entry"))


def test_ptx_parameters_are_parsed_with_their_types():
    ptx = (
        ".version 8.0\n.target sm_90\n.address_size 64\n"
        "// .visible .entry commented_out(.param .u32 a)\n"
        ".visible .entry k(\n .param .u64 .ptr .global .align 16 k_p0,\n .param .f32 k_p1,\n"
        " .param .align 8 .b8 k_p2[16]\n)\n{ ret; }\n"
        ".visible .entry no_params()\n{ ret; }\n"
    )
    info = check_ptx(ptx)
    assert info.version == (8, 0)
    assert info.entries["k"].param_types == ("u64", "f32", "array")
    assert info.entries["no_params"].param_types == ()
    assert "commented_out" not in info.entries


def test_binary_or_nul_bytes_in_uploaded_kernels_are_refused():
    for bad in (PTX_SOURCE.encode() + b"\x00", b"\xff\xfe" + PTX_SOURCE.encode(), "\x01x"):
        with pytest.raises(SpecError) as e:
            load_manifest(PTX_MANIFEST, baseline_source=bad)
        assert fields(e.value) == ["baseline.source"]


def test_oversized_kernel_files_are_refused():
    big = PTX_SOURCE + "//" + "x" * (1024 * 1024)
    with pytest.raises(SpecError, match="limit"):
        load_manifest(PTX_MANIFEST, baseline_source=big)


# -- CUDA C --------------------------------------------------------------------------------------

KERNEL = (
    'extern "C" __global__ void k(float* y, unsigned int n) '
    "{ if (threadIdx.x < n) y[threadIdx.x] = 1.0f; }\n"
)


def test_plain_cuda_c_compiles_to_ptx_for_sm_90():
    ptx = compile_cuda(KERNEL)
    info = check_ptx(ptx)
    assert info.version <= (9, 0) and info.target == "sm_90"
    assert info.entries["k"].param_types == ("u64", "u32")


def test_cuda_c_can_target_sm_100():
    assert check_ptx(compile_cuda(KERNEL, target="sm_100"), target="sm_100").target == "sm_100"


def test_the_fp16_and_bf16_headers_work():
    src = (
        '#include <cuda_fp16.h>\n#include "cuda_bf16.h"\n'
        'extern "C" __global__ void k(__half* h, __nv_bfloat16* b) {\n'
        "  h[0] = __float2half(__half2float(h[0]) * 2.0f);\n"
        "  b[0] = __float2bfloat16(__bfloat162float(b[0]) + 1.0f);\n}\n"
    )
    assert "k" in check_ptx(compile_cuda(src)).entries


def test_including_etc_passwd_is_refused_before_compiling_and_never_shows_its_contents():
    secret_lines = [ln for ln in Path("/etc/passwd").read_text().splitlines() if ln.strip()]
    src = '#include "/etc/passwd"\n' + KERNEL
    with pytest.raises(SpecError) as e:
        compile_cuda(src)
    message = text_of(e.value)
    assert "only #include <cuda_fp16.h> and <cuda_bf16.h>" in message
    for line in secret_lines:
        assert line not in message
    assert "root:" not in message
    # The same through the manifest loader.
    manifest = CUDA_MANIFEST
    with pytest.raises(SpecError) as e:
        load_manifest(manifest, baseline_source="#include </etc/passwd>\n" + CUDA_SOURCE)
    assert "root:" not in text_of(e.value)
    assert fields(e.value) == ["baseline.source"]


@pytest.mark.parametrize(
    "directive",
    [
        '#include "/etc/passwd"',
        "#include </etc/passwd>",
        '#include "../../etc/passwd"',
        '#include "kernel.cu"',
        "#include <stdio.h>",
        "#include <cuda_fp16.h/../../../etc/passwd>",
        "  #  include <vector_types.h>",
        "#inc\\\nlude </etc/passwd>",
        "%:include </etc/passwd>",
        "??=include </etc/passwd>",
        "/* c */ # /* c */ include </etc/passwd>",
        "#define P </etc/passwd>\n#include P",
        "#include_next <cuda_fp16.h>",
        "#import </etc/passwd>",
        "#embed </etc/passwd>",
        "#if __has_include(</etc/passwd>)\n#endif",
    ],
)
def test_every_include_outside_the_whitelist_is_refused(directive):
    with pytest.raises(SpecError) as e:
        check_cuda_includes(directive + "\n" + KERNEL)
    assert e.value.errors[0][0] == "baseline.source"


def test_the_whitelisted_includes_pass_the_scan():
    check_cuda_includes('#include <cuda_bf16.h>\n#include "cuda_fp16.h"  // halves\n' + KERNEL)


def test_a_compile_error_shows_only_the_customers_own_lines():
    src = KERNEL + 'extern "C" __global__ void bad(float* y) { y[0] = undefined_name; }\n'
    with pytest.raises(SpecError) as e:
        compile_cuda(src)
    assert e.value.errors[0][0] == "baseline.source"
    assert "line 2: error" in text_of(e.value)
    assert "undefined_name" in text_of(e.value)


def test_the_log_filter_drops_lines_from_other_files_and_source_echoes():
    log = (
        "/etc/passwd(1): error: expected a declaration\n"
        "  root:x:0:0:root:/root:/bin/bash\n"
        "  ^\n"
        'kernel.cu(1): error: identifier "zz" is undefined\n'
        "  y[0] = zz;\n"
        "cuda_bf16.hpp(10): warning: something\n"
    )
    shown = filter_log(log, "y[0] = zz;\n")
    assert shown[0] == 'line 1: error: identifier "zz" is undefined  [y[0] = zz;]'
    assert not any("root" in s for s in shown)
    assert "hidden" in shown[-1]


def test_a_compile_that_runs_too_long_is_stopped():
    # A macro that doubles forty times: 2**40 tokens keep the preprocessor busy for hours.
    lines = ["#define A0 1+"] + [f"#define A{i} A{i - 1} A{i - 1}" for i in range(1, 41)]
    src = "\n".join(lines) + '\nextern "C" __global__ void k(long* y) { y[0] = A40 1; }\n'
    with pytest.raises(SpecError) as e:
        compile_cuda(src, timeout_s=2.0)
    assert e.value.errors == [("baseline.source", "compiling took longer than 2 s")]


@pytest.mark.parametrize(
    "source",
    [
        # A comment marker inside a string must not hide the next line from the scan.
        '"/*";\n# /**/ include </etc/passwd>\n"*/";\n',
        'const char* s = "//";\n#include </etc/passwd>\n',
        "/* a comment */ #include </etc/passwd>\n",
        "#include /* why not */ </etc/passwd>\n",
        # Digit separators and prefixed literals decide what is a comment: refused outright.
        "int a = 1'0; const char* s = \"x'/*\";\n#include </etc/passwd>\n*/\n",
        "char c = L'/'; /*\n*/\n",
        'const char* r = R"(\n#include </etc/passwd>\n)";\n',
        "??=include </etc/passwd>\n",
    ],
)
def test_comment_and_literal_tricks_cannot_hide_an_include(source):
    with pytest.raises(SpecError):
        check_cuda_includes(source + KERNEL)


def test_apostrophes_in_comments_are_fine():
    check_cuda_includes("// don't worry: it's fine\n/* isn't it */\nchar c = 'x';\n" + KERNEL)


@pytest.mark.parametrize(
    "hostile",
    [
        "/*" * 200_000,
        "#/*" * 150_000,
        '"' * 300_000,
        "\n" * 500_000 + ".version 9.0",
        ".entry a(" * 50_000,
        ".visible .entry a(.param .u64 p)\n" * 20_000,
    ],
)
def test_scanners_stay_linear_on_hostile_input(hostile):
    import time

    start = time.perf_counter()
    for check in (check_cuda_includes, check_ptx):
        try:
            check(hostile)
        except SpecError:
            pass
    assert time.perf_counter() - start < 2.0


def test_even_if_the_include_scan_were_bypassed_the_log_filter_hides_the_file(monkeypatch):
    import factory.spec.kernels as kernels

    monkeypatch.setattr(kernels, "check_cuda_includes", lambda source, field="": None)
    secret_lines = [ln for ln in Path("/etc/passwd").read_text().splitlines() if ln.strip()]
    with pytest.raises(SpecError) as e:
        kernels.compile_cuda('#include "/etc/passwd"\n' + KERNEL)
    message = text_of(e.value)
    assert "root:" not in message
    assert not any(line in message for line in secret_lines)
    assert "hidden" in message  # NVRTC did complain about the file; we showed none of it
