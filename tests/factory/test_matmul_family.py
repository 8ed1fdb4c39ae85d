"""The matmul family behind the seam: lowering (and its refusals), the space, seeds, features,
roofline, the FAMILY record, the example manifests (lowered, emitted and compiled with
nvJitLink on the CPU) and the agents proposing for a matmul workload."""

from __future__ import annotations

import importlib
import math
from pathlib import Path

import pytest

from factory import families
from factory.families import Unsupported
from factory.families.matmul import FAMILY, Schedule
from factory.families.matmul import features as F
from factory.spec import expr as E
from factory.spec import load_manifest

# the modules by name
L = importlib.import_module("factory.families.matmul.lower")
S = importlib.import_module("factory.families.matmul.space")

EXAMPLES = Path(__file__).resolve().parents[2] / "factory" / "examples"
MATMUL_EXAMPLES = sorted(
    p.name for p in EXAMPLES.glob("*.toml") if p.name.startswith(("matmul", "swiglu", "linear"))
)


def example(name: str):
    return load_manifest((EXAMPLES / name).read_text())


def manifest(expr, inputs=None, rows=None, out_dtype="bf16"):
    inputs = inputs or {"x": (["M", "K"], "bf16"), "w": (["N", "K"], "bf16")}
    rows = rows or {"M": 256, "N": 128, "K": 512}
    text = 'name = "t"\n'
    for name, (shape, dtype) in inputs.items():
        text += f'[inputs.{name}]\nshape = {shape!r}\ndtype = "{dtype}"\n'.replace("'", '"')
    text += f'[outputs.y]\nexpr = "{expr}"\ndtype = "{out_dtype}"\n[[shapes]]\n'
    text += "".join(f"{k} = {v}\n" for k, v in rows.items())
    return load_manifest(text)


XW = {"x": (["M", "K"], "bf16"), "w": (["N", "K"], "bf16")}
NK = (["N", "K"], "bf16")


# -- lowering -------------------------------------------------------------------------------------


def test_examples_exist():
    assert len(MATMUL_EXAMPLES) >= 3, MATMUL_EXAMPLES


@pytest.mark.parametrize("name", MATMUL_EXAMPLES)
def test_examples_lower_to_the_matmul_family(name):
    w = example(name)
    fam, ir = families.family_for(w)
    assert fam is FAMILY and fam.name == "matmul"
    assert ir.problems() == []
    assert ir.a.layout == "row" and ir.b.layout == "col"
    with pytest.raises(Unsupported, match="matrix product"):
        families.get("row").lower(w)


def test_roles_of_epilogue_inputs():
    inputs = {
        **XW,
        "bias": (["N"], "bf16"),
        "s": (["M", 1], "fp32"),
        "r": (["M", "N"], "bf16"),
        "c": ([1], "fp32"),
    }
    ir = L.lower(manifest("(x @ w.T + bias) * s * c + r", inputs))
    assert {i.name: i.role for i in ir.inputs} == {
        "bias": "col",
        "s": "row",
        "c": "scalar",
        "r": "full",
    }
    acc_reads = [n for o in ir.outputs for n in E.walk(o.expr)]
    assert any(getattr(n, "name", None) == "acc" for n in acc_reads)


def test_swiglu_shares_the_left_operand():
    ir = L.lower(example("swiglu_up.toml"))
    assert ir.b.name == "wg" and ir.b2 is not None and ir.b2.name == "wu"
    names = {getattr(n, "name", None) for n in E.walk(ir.outputs[0].expr)}
    assert {"acc", "acc2"} <= names


