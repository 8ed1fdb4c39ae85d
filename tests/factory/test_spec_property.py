"""Property tests: thousands of generated and mutated manifests and expressions are thrown at the
validator. Each is accepted (a Workload) or refused (SpecError); nothing else may raise, nothing
may hang, and validation never touches the file system (an audit hook records "open" and "os.*"
events while load_manifest runs)."""

import json
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from factory.spec import SpecError, Workload, catalogue_manifest, catalogue_names, load_manifest

# -- the audit hook ----------------------------------------------------------------------------
# Installed once for the session (hooks cannot be removed); it records only while armed.

_ARMED = False
_EVENTS: list[str] = []
_WATCHED_PREFIXES = ("os.", "shutil.", "subprocess.", "socket.", "ctypes.", "tempfile.")


def _hook(event, args):
    if _ARMED and (event == "open" or event.startswith(_WATCHED_PREFIXES)):
        _EVENTS.append(f"{event} {str(args)[:200]}")


sys.addaudithook(_hook)

SLOW_S = 5.0  # one validation taking this long counts as a hang


def validate(text, **kwargs):
    """Run load_manifest with the hook armed; return the Workload or the SpecError."""
    global _ARMED
    _EVENTS.clear()
    start = time.perf_counter()
    _ARMED = True
    try:
        result = load_manifest(text, **kwargs)
    except SpecError as e:
        result = e
    finally:
        _ARMED = False
    elapsed = time.perf_counter() - start
    assert not _EVENTS, f"validation touched the system: {_EVENTS[:5]}"
    assert elapsed < SLOW_S, f"validation took {elapsed:.1f} s"
    if isinstance(result, SpecError):
        assert result.errors and all(isinstance(f, str) and p for f, p in result.errors)
    else:
        assert isinstance(result, Workload)
    return result


# Warm every lazy import and regex before any hook is armed.
for _name in catalogue_names():
    load_manifest(catalogue_manifest(_name))

# -- expression strings ------------------------------------------------------------------------

# Mostly valid pieces, so that a good share of examples get past the parser into shape checks,
# held-out shapes and the reference dry run; the rest probe the refusals.
NAMES = ["x"] * 6 + ["w"] * 3 + ["c", "t", "l0", "M", "nope", "_x", "__class__", "exp"]
FUNCS1 = ["exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "abs", "f32", "bf16", "f16"]
RED = ["sum", "mean", "max", "min"]
JUNK = list(".[]{}'\"_:=;@%~^&|!?\\#$`,*()<> \n\t") + ["lambda", "import", "__", "1e999", "**9"]


def numbers():
    return st.one_of(
        st.integers(-(10**40), 10**40).map(str),
        st.floats(allow_nan=False, allow_infinity=False, width=64).map(repr),
        st.sampled_from(["0", "1", "0.5", "1e30", "1e31", "-0.0", "1_000", "0x10", "1j", "True"]),
    )


def expressions():
    leaves = st.one_of(st.sampled_from(NAMES), numbers())

    def extend(inner):
        return st.one_of(
            st.tuples(
                inner, st.sampled_from(["+", "-", "*", "/", "+", "*", "**", "<", "==", "//"]), inner
            ).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
            st.tuples(st.sampled_from(FUNCS1), inner).map(lambda t: f"{t[0]}({t[1]})"),
            st.tuples(
                st.sampled_from(RED),
                inner,
                st.sampled_from(
                    [
                        "",
                        ", axis=-1",
                        ", axis=0",
                        ", axis=5",
                        ", keepdims=True",
                        ", axis=-1, keepdims=True",
                        ", keepdims=1",
                        ", dtype=1",
                    ]
                ),
            ).map(lambda t: f"{t[0]}({t[1]}{t[2]})"),  # fmt: skip
            st.tuples(st.sampled_from(["max", "min", "gather"]), inner, inner).map(
                lambda t: f"{t[0]}({t[1]}, {t[2]})"
            ),
            st.tuples(inner, inner, inner).map(lambda t: f"where({t[0]} > 0, {t[1]}, {t[2]})"),
            inner.map(lambda e: f"-{e}"),
        )

    return st.recursive(leaves, extend, max_leaves=12)


@st.composite
def mutated(draw, base):
    """Apply a few random edits: delete, insert junk, repeat a slice, or replace with text."""
    s = draw(base)
    for _ in range(draw(st.integers(0, 4))):
        if not s:
            break
        i = draw(st.integers(0, len(s) - 1))
        j = draw(st.integers(i, min(len(s), i + 12)))
        op = draw(st.integers(0, 3))
        if op == 0:
            s = s[:i] + s[j:]
        elif op == 1:
            s = s[:i] + draw(st.sampled_from(JUNK)) + s[i:]
        elif op == 2:
            s = s[:i] + s[i:j] * draw(st.integers(2, 30)) + s[j:]
        else:
            s = s[:i] + draw(st.text(max_size=6)) + s[j:]
    return s


EXPRESSIONS = expressions()
MUTATED_EXPRESSIONS = mutated(EXPRESSIONS)
ATTACKS = st.tuples(
    EXPRESSIONS,
    st.sampled_from(
        ["{}.tofile('x')", "{}[0]", "{}.__class__", "__import__('os')", "({}).T", "exp({}, out=x)",
         "lambda: {}", "[{} for _ in x]", "{} if x else x", "open('/etc/passwd') + {}"]
    ),
).map(lambda t: t[1].replace("{}", t[0]))  # fmt: skip
ANY_EXPRESSION = st.one_of(EXPRESSIONS, EXPRESSIONS, MUTATED_EXPRESSIONS, ATTACKS)

# -- structured manifests ---------------------------------------------------------------------


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v) if v == v and abs(v) != float("inf") else ("nan" if v != v else "inf")
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def to_toml(d):
    lines = [f"{json.dumps(k)} = {toml_value(v)}" for k, v in d.items()]
    return "\n".join(lines) + "\n"


