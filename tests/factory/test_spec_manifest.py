"""load_manifest: the format, its defaults, and every mistake refused as a SpecError that names
the field. Includes the known attacks on expression evaluators."""

import json

import pytest

from factory.spec import (
    DEFAULT_TOLERANCE,
    SpecError,
    Tolerance,
    catalogue_manifest,
    load_manifest,
)
from factory.spec.expr import Binary, Const, Input, Reduce

BASE = """
name = "op"
[inputs.x]
shape = ["M", "N"]
dtype = "bf16"
[outputs.y]
expr = "{expr}"
dtype = "bf16"
[[shapes]]
M = 64
N = 128
"""


def manifest(expr="x * 2", extra=""):
    return BASE.replace("{expr}", expr) + extra


def refuse(text, **kw) -> SpecError:
    with pytest.raises(SpecError) as e:
        load_manifest(text, **kw)
    assert e.value.errors, "a SpecError always lists (field, problem) pairs"
    for field, problem in e.value.errors:
        assert isinstance(field, str) and field and isinstance(problem, str) and problem
    return e.value


def fields(exc):
    return [f for f, _ in exc.errors]


# -- what a good manifest becomes -----------------------------------------------------------------


def test_a_minimal_manifest_gets_sensible_defaults():
    w = load_manifest(manifest())
    assert w.target == "sm_90" and w.description == "" and w.tags == ()
    (x,) = w.inputs
    assert (x.name, x.shape, x.dtype, x.low, x.high) == ("x", ("M", "N"), "bf16", -4.0, 4.0)
    (y,) = w.outputs
    assert y.shape == ("M", "N") and y.dtype == "bf16" and y.source == "x * 2"
    assert isinstance(y.expr, Binary) and y.expr.a == Input("x", ("M", "N"), "bf16")
    assert w.shapes == ({"M": 64, "N": 128},)
    assert w.tolerance == {"bf16": DEFAULT_TOLERANCE["bf16"]}
    assert len(w.sha256) == 64 and w.baseline is None


def test_held_out_shapes_are_derived_one_row_and_odd_sizes():
    w = load_manifest(manifest())
    assert w.heldout_shapes == ({"M": 1, "N": 127}, {"M": 37, "N": 131})
    for row in w.heldout_shapes:
        assert row["N"] % 8 and row["N"] % 2 == 1


def test_derived_held_out_dims_never_drop_below_one():
    text = manifest().replace("M = 64\nN = 128", "M = 1\nN = 1")
    w = load_manifest(text)
    assert all(v >= 1 for row in w.heldout_shapes for v in row.values())


def test_explicit_held_out_shapes_replace_the_derived_ones():
    w = load_manifest(manifest(extra="[[heldout_shapes]]\nM = 3\nN = 5\n"))
    assert w.heldout_shapes == ({"M": 3, "N": 5},)


def test_lets_constants_and_sm_100_are_accepted():
    text = manifest("y0 * c", extra='[constants]\nc = 0.5\n[let]\ny0 = "x + 1"\n')
    text = text.replace('name = "op"', 'name = "op"\ntarget = "sm_100"')
    w = load_manifest(text)
    assert w.target == "sm_100"
    assert w.outputs[0].expr.b == Const(0.5)


def test_tolerance_defaults_per_output_dtype_and_overrides_merge():
    text = manifest(extra="[tolerance.bf16]\nrel_norm = 0.02\n")
    w = load_manifest(text)
    assert w.tolerance["bf16"] == Tolerance(0.02, DEFAULT_TOLERANCE["bf16"].atol,
                                            DEFAULT_TOLERANCE["bf16"].rtol)  # fmt: skip
    assert DEFAULT_TOLERANCE["bf16"].rel_norm == pytest.approx(1e-2)
    assert DEFAULT_TOLERANCE["fp16"].rel_norm == pytest.approx(5e-3)
    assert DEFAULT_TOLERANCE["fp32"].rel_norm == pytest.approx(1e-5)


def test_the_declared_output_shape_is_checked_against_the_expression():
    text = manifest("sum(x, axis=-1, keepdims=True)").replace(
        'dtype = "bf16"\n[[', 'dtype = "bf16"\nshape = ["M", 1]\n[['
    )
    assert load_manifest(text).outputs[0].shape == ("M", 1)
    bad = manifest("sum(x)").replace('expr = "sum(x)"', 'expr = "sum(x)"\nshape = ["M", "N"]')
    e = refuse(bad)
    assert fields(e) == ["outputs.y.shape"]
    assert "(M,)" in str(e)


def test_bytes_and_a_bom_are_accepted():
    assert load_manifest(("\ufeff" + manifest()).encode()).name == "op"