@pytest.mark.parametrize(
    ("expr", "inputs", "needle"),
    [
        ("x @ w.T + x @ u.T + x @ v.T", {**XW, "u": NK, "v": NK}, "3 matrix products"),
        ("(x @ w.T) * (z @ u.T)", {**XW, "z": (["M", "K"], "bf16"), "u": (["N", "K"], "bf16")},
         "different left operands"),
        ("sum(x @ w.T, axis=-1, keepdims=True) + x @ w.T", XW, "reduction after the matmul"),
        ("(x * 2) @ w.T", XW, "prologue"),
        ("(x @ w.T) @ v.T", {**XW, "v": (["N", "N"], "bf16")}, "chain of matmuls"),
        ("x.T @ w.T", {"x": (["K", "M"], "bf16"), "w": (["N", "K"], "bf16")}, "column-major"),
        ("x @ w.T", {"x": (["M", "K"], "fp32"), "w": (["N", "K"], "fp32")}, "bf16 or fp16"),
        ("x @ w.T", {"x": (["M", "K"], "bf16"), "w": (["N", "K"], "fp16")}, "share one dtype"),
        ("x @ w", {"x": (["M", "K"], "bf16"), "w": (["K", "N"], "bf16")}, "write x @ w.T"),
        ("exp(x @ w.T) + gather(g, t)", {**XW, "g": (["M", "N", "N"], "bf16"),
         "t": (["M", "N"], "int32")}, "gather"),
    ],
)  # fmt: skip
def test_refusals_say_what_the_family_cannot_do_yet(expr, inputs, needle):
    rows = {"M": 256, "N": 128, "K": 512}
    if any("B" in s for s, _ in inputs.values()):
        rows["B"] = 2
    if "t" in inputs:
        text_inputs = dict(inputs)
        w = _with_index(expr, text_inputs, rows)
    else:
        w = manifest(expr, inputs, rows)
    with pytest.raises(Unsupported) as e:
        families.family_for(w)
    assert needle in str(e.value), str(e.value)


def test_a_batched_product_lowers_now_that_batches_are_verified(monkeypatch):
    from factory.families.matmul import schedule as sched_mod

    inputs = {"x": (["B", "M", "K"], "bf16"), "w": (["N", "K"], "bf16")}
    w = manifest("x @ w.T", inputs, {"B": 2, "M": 256, "N": 128, "K": 512})
    fam, ir = families.family_for(w)
    assert fam is FAMILY and ir.batch == ("B",)
    dims = {"B": 2, "M": 256, "N": 128, "K": 512}
    assert S.is_valid(ir, FAMILY.default_schedule(ir, dims), dims) is None
    # the flag set False refuses it again, saying so
    monkeypatch.setattr(sched_mod, "BATCH_VERIFIED", False)
    assert "batched" in S.is_valid(ir, Schedule(tile_n=128), dims)


def _with_index(expr, inputs, rows):
    text = 'name = "t"\n'
    for name, (shape, dtype) in inputs.items():
        text += f'[inputs.{name}]\nshape = {shape!r}\ndtype = "{dtype}"\n'.replace("'", '"')
        if dtype == "int32":
            text += 'range = [0, "N"]\n'
    text += f'[outputs.y]\nexpr = "{expr}"\ndtype = "bf16"\n[[shapes]]\n'
    text += "".join(f"{k} = {v}\n" for k, v in rows.items())
    return load_manifest(text)


def test_k_not_a_multiple_of_8_is_refused_naming_the_shape():
    w = manifest("x @ w.T", XW, {"M": 64, "N": 64, "K": 100})
    with pytest.raises(Unsupported, match="K=100.*multiple of 8"):
        L.lower(w)


def test_an_output_not_per_element_is_refused():
    w = load_manifest(
        'name = "t"\n[inputs.x]\nshape = ["M", "K"]\ndtype = "bf16"\n'
        '[inputs.w]\nshape = ["N", "K"]\ndtype = "bf16"\n[inputs.s]\nshape = ["M", 1]\n'
        'dtype = "fp32"\n[outputs.y]\nexpr = "x @ w.T"\ndtype = "bf16"\n'
        '[outputs.z]\nexpr = "s * 2"\ndtype = "fp32"\n[[shapes]]\nM = 64\nN = 64\nK = 64\n'
    )
    with pytest.raises(Unsupported, match="output z has shape \\(M, 1\\)"):
        L.lower(w)