dims_st = st.sampled_from(["M"] * 4 + ["N"] * 4 + ["V", 1, 4, 0, -1, "exp", "_d", True, 2**40])
dtype_st = st.sampled_from(["bf16"] * 4 + ["fp16", "fp32", "int32", "int64", "fp8", 3])
size_st = st.one_of(
    st.integers(1, 300),
    st.integers(1, 300),
    st.integers(1, 300),
    st.sampled_from([0, -5, 2**31, 2**40, 10**30, True, 1.5]),
)
GOOD_INPUT = {"shape": ["M", "N"], "dtype": "bf16"}


@st.composite
def manifests(draw):
    d = {}
    if draw(st.booleans()) or True:
        d["name"] = draw(st.sampled_from(["op"] * 10 + ["a b", "", "x" * 100, 7]))
    if draw(st.booleans()):
        d["target"] = draw(st.sampled_from(["sm_90", "sm_100", "sm_90", "sm_80", "x"]))
    inputs = {"x": dict(GOOD_INPUT)} if draw(st.integers(0, 3)) else {}
    names = st.sampled_from(["x", "x", "w", "w", "t", "exp", "_x", "M"])
    for name in draw(st.lists(names, max_size=3)):
        spec = {"shape": draw(st.lists(dims_st, max_size=4)), "dtype": draw(dtype_st)}
        if draw(st.booleans()):
            spec["range"] = draw(
                st.lists(st.one_of(st.integers(-10, 10), st.floats(), st.just("N"),
                                   st.integers(-(10**400), 10**400)),
                         max_size=3)
            )  # fmt: skip
        inputs[name] = spec
    d["inputs"] = inputs
    if draw(st.booleans()):
        huge = st.integers(min_value=-(10**400), max_value=10**400)
        d["constants"] = {"c": draw(st.one_of(st.floats(), st.integers(), huge, st.just("x")))}
    if draw(st.booleans()):
        d["let"] = {"l0": draw(EXPRESSIONS)}
    outs = {}
    for name in draw(st.lists(st.sampled_from(["y", "y", "y", "z", "x"]), min_size=1, max_size=3)):
        dtype = draw(st.sampled_from(["bf16", "fp32", "fp16", "int32", "bf16"]))
        spec = {"expr": draw(ANY_EXPRESSION), "dtype": dtype}
        if draw(st.booleans()):
            spec["shape"] = draw(st.lists(dims_st, max_size=3))
        outs[name] = spec
    d["outputs"] = outs
    row = st.one_of(
        st.fixed_dictionaries({"M": size_st, "N": size_st}),
        st.fixed_dictionaries({"M": size_st, "N": size_st}),
        st.dictionaries(st.sampled_from(["M", "N", "V", "K"]), size_st, max_size=4),
    )
    d["shapes"] = draw(st.lists(row, max_size=3))
    if draw(st.booleans()):
        d["heldout_shapes"] = draw(
            st.lists(st.dictionaries(st.sampled_from(["M", "N", "V"]), size_st), max_size=2)
        )
    if draw(st.booleans()):
        d["tolerance"] = {
            draw(st.sampled_from(["bf16", "fp32", "int8"])): {
                draw(st.sampled_from(["rel_norm", "atol", "rtol", "x"])): draw(st.floats(-1, 2))
            }
        }
    if draw(st.booleans()):
        junk = st.one_of(
            st.text(max_size=8),
            st.integers(),
            st.floats(),
            st.booleans(),
            st.lists(st.integers(), max_size=2),
            st.just({"a": 1}),
            st.sampled_from(
                [
                    "x",
                    "y",
                    "M",
                    "N",
                    "tensor",
                    "dim",
                    "scalar",
                    "u32",
                    "u64",
                    "f32",
                    "M * 2",
                    "ceildiv(M, 0)",
                    "__x",
                ]
            ),
        )
        param = st.dictionaries(st.sampled_from(["kind", "name", "value", "ptx_type", "zz"]), junk)
        d["baseline"] = {
            "language": draw(st.sampled_from(["cuda", "ptx", "rust", 3])),
            "file": draw(st.sampled_from(["k.cu", "../k.cu", "/etc/passwd", 1])),
            "entry": draw(st.sampled_from(["k", "bad name", "", 7])),
            "params": draw(st.one_of(st.lists(param, max_size=4), junk)),
            "launch": draw(st.one_of(
                st.fixed_dictionaries({"grid": st.lists(junk, max_size=4),
                                       "block": st.lists(junk, max_size=4)},
                                      optional={"smem_bytes": junk, "cluster": junk}),
                junk)),
        }  # fmt: skip
    if draw(st.booleans()):
        d[draw(st.sampled_from(["tags", "colour", "description"]))] = draw(
            st.one_of(st.lists(st.text(max_size=10), max_size=3), st.text(max_size=20))
        )
    return to_toml(d)