# -- the known attacks ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "needle"),
    [
        ("x.tofile('x')", "attribute access"),
        ("x.mT", "attribute access"),
        ("x.T.tofile('x')", "attribute access"),
        ("x.__class__", "attribute access"),
        ("__import__('os').system('id')", "attribute access"),
        ("__import__('os')", "unknown function '__import__'"),
        ("__builtins__", "may not start with '_'"),
        ("_x", "may not start with '_'"),
        ("eval('1')", "unknown function 'eval'"),
        ("open('/etc/passwd')", "unknown function 'open'"),
        ("getattr(x, 'tofile')", "unknown function"),
        ("x[0]", "subscripts"),
        ("lambda: 0", "lambdas"),
        ("[v for v in x]", "comprehensions"),
        ("(v for v in x)", "comprehensions"),
        ("'abc'", "strings"),
        ("f'{x}'", "strings"),
        ("b'abc'", "strings"),
        ("(z := x)", "assignment expressions"),
        ("exp(*x)", "starred"),
        ("sum(x, **{'axis': 0})", "keyword"),
        ("sum(x, dtype=1)", "unexpected keyword"),
        ("exp(x, out=x)", "no keyword"),
        ("x if x else x", "use where"),
        ("x and x", "and/or"),
        ("x @ x", "second-to-last of the right"),
        ("x @ 2", "at least two axes"),
        ("x // 2", "not allowed"),
        ("x % 2", "not allowed"),
        ("~x", "not allowed"),
        ("not x", "not allowed"),
        ("1e999", "too large"),
        ("1e31 * x", "too large"),
        ("10 ** 400", "too large"),
        ("x ** 1000000", "exponent too large"),
        ("x ** x", "exponent of ** must be a constant"),
        ("9" * 1000, "too large"),
        ("x + " * 600 + "x", "longer than"),
        ("exp(" * 45 + "x" + ")" * 45, "nested deeper"),
        ("-" * 100 + "x", "nested deeper"),
        ("x is x", "not allowed"),
        ("x in x", "not allowed"),
        ("x < x < x", "chained"),
        ("import os", "syntax error"),
        ("x; y", "syntax error"),
        ("await x", "not allowed"),
        ("{1: 2}", "dicts"),
        ("(x, x)", "tuples"),
        ("True", "bool constants"),
        ("None", "NoneType constants"),
        ("1j", "complex constants"),
        ("...", "ellipsis constants"),
        ("xx", "unknown name 'xx'"),
        ("exp", "is a function"),
        ("where(x, x, x)", "must be a comparison"),
        ("(x > 0) + 1", "comparison cannot be used"),
        ("x\u00a0+ 1", "printable ASCII"),
        ("\uff58 + 1", "printable ASCII"),
        ("x\x00", "printable ASCII"),
    ],
)
def test_expression_attacks_are_refused_with_a_clear_error(expr, needle):
    text = BASE.replace('"{expr}"', json.dumps(expr))  # a JSON string is a TOML string
    e = refuse(text)
    assert e.errors[0][0] in ("outputs.y.expr", "manifest"), e.errors
    assert needle in str(e), str(e)


def test_huge_declared_shapes_are_refused():
    e = refuse(manifest().replace("M = 64", "M = 2147483647"))
    assert fields(e)[0].startswith("shapes[0]") and "elements" in str(e)
    e = refuse(manifest().replace("M = 64", "M = 99999999999999"))
    assert fields(e) == ["shapes[0].M"]
    e = refuse(manifest().replace("M = 64", "M = 0"))
    assert fields(e) == ["shapes[0].M"]


def test_many_inputs_at_a_modest_shape_are_refused_by_total_bytes():
    extra = "".join(f'[inputs.t{i}]\nshape = ["M", "N"]\ndtype = "int64"\nrange = [0, 2]\n'
                    for i in range(15))  # fmt: skip
    text = manifest(extra=extra).replace("M = 64\nN = 128", "M = 65536\nN = 32768")
    e = refuse(text)
    assert "bytes" in str(e)


def test_binary_and_nul_bytes_in_the_manifest_are_refused():
    for bad in (manifest().encode() + b"\x00", b"\x89PNG\r\n\x1a\n" + b"\x00" * 10,
                manifest().encode().replace(b"op", b"o\xffp"), "name = 'a\x07'"):  # fmt: skip
        e = refuse(bad)
        assert fields(e) == ["manifest"]


def test_an_oversized_manifest_is_refused_before_parsing():
    e = refuse(manifest() + "#" * (70 * 1024))
    assert fields(e) == ["manifest"] and "limit" in str(e)