def test_an_input_broadcast_in_another_way_is_refused():
    from factory.spec.types import TensorDecl

    decl = TensorDecl("q", ("K",), "bf16", -1.0, 1.0)
    with pytest.raises(Unsupported, match="input q has shape \\(K,\\).*per column"):
        L._role(decl, ("M", "N"), "M", "N")


def test_workloads_without_a_product_go_to_another_family():
    # pure elementwise work (the flat family's, asked before the row family's since issue 50)
    w = manifest("x * 2", {"x": (["M", "N"], "bf16")}, {"M": 64, "N": 128})
    fam, _ = families.family_for(w)
    assert fam.name in ("row", "flat")
    with pytest.raises(Unsupported, match="no matrix product"):
        FAMILY.lower(w)


# -- space, seeds, features, roofline -------------------------------------------------------------


def test_space_is_the_valid_product_and_names_its_family():
    w = example("matmul_bias_gelu.toml")
    ir = FAMILY.lower(w)
    dims = [dict(d) for d in w.shapes]
    sp = FAMILY.space(ir, dims)
    assert len(sp) > 100
    assert FAMILY.space(ir, dims)[0] is sp[0]  # the same objects: described once
    for s in sp:
        assert isinstance(s, Schedule) and s.family == "matmul" and s.problem == "M,N,K"
        assert FAMILY.is_valid(ir, s, dims[0]) == (True, "")
        assert FAMILY.fits(ir, s, dims)
    assert {s.tile_n for s in sp} >= {64, 128, 256}
    assert {s.consumers for s in sp} == {1, 2}
    bad = Schedule(tile_n=256, stages=8, problem="M,N,K")
    ok, why = FAMILY.is_valid(ir, bad, dims[0])
    assert not ok and "shared memory" in why
    assert bad not in sp


def test_two_right_operands_halve_the_tile():
    w = example("swiglu_up.toml")
    ir = FAMILY.lower(w)
    sp = FAMILY.space(ir, [dict(d) for d in w.shapes])
    assert sp and max(s.tile_n for s in sp) <= 128
    d = FAMILY.default_schedule(ir, w.shapes[0])
    assert d.tile_n == 128 and d.problem == "M,N,K,2"


def test_seeds_follow_the_shape():
    ir = FAMILY.lower(example("matmul_bias_gelu.toml"))
    big = FAMILY.seeds(ir, {"M": 8192, "N": 8192, "K": 8192})
    skinny = FAMILY.seeds(ir, {"M": 128, "N": 8192, "K": 8192})
    for seeds in (big, skinny):
        assert 1 < len(seeds) <= S.SEEDS_PER_SHAPE
        assert len({(s.tile_m, s.tile_n) for s in seeds}) == len(seeds)
    assert big[0].tile_m == 128 and big[0].tile_n >= 192  # the widest tiles for a big shape
    assert FAMILY.default_schedule(ir, {"M": 8192, "N": 8192, "K": 8192}) in big
    # few rows: narrower tiles, so more SMs have a tile
    first = skinny[0]
    tiles = math.ceil(128 / first.tile_m) * math.ceil(8192 / first.tile_n)
    assert tiles >= 100, first


