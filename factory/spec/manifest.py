"""`load_manifest`: TOML text in, a validated `Workload` out, or a SpecError listing every
(field, problem) found. Pure: nothing is written, nothing is read but the arguments (compiling a
CUDA C baseline runs NVRTC in a sandboxed subprocess, see `factory.spec.kernels`)."""

from __future__ import annotations

import hashlib
import math
import re
import tomllib

import numpy as np

from factory.spec import kernels
from factory.spec.dims import dim_expr_names
from factory.spec.expr import (
    DTYPE_BYTES,
    DTYPES,
    FLOAT_DTYPES,
    FP8_DTYPES,
    INDEX_DTYPES,
    OUTPUT_DTYPES,
    ArgReduce,
    Attention,
    Const,
    Gather,
    Input,
    MatMul,
    Node,
    Pool,
    Reduce,
    Scan,
    children,
    pooled_dim_name,
    pooled_size,
    walk,
)
from factory.spec.limits import (
    MAX_CONST_ABS,
    MAX_CONSTANTS,
    MAX_DIM,
    MAX_ELEMENTS,
    MAX_GRAPH_DEPTH,
    MAX_GRAPH_NODES,
    MAX_INPUTS,
    MAX_LETS,
    MAX_MANIFEST_BYTES,
    MAX_MATMUL_MACS,
    MAX_NAME_CHARS,
    MAX_OUTPUTS,
    MAX_RANK,
    MAX_SHAPE_ROWS,
    MAX_TAGS,
    MAX_TEXT_CHARS,
    MAX_TOTAL_BYTES,
    SMOKE_TEST_MAX_ELEMENTS,
)
from factory.spec.parse import FUNCTION_NAMES, ExprError, ExprParser, shape_text
from factory.spec.reference import random_inputs, reference
from factory.spec.types import (
    BaselineKernel,
    KernelParam,
    Launch,
    OutputDecl,
    SpecError,
    TensorDecl,
    Tolerance,
    Workload,
)

TARGETS = ("sm_90", "sm_100")
TOP_LEVEL_KEYS = (
    "name", "description", "target", "tags", "inputs", "constants", "let", "outputs", "shapes",
    "heldout_shapes", "tolerance", "baseline",
)  # fmt: skip

# Tolerances per output dtype. A result passes when ||out - ref|| / ||ref|| <= rel_norm and
# |out - ref| <= atol + rtol * |ref| everywhere. rel_norm < 1 means an all-zeros output fails.
DEFAULT_TOLERANCE = {
    "bf16": Tolerance(rel_norm=1e-2, atol=1e-2, rtol=2e-2),  # bf16 keeps 8 bits: 2^-9 = 2e-3
    "fp16": Tolerance(rel_norm=5e-3, atol=1e-3, rtol=5e-3),  # fp16 keeps 11 bits: 2^-12 = 2.4e-4
    "fp32": Tolerance(rel_norm=1e-5, atol=1e-5, rtol=1e-4),
    # fp8 e4m3 keeps 4 bits: half a step is 2^-4 = 6.25% of a normal value, 2^-10 below 2^-6
    "fp8e4m3": Tolerance(rel_norm=5e-2, atol=2e-3, rtol=6.5e-2),
    # argmax/argmin outputs: the index itself, exactly
    "int32": Tolerance(rel_norm=1e-12, atol=0.0, rtol=0.0),
    "int64": Tolerance(rel_norm=1e-12, atol=0.0, rtol=0.0),
}
MAX_REL_NORM = 0.5  # looser than this and a garbage output could pass
MAX_RTOL = 0.5
MAX_ATOL = 1.0

# Random input values the judge draws when a manifest gives no range.
DEFAULT_FLOAT_RANGE = (-4.0, 4.0)
FLOAT_RANGE_LIMIT = {"fp32": 1e30, "bf16": 1e30, "fp16": 60000.0}
INDEX_LIMITS = {"int32": (-(2**31), 2**31), "int64": (-(2**63), 2**63)}

# Held-out batch size for the "small M" row: odd, not a multiple of 8, and small.
HELDOUT_SMALL_BATCH = 37

_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,31}$")
_DIM_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,15}$")
_WORKLOAD_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
_TAG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/+-]{0,63}$")
_PRINTABLE_ONLY = re.compile(r"[^ -~]")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_RESERVED = FUNCTION_NAMES | {"ceildiv", "True", "False", "None"}


class _Errors:
    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []

    def add(self, field: str, problem: str) -> None:
        if len(self.items) < 100:  # a hostile manifest could produce millions
            # Field names can carry customer text (table keys): keep them short and printable.
            field = _PRINTABLE_ONLY.sub("?", field)[:120]
            self.items.append((field, _PRINTABLE_ONLY.sub("?", problem)[:500]))

    def __bool__(self) -> bool:
        return bool(self.items)

    def raise_if_any(self) -> None:
        if self.items:
            raise SpecError(self.items)


def _is_int(v: object) -> bool:
    return type(v) is int  # bool is an int subclass; TOML true must not pass as 1


def _is_number(v: object) -> bool:
    """An int or float that converts to a finite float (TOML integers can be arbitrarily long,
    and float() of a 400-digit int raises)."""
    if type(v) is int:
        return abs(v) <= 10**300
    return type(v) is float and math.isfinite(v)


def _fmt(v: object, limit: int = 40) -> str:
    r = repr(v)
    return r if len(r) <= limit else r[: limit - 3] + "..."