def property_settings(max_examples):
    return settings(
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )


@property_settings(1500)
@given(manifests())
def test_generated_manifests_are_accepted_or_refused_cleanly(text):
    validate(text)


@property_settings(3000)
@given(ANY_EXPRESSION)
def test_generated_expressions_are_accepted_or_refused_cleanly(expr):
    text = (
        'name = "op"\n[inputs.x]\nshape = ["M", "N"]\ndtype = "bf16"\n'
        '[inputs.w]\nshape = ["N"]\ndtype = "fp32"\nrange = [0.5, 1.5]\n'
        '[inputs.t]\nshape = ["M"]\ndtype = "int64"\nrange = [0, "N"]\n'
        "[constants]\nc = 2.0\n"
        f'[outputs.y]\nexpr = {json.dumps(expr)}\ndtype = "fp32"\n'
        "[[shapes]]\nM = 8\nN = 16\n"
    )
    validate(text)


@property_settings(2000)
@given(st.sampled_from(sorted(catalogue_names())).flatmap(
    lambda n: mutated(st.just(catalogue_manifest(n)))))  # fmt: skip
def test_mutated_catalogue_manifests_are_accepted_or_refused_cleanly(text):
    validate(text)


@property_settings(500)
@given(st.binary(max_size=400))
def test_random_bytes_are_refused_cleanly(data):
    validate(data)


_EXAMPLES = Path(__file__).resolve().parents[2] / "factory" / "examples"
_PTX_MANIFEST = (_EXAMPLES / "softmax_ptx.toml").read_text()
_PTX = (_EXAMPLES / "softmax_ptx.ptx").read_text()
validate(_PTX_MANIFEST, baseline_source=_PTX)  # warm-up


@property_settings(500)
@given(mutated(st.just(_PTX)), mutated(st.just(_PTX_MANIFEST)))
def test_mutated_ptx_baselines_are_accepted_or_refused_cleanly(ptx, manifest):
    validate(manifest, baseline_source=ptx)
    validate(_PTX_MANIFEST, baseline_source=ptx)


def test_the_audit_hook_would_notice_file_access():
    global _ARMED
    _EVENTS.clear()
    _ARMED = True
    try:
        open(__file__).close()
    finally:
        _ARMED = False
    assert any(e.startswith("open") for e in _EVENTS)


@pytest.mark.parametrize("name", sorted(catalogue_names()))
def test_catalogue_manifests_validate_without_touching_the_file_system(name):
    assert isinstance(validate(catalogue_manifest(name)), Workload)