def test_default_fills_the_sms_at_skinny_shapes():
    """Where the 128 x 256 tile leaves half of the SMs idle, the default is the first of
    space.SKINNY whose CTAs fill most of the SMs in one wave; big shapes keep the wide tile."""
    from factory.families.matmul import space as SP

    ir = FAMILY.lower(example("matmul_bias_gelu.toml"))
    for m, n, k in [(512, 4096, 4096), (128, 8192, 8192), (1, 4096, 4096)]:
        d = {"M": m, "N": n, "K": k}
        s = FAMILY.default_schedule(ir, d)
        assert S.is_valid(ir, s, d) is None
        ctas = math.ceil(m / s.tile_m) * math.ceil(n / s.tile_n) * s.split_k
        assert SP.SKINNY_FILL * 132 <= ctas <= 132, (d, s.label())
        assert s in SP.skinny_choices(ir, [d])
        assert s in FAMILY.seeds(ir, d)
    for d in [{"M": 4096, "N": 4096, "K": 4096}, {"M": 2048, "N": 2048, "K": 8192}]:
        assert not SP.skinny_choices(ir, [d])
        assert FAMILY.default_schedule(ir, d).label() == "wgmma 128x256x64 s4 c2 pers g8 ts128"
    # a job with a big and a skinny shape: classified by its largest, one kernel for both
    both = [{"M": 8192, "N": 8192, "K": 8192}, {"M": 128, "N": 8192, "K": 8192}]
    assert FAMILY.default_schedule(ir, both).tile_n == 256
    # two right operands keep the 128 x 128 tile
    glu = FAMILY.lower(example("swiglu_up.toml"))
    assert not SP.skinny_choices(glu, [{"M": 128, "N": 8192, "K": 8192}])


def test_features_are_finite_and_follow_waves():
    ir = FAMILY.lower(example("matmul_bias_gelu.toml"))
    s = FAMILY.default_schedule(ir, {"M": 4096, "N": 4096, "K": 4096}).to_dict()
    order = ["M", "K", "N"]
    f = FAMILY.features(s, {"M": 4096, "N": 4096, "K": 4096}, order)
    assert len(f) == len(F.FEATURE_NAMES) and all(math.isfinite(v) for v in f)
    i = F.FEATURE_NAMES.index("log2_tiles")
    assert f[i] == pytest.approx(math.log2(32 * 16))
    assert f[F.FEATURE_NAMES.index("last_wave_fill")] == pytest.approx((512 - 3 * 132) / 132)
    assert f[F.FEATURE_NAMES.index("log2_k_iters")] == pytest.approx(6.0)
    assert set(FAMILY.feature_fields) >= {"tile_m", "tile_n", "stages", "problem"}
    # without the problem field, dims named M, N, K are read as such
    plain = {k: v for k, v in s.items() if k != "problem"}
    assert FAMILY.features(plain, {"M": 4096, "N": 4096, "K": 4096}, order) == f


def test_roofline_counts_each_product():
    d = {"M": 4096, "N": 4096, "K": 4096}
    r = FAMILY.roofline_of(example("matmul_bias_gelu.toml"), d)
    assert r.flops == 2 * 4096**3
    assert r.bytes == (4096 * 4096 * 3 + 4096) * 2
    d = {"M": 16384, "N": 14336, "K": 4096}
    assert FAMILY.roofline_of(example("swiglu_up.toml"), d).flops == 2 * 2 * 16384 * 14336 * 4096


def test_the_record_behind_the_registry():
    assert families.get("matmul") is FAMILY
    assert "matmul" in families.names()
    ir = FAMILY.lower(example("linear_residual.toml"))
    s = FAMILY.default_schedule(ir, {"M": 4096, "N": 4096, "K": 4096})
    d = s.to_dict()
    assert d["family"] == "matmul"
    assert families.of_schedule(d) is FAMILY
    assert FAMILY.schedule_from_dict(d) == s
    # the default stages its epilogue (TMA store) since the H100 run of 2026-12-07
    assert families.label(d) == "wgmma 128x256x64 s4 c2 pers g8 ts128"
    assert "problem" not in FAMILY.canonical(d)
    assert FAMILY.baselines == (
        "torch_eager",
        "torch_compile",
        "torch_compile_max_autotune",
        "triton",
    )
    assert families.baselines_module("matmul").__name__ == "factory.families.matmul.baselines"
    assert set(FAMILY.layout_fields) <= set(d)
    for changes, why in FAMILY.moves(s):
        assert set(changes) <= set(d) and why
    # from the staged default: a move to ping-pong, split-K or a cluster drops the staging (which
    # they do not emit), so each lands on a schedule is_valid can accept
    from dataclasses import replace

    for changes, why in FAMILY.moves(s):
        ok, reason = FAMILY.is_valid(ir, replace(s, **changes))
        assert ok or "tma_store" not in reason, (why, reason)
    staged = [c for c, why in FAMILY.moves(replace(s, tma_store=0)) if c.get("tma_store")]
    assert staged and FAMILY.is_valid(ir, replace(replace(s, tma_store=0), **staged[0]))[0]