def decode_text(data: str | bytes, field: str, max_bytes: int) -> str:
    """Customer text as str: UTF-8, no NUL or other control bytes but tab/newline/CR, within
    `max_bytes`. Raises SpecError naming `field`."""
    if isinstance(data, bytes | bytearray | memoryview):
        raw = bytes(data)
        if len(raw) > max_bytes:
            raise SpecError([(field, f"is {len(raw)} bytes; the limit is {max_bytes}")])
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise SpecError(
                [(field, f"is not UTF-8 text (bad byte at offset {e.start})")]
            ) from None
    elif isinstance(data, str):
        text = data
        if len(text) > max_bytes or len(text.encode("utf-8", "surrogatepass")) > max_bytes:
            raise SpecError([(field, f"is larger than the limit of {max_bytes} bytes")])
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise SpecError([(field, "contains characters that are not valid UTF-8")]) from None
    else:
        raise SpecError([(field, "must be text")])
    if text.startswith("\ufeff"):
        text = text[1:]
    bad = re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]", text)
    if bad:
        what = "NUL bytes" if bad.group() == "\x00" else "binary control characters"
        line = text.count("\n", 0, bad.start()) + 1
        raise SpecError([(field, f"contains {what} (line {line}); upload plain text")])
    return text


# -- the public entry point -----------------------------------------------------------------------


def load_manifest(
    text: str | bytes,
    *,
    baseline_source: str | bytes | None = None,
    baseline_filename: str | None = None,
) -> Workload:
    """Validate a workload manifest (TOML) and return the Workload.

    `baseline_source` is the uploaded kernel file the manifest's [baseline] table describes
    (PTX, or CUDA C that is compiled to PTX with NVRTC in a sandboxed subprocess). Raises
    SpecError whose `errors` lists (field, problem) pairs; never anything else for bad input."""
    manifest = decode_text(text, "manifest", MAX_MANIFEST_BYTES)
    try:
        data = tomllib.loads(manifest)
    except tomllib.TOMLDecodeError as e:
        raise SpecError([("manifest", f"is not valid TOML: {str(e)[:200]}")]) from None
    except (RecursionError, MemoryError, ValueError):
        raise SpecError([("manifest", "is not valid TOML (nested too deeply)")]) from None
    return _Loader(data, manifest, baseline_source, baseline_filename).load()


