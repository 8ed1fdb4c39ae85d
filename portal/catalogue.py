"""The catalogue side of the upload form: operator names, sample manifests, and a manifest made
from a catalogue operator with the customer's shapes and dtype.

The catalogue's TOML is parsed with tomllib, the shapes and floating dtypes are replaced, and the
result is written back as TOML by a small writer (the standard library reads TOML but does not
write it). The spec then validates the result like any upload, so a bad combination is reported
by `load_manifest` against the field it concerns.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from functools import lru_cache

FLOAT_DTYPES = ("fp32", "bf16", "fp16")


class CatalogueError(Exception):
    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


@lru_cache(maxsize=1)
def _names() -> tuple[str, ...]:
    try:
        import factory.spec

        if hasattr(factory.spec, "catalogue_names"):
            return tuple(sorted(factory.spec.catalogue_names()))
        return tuple(sorted(factory.spec.load_catalogue()))
    except Exception:  # noqa: BLE001 - the upload page works without the catalogue
        return ()


def names() -> list[str]:
    return list(_names())


def default_sample() -> str | None:
    available = names()
    for preferred in ("softmax", "rmsnorm", "layernorm"):
        if preferred in available:
            return preferred
    return available[0] if available else None


def sample_manifest(name: str) -> str | None:
    if name not in _names():
        return None
    from factory.spec import catalogue_manifest

    return catalogue_manifest(name)


def manifest_for(
    operator: str, shapes: list[dict[str, int]], dtype: str, *, target: str | None = None
) -> str:
    """The catalogue operator's manifest with `shapes` to optimise for (none: its own shapes
    and held-out shapes), every floating tensor in `dtype` but the fp32 statistics that
    `_fp32_statistics` names, and the GPU `target` (None: the
    catalogue's own). Raises CatalogueError(field, message)."""
    text = sample_manifest(operator)
    if text is None:
        raise CatalogueError("operator", f"{operator!r} is not in the catalogue.")
    if dtype not in FLOAT_DTYPES:
        raise CatalogueError("dtype", f"dtype must be one of {', '.join(FLOAT_DTYPES)}.")
    data = tomllib.loads(text)
    kept = _fp32_statistics(data)
    _set_float_dtypes(data, dtype)
    for name in kept:
        data["outputs"][name]["dtype"] = "fp32"
    if target:
        data["target"] = target
    if shapes:
        data["shapes"] = shapes
        # The catalogue's held-out shapes belong to its own example shapes; without them the
        # spec derives held-out shapes from the customer's first shape.
        data.pop("heldout_shapes", None)
    return dumps(data)


@lru_cache(maxsize=1)
def shapes_text() -> dict[str, str]:
    """Each catalogue operator's own shapes as the shape box writes them ("M=16384 N=4096", a
    line each): what a blank box stands for."""
    out = {}
    for name in _names():
        try:
            shapes = tomllib.loads(sample_manifest(name) or "").get("shapes") or []
        except tomllib.TOMLDecodeError:
            continue
        out[name] = "\n".join(" ".join(f"{k}={v}" for k, v in s.items()) for s in shapes)
    return out


def split_by_row_length(
    manifest: str, *, baseline_source: str | None = None, baseline_filename: str | None = None
) -> list[tuple[int, str]]:
    """One manifest per row length of `manifest`'s shapes, as (length, TOML text) in the order the
    lengths first appear; [] when it has one row length or its family splits on nothing. Every
    part keeps
    the held-out shapes. One kernel serves every shape of a job, and no layout that holds a row
    in registers suits rows of 4096 and 8192 alike, so a job per row length finds the fastest
    kernel at each. A manifest with a [baseline] is read with the uploaded kernel it describes;
    each part's name ends in its row length (`softmax_N4096`), so the parts are told apart.

    Raises SpecError when the spec refuses the manifest (the caller shows it), rather than
    dropping the split in silence."""
    from factory import families
    from factory.spec import SpecError, load_manifest

    workload = load_manifest(
        manifest, baseline_source=baseline_source, baseline_filename=baseline_filename
    )
    try:
        fam, ir = families.family_for(workload)
        row_dim = fam.split_dims(ir)[0]  # IndexError where the family splits on nothing
        data = tomllib.loads(manifest)
        groups: dict[int, list[dict]] = {}
        for dims in data["shapes"]:
            groups.setdefault(int(dims[row_dim]), []).append(dims)
    except SpecError:
        raise
    except Exception:  # noqa: BLE001 - a family that splits on nothing: one job for every shape
        return []
    if len(groups) < 2:
        return []
    name = str(data.get("name", "workload"))
    return [
        (n, dumps(data | {"name": f"{name}_{row_dim}{n}"[:64], "shapes": shapes}))
        for n, shapes in groups.items()
    ]


def _fp32_statistics(data: dict) -> list[str]:
    """The outputs the catalogue stores in fp32 beside inputs of a narrower floating type (a
    loss, a log-sum-exp, a bias gradient): these stay fp32 whatever dtype the customer picks, as
    the operator's family may require (attention's log-sum-exp must be fp32)."""
    inputs = [t.get("dtype") for t in (data.get("inputs") or {}).values() if isinstance(t, dict)]
    floats = [d for d in inputs if d in FLOAT_DTYPES]
    if not floats or "fp32" in floats:
        return []
    outputs = data.get("outputs") or {}
    return [n for n, o in outputs.items() if isinstance(o, dict) and o.get("dtype") == "fp32"]


def _set_float_dtypes(node, dtype: str) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "dtype" and isinstance(value, str) and value in FLOAT_DTYPES:
                node[key] = dtype
            else:
                _set_float_dtypes(value, dtype)
    elif isinstance(node, list):
        for item in node:
            _set_float_dtypes(item, dtype)


# --- a small TOML writer ------------------------------------------------------------------------

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key)


def _value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        # JSON's escapes (\n, \", \\, \uXXXX) are all valid in a TOML basic string.
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def _is_table_array(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def dumps(data: dict, _prefix: str = "") -> str:
    """Write a dict (as tomllib reads it) back as TOML: plain keys first, then sub-tables and
    arrays of tables, so the output parses back to the same dict."""
    lines = []
    tables = []
    for key, value in data.items():
        if isinstance(value, dict) and value:
            tables.append((key, value, False))
        elif _is_table_array(value) and key != "shapes" and key != "heldout_shapes":
            tables.append((key, value, True))
        else:
            lines.append(f"{_key(key)} = {_value(value)}")
    out = "\n".join(lines)
    for key, value, is_array in tables:
        name = f"{_prefix}.{_key(key)}" if _prefix else _key(key)
        if is_array:
            for item in value:
                body = dumps(item, name)
                out += f"\n\n[[{name}]]\n{body}" if out else f"[[{name}]]\n{body}"
        else:
            body = dumps(value, name)
            out += f"\n\n[{name}]\n{body}" if out else f"[{name}]\n{body}"
    return out.strip("\n") + ("\n" if not _prefix else "")