# -- emission and compilation ---------------------------------------------------------------------


@pytest.mark.parametrize("name", MATMUL_EXAMPLES)
def test_examples_emit_and_compile_for_sm_90a(name):
    from factory.compile import compile_ptx, rejection_reason

    w = example(name)
    fam, ir = families.family_for(w)
    s = fam.default_schedule(ir, [dict(d) for d in w.shapes])
    em = fam.emit(ir, s, "sm_90")  # a workload's target: the family renders sm_90a
    assert ".target sm_90a" in em.ptx
    rep = compile_ptx(em.ptx, "sm_90a")
    assert rep.ok, rep.log[:500]
    assert rejection_reason(rep, em.launch.block[0]) == "", rejection_reason(rep)
    (rep2,) = fam.reports([em.ptx])
    assert rep2.ok and rep2.registers == rep.registers


# -- the agents -----------------------------------------------------------------------------------


def test_the_agents_propose_matmul_schedules():
    from factory import loop

    w = example("matmul_bias_gelu.toml")
    drafts = loop.propose(
        w, generation=0, population=4, evidence=[], backend="offline", seed=0, settings={}
    )
    assert drafts
    for d in drafts:
        assert d.schedule["family"] == "matmul"
        assert d.entry and ".target sm_90a" in d.ptx
    assert len({d.ptx for d in drafts}) == len(drafts)


def _measured(w, schedules, job="j1", generation=0):
    """Passed records for `schedules` at every shape of `w`, timed by the analytic estimate with a
    deterministic spread (a stand-in for the GPU)."""
    from factory import evidence as ev

    out = []
    for i, s in enumerate(schedules):
        sd = s.to_dict() if hasattr(s, "to_dict") else dict(s)
        for d in w.shapes:
            rows, n, k, nb = F.gemm_dims(sd, d)
            us = F.estimate(sd, rows, n, k, nb)["us"] * (1.0 + 0.05 * ((i * 7) % 5))
            roof = FAMILY.roofline_of(w, d)
            out.append(
                {
                    "job": job,
                    "status": "passed",
                    "median_us": us,
                    "dims": dict(d),
                    "schedule": sd,
                    "ptx_sha256": f"p{i}",
                    "generation": generation,
                    "family": ev.family_of(w),
                    "signature": ev.signature_of(w),
                    "gpu": w.target,
                    "workload_sha256": w.sha256,
                    "bytes": roof.bytes,
                    "flops": roof.flops,
                }
            )
    return out


def test_the_cost_model_fits_matmul_evidence_and_ranks_the_space():
    from factory.costmodel import CostModel

    w = example("matmul_bias_gelu.toml")
    ir = FAMILY.lower(w)
    sp = FAMILY.space(ir, [dict(d) for d in w.shapes])
    train = _measured(w, sp[::40])
    model = CostModel(dim_order=list(w.shapes[0]), family="matmul").fit(train)
    assert model.fitted
    d = w.shapes[0]
    roof = FAMILY.roofline_of(w, d)
    us = model.predict_many([s.to_dict() for s in sp], d, roof.bytes, roof.flops)
    assert all(math.isfinite(u) and u > 0 for u in us)
    assert len(set(round(u, 6) for u in us)) > 10  # the features tell layouts apart