def test_deeply_nested_toml_is_refused_cleanly():
    e = refuse("a = " + "[" * 5000 + "]" * 5000)
    assert fields(e) == ["manifest"]


# -- mistakes name their field ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (manifest().replace('name = "op"', ""), "name"),
        (manifest().replace('name = "op"', 'name = "a b"'), "name"),
        (manifest().replace('name = "op"', 'name = "op"\ntarget = "sm_75"'), "target"),
        (manifest().replace('name = "op"', 'name = "op"\ncolour = 1'), "colour"),
        (manifest().replace('name = "op"', 'name = "op"\ntags = [1]'), "tags[0]"),
        (manifest().replace('dtype = "bf16"', 'dtype = "fp8"', 1), "inputs.x.dtype"),
        (manifest().replace('["M", "N"]', '["M", 0]'), "inputs.x.shape[1]"),
        (manifest().replace('["M", "N"]', '["M", true]'), "inputs.x.shape[1]"),
        (manifest().replace('["M", "N"]', '["M", "N", "A", "B", "C", "D", "E"]'), "inputs.x.shape"),
        (manifest().replace('["M", "N"]', '["M", "exp"]'), "inputs.x.shape[1]"),
        (
            manifest().replace(
                'dtype = "bf16"\n[outputs', 'dtype = "bf16"\nrange = [4, -4]\n[outputs'
            ),
            "inputs.x.range",
        ),
        (
            manifest().replace(
                'dtype = "bf16"\n[outputs', 'dtype = "bf16"\nrange = [0, inf]\n[outputs'
            ),
            "inputs.x.range",
        ),
        (manifest().replace('dtype = "bf16"\n[[', 'dtype = "int32"\n[['), "outputs.y.dtype"),
        (manifest().replace("[outputs.y]", "[outputs.x]"), "outputs.x"),
        (manifest().replace("[outputs.y]", "[outputs.exp]"), "outputs.exp"),
        (manifest("3.0"), "outputs.y.expr"),
        (manifest("x > 0"), "outputs.y.expr"),
        (manifest().replace('expr = "x * 2"\n', ""), "outputs.y.expr"),
        (manifest().replace("N = 128", "N = 128\nK = 4"), "shapes[0].K"),
        (manifest().replace("N = 128", ""), "shapes[0]"),
        (manifest().replace("[[shapes]]\nM = 64\nN = 128", ""), "shapes"),
        (manifest(extra="[[shapes]]\nM = 64\nN = 128\n"), "shapes[1]"),
        (manifest(extra="[tolerance.bf16]\nrel_norm = 1.0\n"), "tolerance.bf16.rel_norm"),
        (manifest(extra="[tolerance.bf16]\nrel_norm = 0.0\n"), "tolerance.bf16.rel_norm"),
        (manifest(extra="[tolerance.bf16]\nslack = 1\n"), "tolerance.bf16.slack"),
        (manifest(extra="[tolerance.int8]\nrel_norm = 0.1\n"), "tolerance.int8"),
        (manifest(extra="[constants]\nc = 1e300\n"), "constants.c"),
        (manifest(extra="[constants]\nx = 1\n"), "constants.x"),
        (manifest(extra='[let]\nexp = "x"\n'), "let.exp"),
        (manifest(extra='[let]\na = "b"\nb = "x"\n'), "let.a"),
        (manifest("log(x - 10)"), "outputs.y.expr"),
        (manifest("x * M"), "outputs.y.expr"),
    ],
)
def test_each_mistake_names_its_field(text, field):
    e = refuse(text)
    assert field in fields(e), e.errors


def test_every_error_is_reported_at_once():
    text = manifest("x.y").replace('name = "op"', 'name = 5\ntarget = "sm_1"')
    text = text.replace("N = 128", "N = 0") + "[tolerance.bf16]\natol = -1\n"
    e = refuse(text)
    assert set(fields(e)) == {"name", "target", "outputs.y.expr", "shapes[0].N",
                              "tolerance.bf16.atol"}  # fmt: skip


def test_mismatched_symbolic_shapes_cannot_broadcast():
    text = manifest("x + z", extra='[inputs.z]\nshape = ["N", "M"]\ndtype = "fp32"\n')
    e = refuse(text)
    assert "cannot broadcast shapes (M, N) and (N, M)" in str(e)