class _Loader:
    def __init__(self, data: dict, manifest: str, source, filename) -> None:
        self.data = data
        self.manifest = manifest
        self.baseline_source = source
        self.baseline_filename = filename
        self.err = _Errors()
        self.inputs: dict[str, TensorDecl] = {}
        self.dims: list[str] = []  # in order of first appearance
        self.scope: dict[str, Node] = {}
        self.interner: dict[Node, Node] = {}
        self.gathers: list[tuple[TensorDecl, str | int]] = []  # (index input, gathered axis)
        self.broken: set[str] = set()  # names whose declaration was refused (already reported)
        self.node_shapes: set[tuple] = set()
        self.matmuls: list[MatMul] = []
        self.outputs: list[OutputDecl] = []

    def load(self) -> Workload:
        d, err = self.data, self.err
        for key in d:
            if key not in TOP_LEVEL_KEYS:
                err.add(key, "unknown field (expected one of: " + ", ".join(TOP_LEVEL_KEYS) + ")")

        name = self._string("name", required=True, pattern=_WORKLOAD_NAME_RE)
        description = self._string("description", max_chars=MAX_TEXT_CHARS) or ""
        target = d.get("target", "sm_90")
        if target not in TARGETS:
            err.add("target", f"must be one of {', '.join(TARGETS)}, not {_fmt(target)}")
        tags = self._tags()

        self._inputs()
        self._constants()
        self._lets()
        outputs = self._outputs()
        shapes = self._shape_rows("shapes", d.get("shapes"), required=True)
        heldout_given = "heldout_shapes" in d
        if heldout_given:
            heldout = self._shape_rows("heldout_shapes", d["heldout_shapes"], required=False)
        tolerance = self._tolerance(outputs)
        err.raise_if_any()  # everything below needs well-formed tensors and expressions

        self._check_graph(outputs)
        self._check_gather_indices(outputs)
        if not heldout_given:
            heldout = self._derive_heldout(shapes[0])
        shapes, heldout = _with_pooled_dims(self, outputs, shapes, heldout, heldout_given)
        self._check_rows("shapes", shapes)
        self._check_rows(
            "heldout_shapes (derived)" if not heldout_given else "heldout_shapes", heldout
        )
        err.raise_if_any()

        self._check_index_ranges(shapes, heldout)
        tolerance = _grown_tolerance(self.data.get("tolerance"), tolerance, outputs,
                                     self.inputs.values(), shapes + heldout)  # fmt: skip
        baseline = self._baseline(outputs, shapes + heldout, target)
        err.raise_if_any()

        workload = Workload(
            name=name,
            description=description,
            inputs=tuple(self.inputs.values()),
            outputs=tuple(outputs),
            shapes=tuple(shapes),
            heldout_shapes=tuple(heldout),
            tolerance=tolerance,
            target=target,
            manifest=self.manifest,
            sha256=hashlib.sha256(self.manifest.encode("utf-8")).hexdigest(),
            baseline=baseline,
            tags=tags,
        )
        self._smoke_test(workload)
        err.raise_if_any()
        return workload

    # -- scalar fields ----------------------------------------------------------------------

    def _string(self, field, *, required=False, pattern=None, max_chars=MAX_NAME_CHARS, src=None):
        src = self.data if src is None else src
        key = field.rsplit(".", 1)[-1]
        if key not in src:
            if required:
                self.err.add(field, "is required")
            return None
        v = src[key]
        if not isinstance(v, str):
            self.err.add(field, "must be a string")
            return None
        if len(v) > max_chars:
            self.err.add(field, f"is longer than {max_chars} characters")
            return None
        if _CONTROL.search(v):
            self.err.add(field, "contains control characters")
            return None
        if pattern is not None and not pattern.match(v):
            self.err.add(field, f"{_fmt(v)} is not allowed (letters, digits, '_' or '-')")
            return None
        return v

    def _tags(self) -> tuple[str, ...]:
        tags = self.data.get("tags", [])
        if not isinstance(tags, list):
            self.err.add("tags", "must be a list of strings")
            return ()
        if len(tags) > MAX_TAGS:
            self.err.add("tags", f"at most {MAX_TAGS} tags")
            return ()
        out = []
        for i, t in enumerate(tags):
            if not isinstance(t, str) or not _TAG_RE.match(t):
                self.err.add(f"tags[{i}]", "must be a short string such as 'family:softmax'")
            else:
                out.append(t)
        return tuple(out)

    def _table(self, field: str, limit: int, *, required: bool) -> dict:
        v = self.data.get(field)
        if v is None:
            if required:
                self.err.add(field, "is required")
            return {}
        if not isinstance(v, dict):
            self.err.add(field, "must be a table")
            return {}
        if len(v) > limit:
            self.err.add(field, f"has {len(v)} entries; the limit is {limit}")
            return {}
        return v

    def _new_name(self, field: str, name: str) -> bool:
        if not _NAME_RE.match(name):
            self.err.add(field, "names are a letter then letters, digits or '_' (at most 32)")
        elif name in _RESERVED:
            self.err.add(field, f"{name!r} is a built-in function name")
        elif name in self.scope or name in self.dims:
            self.err.add(field, f"{name!r} is already defined")
        else:
            return True
        return False

    # -- inputs, constants, lets, outputs ---------------------------------------------------------

    def _inputs(self) -> None:
        table = self._table("inputs", MAX_INPUTS, required=True)
        if "inputs" in self.data and not table and isinstance(self.data["inputs"], dict):
            self.err.add("inputs", "declare at least one input tensor")
        # Dim names first, so a tensor name may not shadow a dim declared later.
        for spec in table.values():
            if isinstance(spec, dict) and isinstance(spec.get("shape"), list):
                for d in spec["shape"]:
                    if isinstance(d, str) and _DIM_RE.match(d) and d not in self.dims:
                        self.dims.append(d)
        for name, spec in table.items():
            field = f"inputs.{name}"
            self.broken.add(name)  # until it is accepted below
            if not self._new_name(field, name):
                continue
            if not isinstance(spec, dict):
                self.err.add(field, "must be a table with shape and dtype")
                continue
            for key in spec:
                if key not in ("shape", "dtype", "range"):
                    self.err.add(f"{field}.{key}", "unknown field (shape, dtype, range)")
            shape = self._shape(f"{field}.shape", spec.get("shape"))
            dtype = spec.get("dtype")
            if dtype not in DTYPES:
                self.err.add(f"{field}.dtype", f"must be one of {', '.join(DTYPES)}")
                continue
            if shape is None:
                continue
            low_high = self._range(f"{field}.range", spec.get("range"), dtype)
            if low_high is None:
                continue
            decl = TensorDecl(name, shape, dtype, low_high[0], low_high[1])
            self.inputs[name] = decl
            self.scope[name] = self._make(Input(name, shape, dtype))
            self.broken.discard(name)

    def _make(self, node: Node) -> Node:
        return self.interner.setdefault(node, node)

    def _shape(self, field: str, v: object):
        if not isinstance(v, list):
            self.err.add(field, 'must be a list of dim names or sizes, e.g. ["M", "N"]')
            return None
        if len(v) > MAX_RANK:
            self.err.add(field, f"rank {len(v)} is above the limit of {MAX_RANK}")
            return None
        out = []
        for i, d in enumerate(v):
            if isinstance(d, str):
                if not _DIM_RE.match(d):
                    self.err.add(f"{field}[{i}]", "dim names are a letter then letters/digits")
                    return None
                if d in _RESERVED:
                    self.err.add(f"{field}[{i}]", f"{d!r} is a built-in function name")
                    return None
                out.append(d)
            elif _is_int(d) and 1 <= d <= MAX_DIM:
                out.append(d)
            else:
                self.err.add(f"{field}[{i}]", f"must be a dim name or an integer in 1..{MAX_DIM}")
                return None
        return tuple(out)

    def _range(self, field: str, v: object, dtype: str):
        if dtype in INDEX_DTYPES:
            if v is None:
                self.err.add(field, 'index tensors need a range such as [0, "V"] (high excluded)')
                return None
            if not isinstance(v, list) or len(v) != 2:
                self.err.add(field, "must be [low, high]")
                return None
            low, high = v
            lo_lim, hi_lim = INDEX_LIMITS[dtype]
            if not _is_int(low) or not lo_lim <= low < hi_lim:
                self.err.add(field, f"low must be an integer that fits {dtype}")
                return None
            if isinstance(high, str):
                if high not in self.dims:
                    self.err.add(field, f"high {_fmt(high)} is not a dim of any input")
                    return None
            elif not _is_int(high) or not low < high <= hi_lim:
                self.err.add(field, f"high must be a dim name or an integer above low in {dtype}")
                return None
            return low, high
        if v is None:
            return DEFAULT_FLOAT_RANGE
        if not isinstance(v, list) or len(v) != 2 or not all(_is_number(x) for x in v):
            self.err.add(field, "must be [low, high], two numbers")
            return None
        low, high = float(v[0]), float(v[1])
        limit = FLOAT_RANGE_LIMIT[dtype]
        if not (math.isfinite(low) and math.isfinite(high)) or max(abs(low), abs(high)) > limit:
            self.err.add(field, f"values must be finite and within +-{limit:g} for {dtype}")
            return None
        if not low < high:
            self.err.add(field, "low must be below high")
            return None
        return low, high

    def _constants(self) -> None:
        for name, v in self._table("constants", MAX_CONSTANTS, required=False).items():
            field = f"constants.{name}"
            if not self._new_name(field, name):
                continue
            self.broken.add(name)
            if not _is_number(v) or abs(v) > MAX_CONST_ABS:
                self.err.add(field, f"must be a finite number within +-{MAX_CONST_ABS:g}")
                continue
            self.scope[name] = self._make(Const(float(v)))
            self.broken.discard(name)

    def _lets(self) -> None:
        for name, text in self._table("let", MAX_LETS, required=False).items():
            field = f"let.{name}"
            if not self._new_name(field, name):
                continue
            node = self._parse(field, text)
            if node is not None:
                self.scope[name] = node
            else:
                self.broken.add(name)

    def _parse(self, field: str, text: object) -> Node | None:
        try:
            return ExprParser(self.scope, self.interner).parse(text)
        except ExprError as e:
            if e.unknown_name not in self.broken:  # else the declaration's error says it all
                self.err.add(field, str(e))
            return None

    def _outputs(self) -> list[OutputDecl]:
        out: list[OutputDecl] = []
        table = self._table("outputs", MAX_OUTPUTS, required=True)
        if "outputs" in self.data and not table and isinstance(self.data["outputs"], dict):
            self.err.add("outputs", "declare at least one output")
        for name, spec in table.items():
            field = f"outputs.{name}"
            if not self._new_name(field, name):
                continue
            if not isinstance(spec, dict):
                self.err.add(field, "must be a table with expr and dtype")
                continue
            for key in spec:
                if key not in ("expr", "dtype", "shape"):
                    self.err.add(f"{field}.{key}", "unknown field (expr, dtype, shape)")
            dtype = spec.get("dtype")
            if dtype not in OUTPUT_DTYPES:
                self.err.add(
                    f"{field}.dtype",
                    f"must be one of {', '.join(FLOAT_DTYPES + FP8_DTYPES)} (or "
                    f"{', '.join(INDEX_DTYPES)} for an argmax/argmin)",
                )
            if "expr" not in spec:
                self.err.add(f"{field}.expr", "is required")
                continue
            node = self._parse(f"{field}.expr", spec["expr"])
            if node is None or dtype not in OUTPUT_DTYPES:
                continue
            if dtype in INDEX_DTYPES and not isinstance(node, ArgReduce):
                self.err.add(
                    f"{field}.dtype",
                    f"{dtype} outputs hold an index: the expression must be an argmax/argmin",
                )
                continue
            if node.dtype == "bool":
                self.err.add(f"{field}.expr", "is a comparison; use where(c, 1.0, 0.0)")
                continue
            if not any(isinstance(n, Input) for n in walk(node)):
                self.err.add(f"{field}.expr", "does not depend on any input")
                continue
            if "shape" in spec:
                declared = self._shape(f"{field}.shape", spec["shape"])
                if declared is not None and declared != node.shape:
                    self.err.add(
                        f"{field}.shape",
                        f"is {shape_text(declared)} but the expression gives "
                        f"{shape_text(node.shape)}",
                    )
                    continue
            out.append(OutputDecl(name, node.shape, dtype, node, source=spec["expr"].strip()))
        return out

    def _check_graph(self, outputs: list[OutputDecl]) -> None:
        nodes: list[Node] = []
        seen: set[Node] = set()
        for o in outputs:
            for n in walk(o.expr):
                if n not in seen:
                    seen.add(n)
                    nodes.append(n)
        if len(nodes) > MAX_GRAPH_NODES:
            self.err.add("outputs", f"the operator has {len(nodes)} nodes; limit {MAX_GRAPH_NODES}")
            return
        # Broadcasting can make an intermediate or an output far larger than any input.
        self.node_shapes = {n.shape for n in nodes if not isinstance(n, Input | Const)}
        self.matmuls = [n for n in nodes if isinstance(n, MatMul)]
        self.outputs = outputs
        depth: dict[Node, int] = {}
        for n in nodes:  # operands come before users
            depth[n] = 1 + max((depth[c] for c in children(n)), default=0)
            if depth[n] > MAX_GRAPH_DEPTH:
                self.err.add("let", f"expressions nest deeper than {MAX_GRAPH_DEPTH} in total")
                return

    def _check_gather_indices(self, outputs: list[OutputDecl]) -> None:
        for o in outputs:
            for n in walk(o.expr):
                if not isinstance(n, Gather):
                    continue
                decl = self.inputs[n.idx.name]
                axis = n.x.shape[-1]
                self.gathers.append((decl, axis))
                field = f"inputs.{decl.name}.range"
                if decl.low < 0:
                    self.err.add(field, "gather indices must be >= 0")
                elif isinstance(decl.high, str) and decl.high != axis:
                    self.err.add(field, f"gather indices must stay below {axis}, not {decl.high}")
                elif _is_int(decl.high) and _is_int(axis) and decl.high > axis:
                    self.err.add(field, f"gather indices must stay below {axis}")

    def _check_index_ranges(self, shapes, heldout) -> None:
        # Integer highs against symbolic gather axes, and ranges that end up empty.
        for label, rows in (("shapes", shapes), ("heldout_shapes", heldout)):
            for i, row in enumerate(rows):
                for decl in self.inputs.values():
                    if isinstance(decl.high, str) and row[decl.high] <= decl.low:
                        self.err.add(
                            f"{label}[{i}].{decl.high}",
                            f"leaves inputs.{decl.name}.range empty",
                        )
                for decl, axis in self.gathers:
                    size = row[axis] if isinstance(axis, str) else axis
                    high = row[decl.high] if isinstance(decl.high, str) else decl.high
                    if high > size:
                        self.err.add(
                            f"inputs.{decl.name}.range",
                            f"gather indices up to {high - 1} overflow the gathered axis of "
                            f"size {size} at {label}[{i}]",
                        )

    # -- shapes ----------------------------------------------------------------------------------

    def _shape_rows(self, field: str, rows: object, *, required: bool) -> list[dict[str, int]]:
        if rows is None or rows == []:
            if required:
                self.err.add(field, "give at least one row, e.g. [[shapes]] M = 4096")
            return []
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            self.err.add(field, "must be an array of tables ([[" + field + "]])")
            return []
        if len(rows) > MAX_SHAPE_ROWS:
            self.err.add(field, f"has {len(rows)} rows; the limit is {MAX_SHAPE_ROWS}")
            return []
        out = []
        for i, row in enumerate(rows):
            ok = True
            for k, v in row.items():
                if k not in self.dims:
                    self.err.add(f"{field}[{i}].{k}", "is not a dim of any input")
                    ok = False
                elif not _is_int(v) or not 1 <= v <= MAX_DIM:
                    self.err.add(f"{field}[{i}].{k}", f"must be an integer in 1..{MAX_DIM}")
                    ok = False
            for k in self.dims:
                if k not in row:
                    self.err.add(f"{field}[{i}]", f"gives no size for dim {k}")
                    ok = False
            if ok:
                clean = {k: row[k] for k in self.dims}
                if clean in out:
                    self.err.add(f"{field}[{i}]", "repeats an earlier row")
                else:
                    out.append(clean)
        return out

    def _check_rows(self, field: str, rows: list[dict[str, int]]) -> None:
        decls = list(self.inputs.values())
        for i, row in enumerate(rows):
            total = 0
            for decl in decls:
                n = _elements(decl.shape, row)
                if n > MAX_ELEMENTS:
                    self.err.add(
                        f"{field}[{i}]",
                        f"inputs.{decl.name} would have {n} elements; the limit is {MAX_ELEMENTS}",
                    )
                total += n * DTYPE_BYTES[decl.dtype]
            for o in self.outputs:
                total += _elements(o.shape, row) * DTYPE_BYTES[o.dtype]
            if total > MAX_TOTAL_BYTES:
                self.err.add(
                    f"{field}[{i}]",
                    f"inputs and outputs take {total} bytes; limit {MAX_TOTAL_BYTES}",
                )
            macs = sum(_elements(m.shape, row) * _elements(m.a.shape[-1:], row)
                       for m in self.matmuls)  # fmt: skip
            if macs > MAX_MATMUL_MACS:
                self.err.add(
                    f"{field}[{i}]",
                    f"the matrix products take {macs} multiply-adds; the limit is "
                    f"{MAX_MATMUL_MACS} (2^{int(math.log2(MAX_MATMUL_MACS))})",
                )
            for shape in self.node_shapes:
                n = _elements(shape, row)
                if n > MAX_ELEMENTS:
                    self.err.add(
                        f"{field}[{i}]",
                        f"an intermediate or output of shape {shape_text(shape)} would have {n} "
                        f"elements; the limit is {MAX_ELEMENTS}",
                    )
                    break

    def _derive_heldout(self, row: dict[str, int]) -> list[dict[str, int]]:
        """Two shapes the candidate is never tuned for: a single row with the inner dims shrunk
        to an odd size (N-1), and a few rows with the inner dims grown to an odd size (N+3).
        Batch dims are those that appear before the last axis of some input; the rest are inner
        (row length, vocabulary) dims."""
        attn = [n for o in self.outputs for n in walk(o.expr) if isinstance(n, Attention)]
        if attn:
            return _derive_attention_heldout(row, attn[0])
        matmuls = [n for o in self.outputs for n in walk(o.expr) if isinstance(n, MatMul)]
        if matmuls:
            return _derive_matmul_heldout(row, matmuls)
        batch = {d for t in self.inputs.values() for d in t.shape[:-1] if isinstance(d, str)}
        one, few = {}, {}
        for k, v in row.items():
            if k not in batch:
                one[k] = _odd_below(v)
                few[k] = _odd_above(v)
            else:
                one[k] = 1
                few[k] = HELDOUT_SMALL_BATCH
        rows = [one] if one == few else [one, few]
        return rows

    # -- tolerance ---------------------------------------------------------------------------

    def _tolerance(self, outputs: list[OutputDecl]) -> dict[str, Tolerance]:
        kinds = FLOAT_DTYPES + FP8_DTYPES
        table = self._table("tolerance", len(kinds), required=False)
        result: dict[str, Tolerance] = {}
        for dtype, spec in table.items():
            field = f"tolerance.{dtype}"
            if dtype not in kinds:
                self.err.add(field, f"must be one of {', '.join(kinds)}")
                continue
            if not isinstance(spec, dict):
                self.err.add(field, "must be a table with rel_norm, atol, rtol")
                continue
            base = DEFAULT_TOLERANCE[dtype]
            values = {"rel_norm": base.rel_norm, "atol": base.atol, "rtol": base.rtol}
            limits = {"rel_norm": MAX_REL_NORM, "atol": MAX_ATOL, "rtol": MAX_RTOL}
            ok = True
            for key, v in spec.items():
                if key not in values:
                    self.err.add(f"{field}.{key}", "unknown field (rel_norm, atol, rtol)")
                    ok = False
                elif not _is_number(v):
                    self.err.add(f"{field}.{key}", "must be a number")
                    ok = False
                elif not (0 < v <= limits[key] if key == "rel_norm" else 0 <= v <= limits[key]):
                    self.err.add(f"{field}.{key}", f"must be in (0, {limits[key]}]")
                    ok = False
                else:
                    values[key] = float(v)
            if ok:
                result[dtype] = Tolerance(**values)
        for o in outputs:
            result.setdefault(o.dtype, DEFAULT_TOLERANCE[o.dtype])
        return dict(sorted(result.items()))

    # -- baseline kernel --------------------------------------------------------------------------

    def _baseline(self, outputs, rows, target) -> BaselineKernel | None:
        spec = self.data.get("baseline")
        if spec is None:
            if self.baseline_source is not None:
                self.err.add("baseline", "a kernel file was uploaded but [baseline] is missing")
            return None
        if not isinstance(spec, dict):
            self.err.add("baseline", "must be a table")
            return None
        err = self.err
        for key in spec:
            if key not in ("language", "file", "entry", "params", "launch"):
                err.add(f"baseline.{key}", "unknown field (language, file, entry, params, launch)")
        language = spec.get("language")
        if language not in ("ptx", "cuda"):
            err.add("baseline.language", 'must be "ptx" or "cuda"')
        file = self._string("baseline.file", required=True, max_chars=128, src=spec)
        if file is not None and not re.match(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$", file):
            err.add("baseline.file", "must be a plain file name such as kernel.cu")
        entry = self._string("baseline.entry", required=True, max_chars=256, src=spec)
        if entry is not None and not re.match(r"^[A-Za-z_$][A-Za-z0-9_$]*$", entry):
            err.add("baseline.entry", 'must be the kernel\'s (extern "C") entry name')
            entry = None
        params = self._params(spec.get("params"), outputs)
        launch = self._launch(spec.get("launch"), rows)
        if self.baseline_source is None:
            err.add("baseline.file", "the kernel file was not uploaded")
            return None
        if self.baseline_filename is not None and file is not None:
            if self.baseline_filename != file:
                err.add("baseline.file", f"names {file!r} but the uploaded file is another")
        if err or language is None or entry is None or params is None or launch is None:
            return None
        try:
            source = decode_text(self.baseline_source, "baseline.source", kernels.MAX_SOURCE_BYTES)
            if language == "cuda":
                ptx = kernels.compile_cuda(source, target=target)
            else:
                ptx = source
            info = kernels.check_ptx(ptx, target=target, field="baseline.source")
        except SpecError as e:
            for f, p in e.errors:
                err.add(f, p)
            return None
        kernels.check_entry(info, entry, params, self.err)
        if err:
            return None
        return BaselineKernel(language, source, ptx, entry, params, launch)

    def _params(self, v, outputs) -> tuple[KernelParam, ...] | None:
        field = "baseline.params"
        if not isinstance(v, list) or not all(isinstance(p, dict) for p in v):
            self.err.add(field, "must be an array of tables ([[baseline.params]])")
            return None
        if len(v) > kernels.MAX_PARAMS:
            self.err.add(field, f"at most {kernels.MAX_PARAMS} parameters")
            return None
        tensors = set(self.inputs) | {o.name for o in outputs}
        out = []
        ok = True
        for i, p in enumerate(v):
            f = f"{field}[{i}]"
            for key in p:
                if key not in ("kind", "ptx_type", "name", "value"):
                    self.err.add(f"{f}.{key}", "unknown field (kind, ptx_type, name, value)")
                    ok = False
            kind = p.get("kind")
            defaults = {"tensor": "u64", "dim": "u32", "scalar": "f32"}
            default_type = defaults.get(kind) if isinstance(kind, str) else None
            if default_type is None:
                self.err.add(f"{f}.kind", 'must be "tensor", "dim" or "scalar"')
                ok = False
                continue
            ptx_type = p.get("ptx_type", default_type)
            allowed = kernels.PARAM_TYPES[kind]
            if ptx_type not in allowed:
                self.err.add(f"{f}.ptx_type", f"for a {kind} must be one of {', '.join(allowed)}")
                ok = False
            name = p.get("name", "")
            value = p.get("value", 0.0)
            if not isinstance(name, str):
                self.err.add(f"{f}.name", "must be a string")
                ok = False
            elif kind == "tensor" and name not in tensors:
                self.err.add(f"{f}.name", "must name an input or output tensor")
                ok = False
            elif kind == "dim" and name not in self.dims:
                self.err.add(f"{f}.name", "must name a dim")
                ok = False
            elif kind == "scalar":
                if "name" in p:
                    self.err.add(f"{f}.name", "a scalar has a value, not a name")
                    ok = False
                elif not _is_number(value):
                    self.err.add(f"{f}.value", "must be a finite number")
                    ok = False
            if ok:
                out.append(
                    KernelParam(
                        kind,
                        ptx_type,
                        name if kind != "scalar" else "",
                        float(value) if kind == "scalar" else 0.0,
                    )
                )
        return tuple(out) if ok else None

    def _launch(self, v, rows) -> Launch | None:
        field = "baseline.launch"
        if not isinstance(v, dict):
            self.err.add(field, "is required: grid, block, smem_bytes")
            return None
        for key in v:
            if key not in ("grid", "block", "smem_bytes", "cluster"):
                self.err.add(f"{field}.{key}", "unknown field (grid, block, smem_bytes, cluster)")
        grid = self._triple(f"{field}.grid", v.get("grid"), allow_expr=True)
        block = self._triple(f"{field}.block", v.get("block"), allow_expr=False)
        smem = v.get("smem_bytes", 0)
        if not (_is_int(smem) or isinstance(smem, str)):
            self.err.add(f"{field}.smem_bytes", "must be an integer or shape arithmetic")
            smem = None
        elif isinstance(smem, str):
            try:
                unknown = dim_expr_names(smem) - set(self.dims)
            except SpecError as e:
                self.err.add(f"{field}.smem_bytes", e.errors[0][1])
                smem = None
            else:
                if unknown:
                    self.err.add(f"{field}.smem_bytes", f"unknown dims {sorted(unknown)}")
                    smem = None
        cluster = None
        if "cluster" in v:
            cluster = self._triple(f"{field}.cluster", v["cluster"], allow_expr=False)
            if cluster is None:
                return None
        if grid is None or block is None or smem is None:
            return None
        launch = Launch(grid=grid, block=block, smem_bytes=smem, cluster=cluster)
        for i, row in enumerate(rows):
            for problem in kernels.launch_problems(launch, row):
                self.err.add(field, f"at {_row_text(row)}: {problem}")
                break
            if self.err and i > 3:
                break
        return launch if not self.err else None

    def _triple(self, field, v, *, allow_expr):
        if not isinstance(v, list) or not 1 <= len(v) <= 3:
            self.err.add(field, "must be a list of 1 to 3 entries (x, y, z)")
            return None
        out = []
        for i, e in enumerate(v):
            if _is_int(e):
                if not 1 <= e <= MAX_DIM:
                    self.err.add(f"{field}[{i}]", f"must be in 1..{MAX_DIM}")
                    return None
                out.append(e)
            elif allow_expr and isinstance(e, str):
                try:
                    unknown = dim_expr_names(e) - set(self.dims)
                except SpecError as ex:
                    self.err.add(f"{field}[{i}]", ex.errors[0][1])
                    return None
                if unknown:
                    self.err.add(f"{field}[{i}]", f"unknown dims {sorted(unknown)}")
                    return None
                out.append(e)
            else:
                what = "an integer or shape arithmetic" if allow_expr else "an integer"
                self.err.add(f"{field}[{i}]", f"must be {what}")
                return None
        while len(out) < 3:
            out.append(1)
        return tuple(out)

    # -- a tiny dry run of the reference -----------------------------------------------------

    def _smoke_test(self, w: Workload) -> None:
        """Evaluate the reference once on the smallest held-out shape with the declared input
        ranges: a workload whose reference is NaN or infinite there can never be verified."""
        nodes = {n for o in w.outputs for n in walk(o.expr)}

        def cost(row):  # elements touched by one evaluation: inputs plus every node's result
            return _row_elements(w, row) + sum(
                _elements(n.shape, row) * _matmul_weight(n, row)
                for n in nodes
                if not isinstance(n, Const)
            )

        rows = sorted(w.heldout_shapes + w.shapes, key=cost)
        if not rows or cost(rows[0]) > SMOKE_TEST_MAX_ELEMENTS:
            return  # too big to try at validation time; the GPU worker's checks still apply
        dims = rows[0]
        try:
            with np.errstate(all="ignore"):
                ref = reference(w, random_inputs(w, dims, seed=0), dims)
        except SpecError as e:
            for f, p in e.errors:
                self.err.add(f, p)
            return
        for o in w.outputs:
            if not np.all(np.isfinite(ref[o.name])):
                self.err.add(
                    f"outputs.{o.name}.expr",
                    f"the reference is NaN or infinite at {_row_text(dims)} on inputs drawn from "
                    "the declared ranges (check [inputs.*].range, log/sqrt of negatives, x/0)",
                )


def _elements(shape, row: dict[str, int]) -> int:
    n = 1
    for d in shape:
        n *= row[d] if isinstance(d, str) else d
    return n


def _matmul_weight(n: Node, row: dict[str, int]) -> int:
    """How many elements' worth of work one element of `n` costs the reference: a matmul's
    output element sums K products (numpy's dgemm does about 64 of them in an elementwise op's
    time)."""
    if isinstance(n, Attention):  # each output element sums Skv products, twice
        skv = n.k.shape[2]
        return max(1, (row[skv] if isinstance(skv, str) else skv) // 32)
    if not isinstance(n, MatMul):
        return 1
    k = n.a.shape[-1]
    return max(1, (row[k] if isinstance(k, str) else k) // 64)


def _derive_matmul_heldout(row: dict[str, int], matmuls: list) -> list[dict[str, int]]:
    """Held-out shapes of an operator with a matmul: the summed dims (K) a multiple of 8 but not
    of 64 (a partial last k-block; the tensor memory accelerator needs rows of 16 bytes), the
    output's columns (N) odd, its rows (M) 1 and 37, batch axes 1 and 3."""
    summed = {m.a.shape[-1] for m in matmuls}
    cols = {m.b.shape[-1] for m in matmuls} - summed
    rows = {m.a.shape[-2] for m in matmuls} - summed - cols
    one, few = {}, {}
    for k, v in row.items():
        if k in summed:
            one[k] = max(8, (v - 1) // 8 * 8)
            few[k] = (v // 8 + 1) * 8
        elif k in cols:
            one[k] = _odd_below(v)
            few[k] = _odd_above(v)
        elif k in rows:
            one[k], few[k] = 1, HELDOUT_SMALL_BATCH
        else:
            one[k], few[k] = 1, 3
    return [one] if one == few else [one, few]


def _derive_attention_heldout(row: dict[str, int], n) -> list[dict[str, int]]:
    """Held-out shapes of an attention: the sequence lengths odd (never a multiple of a tile),
    one of them shorter than one 128-row tile, the batch 1 and 2; heads and head dim kept."""
    seq = {d for d in (n.q.shape[2], n.k.shape[2]) if isinstance(d, str)}
    batch = n.q.shape[0]
    one, few = dict(row), dict(row)
    for d in seq:
        one[d] = min(_odd_below(row[d]), 333)
        few[d] = min(_odd_below(row[d]), 77)
    if isinstance(batch, str):
        one[batch], few[batch] = 1, min(2, row[batch])
    return [one] if one == few else [one, few]


def _row_elements(w: Workload, row: dict[str, int]) -> int:
    return sum(_elements(d.shape, row) for d in w.inputs) + sum(
        _elements(o.shape, row) for o in w.outputs
    )


def _row_text(row: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in row.items())


def _odd_below(v: int) -> int:
    """The largest odd number below v (odd is never a multiple of 8), at least 1."""
    return max(1, v - 1 if v % 2 == 0 else v - 2)


def _odd_above(v: int) -> int:
    return v + 3 if v % 2 == 0 else v + 2


# -- tolerances that grow with the reduced length (issue 50) ----------------------------------

_EPS32 = 2.0**-24


def reduced_length(n: Node, row: dict[str, int]) -> int:
    """Elements one result of a Reduce/Scan combines: its axis, times those of the same op
    nested inside it (a reduction over several axes)."""
    if not isinstance(n, Reduce | Scan):
        return 1
    d = n.x.shape[n.axis]
    size = row[d] if isinstance(d, str) else d
    if isinstance(n, Reduce) and isinstance(n.x, Reduce) and n.x.op == n.op:
        return size * reduced_length(n.x, row)
    return size


def _magnitude(node: Node, inputs, default: float) -> float:
    """The largest declared magnitude of the float inputs `node` reads (`default` for none)."""
    names = {n.name for n in walk(node) if isinstance(n, Input)}
    found = [max(abs(t.low), abs(float(t.high))) for t in inputs
             if t.name in names and t.dtype in FLOAT_DTYPES]  # fmt: skip
    return max(found) if found else default


def _grown_tolerance(given, tolerance: dict, outputs, inputs, rows) -> dict:
    """The default tolerance of an output dtype, grown with the longest length L a sum, product
    or scan combines that the row family does not compute (over a leading or middle axis,
    several axes, a product or a scan). fp32 accumulation of L terms within R = the largest
    declared input magnitude: atol eps*R*L for a sum or scan (eps = 2^-24; a blocked sum's
    error is far below that, a sequential one about there), eps*R*sqrt(L) for a mean; rel_norm
    4*eps*sqrt(L); rtol eps*L for products and scans (each step rounds once). A matrix product
    sums K products each within Ra*Rb (the declared magnitudes of its operands): atol eps*Ra*Rb*K,
    rel_norm 4*eps*sqrt(K). Capped at the manifest's limits. Tolerances the manifest gives are
    never changed."""
    given = given if isinstance(given, dict) else {}
    r = max([1.0] + [max(abs(t.low), abs(float(t.high))) for t in inputs
                     if t.dtype in FLOAT_DTYPES])  # fmt: skip
    out = dict(tolerance)
    for o in outputs:
        if o.dtype not in FLOAT_DTYPES or o.dtype in given:
            continue
        atol = rel = rtol = 0.0
        for n in walk(o.expr):
            if isinstance(n, MatMul):  # K products summed in fp32, each within Ra * Rb
                k = n.a.shape[-1]
                length = max(row[k] if isinstance(k, str) else k for row in rows)
                rab = _magnitude(n.a, inputs, r) * _magnitude(n.b, inputs, r)
                atol = max(atol, _EPS32 * rab * length)
                rel = max(rel, 4 * _EPS32 * math.sqrt(length))
                continue
            if not isinstance(n, Reduce | Scan) or n.op in ("max", "min"):
                continue
            new_kind = (
                isinstance(n, Scan)
                or n.op == "prod"
                or n.axis != len(n.x.shape) - 1
                or (isinstance(n.x, Reduce) and n.x.op == n.op)
            )
            if not new_kind:
                continue
            length = max(reduced_length(n, row) for row in rows)
            if n.op == "mean":
                atol = max(atol, _EPS32 * r * math.sqrt(length))
            elif n.op == "sum":
                atol = max(atol, _EPS32 * r * length)
            if n.op == "prod" or isinstance(n, Scan):
                rtol = max(rtol, _EPS32 * length)
            rel = max(rel, 4 * _EPS32 * math.sqrt(length))
        base = out[o.dtype]
        out[o.dtype] = Tolerance(
            rel_norm=min(MAX_REL_NORM, max(base.rel_norm, rel)),
            atol=min(MAX_ATOL, max(base.atol, atol)),
            rtol=min(MAX_RTOL, max(base.rtol, rtol)),
        )
    return out


# -- pooled axes: derived dims in every shape row (issue 50) ------------------------------------


def pooled_dims(outputs) -> dict[str, tuple[str, int, int, int]]:
    """Derived dim name -> (the pooled dim, window, stride, padding), operands first."""
    out: dict[str, tuple[str, int, int, int]] = {}
    for o in outputs:
        for n in walk(o.expr):
            if not isinstance(n, Pool):
                continue
            nd = len(n.window)
            for d, k, st, p in zip(n.x.shape[-nd:], n.window, n.stride, n.padding, strict=True):
                if isinstance(d, str):
                    out[pooled_dim_name(d, k, st, p)] = (d, k, st, p)
    return out


def with_pooled_dims(outputs, row: dict[str, int]) -> dict[str, int]:
    """`row` with the size of every pooled axis's derived dim added."""
    full = dict(row)
    for name, (d, k, st, p) in pooled_dims(outputs).items():
        full[name] = pooled_size(full[d], k, st, p)
    return full


def _with_pooled_dims(loader, outputs, shapes, heldout, heldout_given=True):
    """Shape rows with their pooled axes' sizes; derived held-out rows first widen a pooled
    dim to the window (less the padding) where shrinking it left no window."""
    derived = pooled_dims(outputs)
    if not derived:
        return shapes, heldout
    if not heldout_given:
        widened = []
        for row in heldout:
            row = dict(row)
            for _name, (d, k, _st, p) in derived.items():
                if d in row:
                    row[d] = max(row[d], k - 2 * p)
            if row not in widened:
                widened.append(row)
        heldout = widened
    for name in derived:
        if name in loader.dims:
            loader.err.add("inputs", f"dim {name!r} is also the name of a pooled axis; rename it")
    rows = []
    for label, group in (("shapes", shapes), ("heldout_shapes", heldout)):
        done = []
        for i, row in enumerate(group):
            full = with_pooled_dims(outputs, row)
            for name, (d, k, _st, p) in derived.items():
                if full[name] < 1:
                    loader.err.add(
                        f"{label}[{i}].{d}",
                        f"a pooling window of {k} is wider than {d} = {full[d]} padded by {p}",
                    )
            done.append(full)
        rows.append(done)
    return rows[0], rows[1]