def test_a_later_generation_proposes_new_matmul_schedules():
    from factory import loop

    w = example("matmul_bias_gelu.toml")
    first = loop.propose(
        w, generation=0, population=4, evidence=[], backend="offline", seed=0,
        settings={"job": "j1"},
    )  # fmt: skip
    ir = FAMILY.lower(w)
    tried = [FAMILY.schedule_from_dict(d.schedule) for d in first]
    evidence = _measured(w, tried)
    later = loop.propose(
        w, generation=1, population=4, evidence=evidence, backend="offline", seed=0,
        settings={"job": "j1"},
    )  # fmt: skip
    assert later
    seen = {FAMILY.canonical(d.schedule).__repr__() for d in first}
    for d in later:
        assert d.schedule["family"] == "matmul"
        assert FAMILY.canonical(d.schedule).__repr__() not in seen
        assert FAMILY.is_valid(ir, FAMILY.schedule_from_dict(d.schedule), dict(w.shapes[0]))[0]


@pytest.mark.parametrize(("operands", "out"), [("fp16", "fp16"), ("bf16", "fp32")])
def test_fp16_operands_and_fp32_outputs_emit_and_compile(operands, out):
    from factory.compile import compile_ptx

    inputs = {"x": (["M", "K"], operands), "w": (["N", "K"], operands), "b": (["N"], "fp32")}
    w = manifest("x @ w.T * 0.5 + b", inputs, {"M": 300, "N": 200, "K": 72}, out_dtype=out)
    fam, ir = families.family_for(w)
    assert fam is FAMILY and ir.a.dtype == operands and ir.outputs[0].dtype == out
    em = fam.emit(ir, fam.seeds(ir, dict(w.shapes[0]))[0])
    assert compile_ptx(em.ptx, "sm_90a").ok


def test_features_of_a_record_without_schedule_or_shape():
    f = FAMILY.features({}, {}, [])
    assert len(f) == len(F.FEATURE_NAMES) and all(math.isfinite(v) for v in f)


@pytest.mark.parametrize(
    ("tile_n", "stages", "persistent", "nb", "size", "measured_us"),
    [
        (256, 4, True, 1, 4096, 232.5),
        (256, 4, True, 1, 8192, 1704.6),
        (128, 5, True, 1, 4096, 233.3),
        (128, 5, True, 1, 8192, 1705.2),
        (256, 4, False, 1, 8192, 1725.7),
        (128, 4, True, 2, 4096, 426.8),
        (128, 4, True, 2, 8192, 3277.8),
    ],
)
def test_the_estimate_reproduces_the_measured_emitter(
    tile_n, stages, persistent, nb, size, measured_us
):
    """bench/results/2026-12-07-h200-matmul-emitter (H200, medians)."""
    sd = {"tile_m": 128, "tile_n": tile_n, "stages": stages, "consumers": 2,
          "persistent": persistent, "group_m": 8}  # fmt: skip
    us = F.estimate(sd, size, size, size, nb)["us"]
    assert abs(us / measured_us - 1) < 0.08, us


def test_the_space_grows_with_what_the_emitter_verifies(monkeypatch):
    from factory.families.matmul import schedule as sched_mod

    ir = FAMILY.lower(example("matmul_bias_gelu.toml"))
    dims = [{"M": 4096, "N": 4096, "K": 4096}]
    # clusters and split-K verified (2026-12-07): in the space; a flag set False takes its kind
    # out again
    S._SPACES.clear()
    now = FAMILY.space(ir, dims)
    assert any(s.pingpong for s in now) and any(s.cluster_m == 2 for s in now)
    monkeypatch.setattr(sched_mod, "CLUSTER_VERIFIED", False)
    S._SPACES.clear()
    before = FAMILY.space(ir, dims)
    assert not any(s.cluster_m == 2 for s in before) and len(now) > len(before)
    S._SPACES.clear()
    skinny = [{"M": 128, "N": 8192, "K": 8192}]
    assert any(s.split_k > 1 for s in FAMILY.space(ir, skinny))
    monkeypatch.setattr(sched_mod, "SPLITK_VERIFIED", False)
    S._SPACES.clear()
    assert not any(s.split_k > 1 for s in FAMILY.space(ir, skinny))
    S._SPACES.clear()