def test_gather_indices_must_be_bounded_by_the_gathered_axis():
    good = manifest(
        "gather(x, t)", extra='[inputs.t]\nshape = ["M"]\ndtype = "int64"\nrange = [0, "N"]\n'
    )
    w = load_manifest(good.replace('dtype = "bf16"\n[[', 'dtype = "fp32"\n[['))
    assert w.outputs[0].shape == ("M",)
    for bad_range in ('[0, "M"]', "[0, 129]", "[-1, 5]"):
        e = refuse(good.replace('[0, "N"]', bad_range))
        assert "inputs.t.range" in fields(e)
    e = refuse(good.replace('range = [0, "N"]\n', ""))
    assert "inputs.t.range" in fields(e)


def test_a_reference_that_is_nan_on_the_declared_ranges_is_refused():
    e = refuse(manifest("sqrt(x)"))
    assert fields(e) == ["outputs.y.expr"] and "NaN" in str(e)
    ok = manifest("sqrt(x)").replace(
        'dtype = "bf16"\n[outputs', 'dtype = "bf16"\nrange = [0.0, 4.0]\n[outputs'
    )
    assert load_manifest(ok)


def test_a_long_chain_of_lets_is_bounded_in_depth_and_never_exponential():
    lets = "".join(f'a{i} = "a{i - 1} + a{i - 1}"\n' for i in range(1, 60))
    text = manifest("a59", extra='[let]\na0 = "x"\n' + lets)
    w = load_manifest(text)  # 60 distinct nodes, 2**59 if expanded as a tree
    assert w.outputs[0].expr.shape == ("M", "N")
    deep = "".join(f'b{i} = "exp(exp(exp(exp(exp(b{i - 1})))))"\n' for i in range(1, 60))
    e = refuse(manifest("b59", extra='[let]\nb0 = "x"\n' + deep))
    assert "deeper than" in str(e)


def test_catalogue_manifests_are_stable_inputs_for_load_manifest():
    w1 = load_manifest(catalogue_manifest("softmax"))
    w2 = load_manifest(catalogue_manifest("softmax").encode())
    assert w1 == w2 and w1.sha256 == w2.sha256
    assert isinstance(w1.outputs[0].expr.b, Reduce)


def test_control_characters_smuggled_in_through_toml_escapes_are_refused():
    e = refuse(manifest().replace('name = "op"', 'name = "op"\ndescription = "a\\u0000b"'))
    assert fields(e) == ["description"]


def test_error_fields_from_customer_keys_are_short_and_printable():
    key = "k\\u0007" + "x" * 500
    e = refuse(manifest().replace('name = "op"', f'name = "op"\n"{key}" = 1'))
    (field,) = fields(e)
    assert len(field) <= 120 and field.isprintable() and field.startswith("k?x")


BIG = "1" + "0" * 400  # TOML integers have no length limit in tomllib; float() of this raises


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("eps = 1e-5", f"eps = {BIG}", "constants.eps"),
        ("range = [-4.0, 4.0]", f"range = [-{BIG}, 4]", "inputs.x.range"),
        ("range = [0.5, 1.5]", "range = [0.5, nan]", "inputs.weight.range"),
        ("eps = 1e-5", "eps = inf", "constants.eps"),
        ("M = 16384", f"M = {BIG}", "shapes[0].M"),
    ],
)
def test_huge_or_non_finite_numbers_are_refused_and_only_the_root_cause_reported(old, new, field):
    text = catalogue_manifest("layernorm").replace(old, new, 1)
    e = refuse(text)
    assert fields(e) == [field]


def test_huge_numbers_in_tolerance_and_kernel_scalars_are_refused():
    e = refuse(manifest(extra=f"[tolerance.bf16]\natol = {BIG}\n"))
    assert fields(e) == ["tolerance.bf16.atol"]


def test_a_broadcast_that_would_build_a_huge_intermediate_is_refused():
    text = """
name = "outer"
[inputs.a]
shape = ["M", 1]
dtype = "fp32"
[inputs.b]
shape = ["N"]
dtype = "fp32"
[outputs.y]
expr = "sum(a * b, axis=-1)"
dtype = "fp32"
[[shapes]]
M = 2000000
N = 2000000
"""
    e = refuse(text)
    assert fields(e) == ["shapes[0]"] and "intermediate or output of shape (M, N)" in str(e)


def test_workload_helpers_and_plain_data_form():
    import json as _json

    w = load_manifest(catalogue_manifest("cross_entropy"))
    assert w.dim_names == ("M", "V")
    assert w.input("target").dtype == "int64" and w.output("loss").dtype == "fp32"
    with pytest.raises(KeyError):
        w.input("nope")
    d = _json.loads(_json.dumps(w.to_dict()))
    assert d["outputs"][0]["expr"] == "lse - gather(logits, target)"
    assert d["inputs"][1]["range"] == [0, "V"] and d["baseline"] is None
    assert d["tolerance"]["fp32"]["rel_norm"] == 1e-5
