"""One schema for results files and GPU task returns (docs/CONTRACTS.md, "Results file").

Everything that records evidence goes through `services.results_record`, which asks `problem()`
before it writes a row: the management command `import_results`, the job page's import form and
the Celery task that records a GPU worker's return. A file is refused whole, with the first bad
field named by its path (`candidates[2].timing[0].median_us: ...`), and nothing is recorded.

What is checked:
- types: every field the portal stores has the type it is stored as (no strings for numbers, no
  null lists, no booleans posing as numbers);
- times: every median is a finite positive number of microseconds, every quantile and sample a
  finite one that is not negative;
- the batch: `batch_id` names a batch we sent, and `candidates` names exactly that batch's
  candidates, each with the sha256 of the PTX it was given (`ptx_sha256`), so a recording of
  other kernels cannot become this job's evidence;
- baselines: every baseline the batch asked for has one record, and no other;
- a candidate or baseline that says `passed` was timed at every benchmarked shape.

`loads()` parses JSON text with bounds (nesting depth, integer digits) so that a hostile file
is a refusal, not a RecursionError.
"""

from __future__ import annotations

import json
import math
import re
import uuid

MAX_DEPTH = 32
MAX_INT_DIGITS = 20
MAX_REASON_CHARS = 100_000
MAX_DIM = 2**62
MAX_DIMS_KEY_CHARS = 190  # the column holds 200, with " heldout" after a held-out shape's key
ENV_MAX_CHARS = {"gpu": 100, "sm": 16, "driver": 50}

CANDIDATE_STATUSES = ("passed", "failed", "compile_error", "crashed", "timeout", "unavailable")
BASELINE_STATUSES = ("passed", "failed", "compile_error", "crashed", "timeout", "unavailable")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class SchemaError(ValueError):
    """A results file that does not fit the schema; the message names the field."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)


# --- Parsing with bounds ------------------------------------------------------------------------


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise SchemaError("", f"an integer of {len(text)} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def depth_problem(value, max_depth: int = MAX_DEPTH) -> str | None:
    """The path where `value` nests deeper than `max_depth` containers, or None. Iterative, so
    it cannot itself run out of stack."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > max_depth:
                return f"JSON nested more than {max_depth} levels deep"
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return None


def loads(data: bytes | str, *, max_depth: int = MAX_DEPTH, allow_nan: bool = True):
    """json.loads with bounds: raises SchemaError (a ValueError) for text that is not UTF-8 or
    not JSON, nests deeper than `max_depth`, holds an integer longer than MAX_INT_DIGITS, or
    (with allow_nan off) NaN or Infinity. Results files may hold NaN: the schema names it."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SchemaError("", f"not UTF-8 text ({exc})") from None

    def _constant(name):
        if not allow_nan:
            raise SchemaError("", f"{name} is not a JSON number")
        return float(name.replace("Infinity", "inf"))

    try:
        value = json.loads(data, parse_int=_bounded_int, parse_constant=_constant)
    except SchemaError:
        raise
    except RecursionError:
        raise SchemaError("", f"JSON nested more than {max_depth} levels deep") from None
    except ValueError as exc:
        raise SchemaError("", f"not JSON ({exc})") from None
    problem = depth_problem(value, max_depth)
    if problem:
        raise SchemaError("", problem)
    return value


# --- Field checks -------------------------------------------------------------------------------


def _is_number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _number(value, field: str, *, positive=False, nonnegative=False, optional=False) -> None:
    if value is None:
        if optional:
            return
        raise SchemaError(field, "missing (a number is required)")
    if not _is_number(value):
        raise SchemaError(field, f"must be a number, not {type(value).__name__}")
    try:
        x = float(value)
    except OverflowError:
        raise SchemaError(field, "is too large") from None
    if not math.isfinite(x):
        raise SchemaError(field, f"must be finite, not {value}")
    if positive and x <= 0:
        raise SchemaError(field, f"must be positive, not {value}")
    if nonnegative and x < 0:
        raise SchemaError(field, f"must not be negative, not {value}")


def _typed(value, kind, field: str, *, optional=False):
    if value is None and optional:
        return
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        wanted = {"dict": "an object", "list": "a list", "str": "a string"}.get(names, names)
        raise SchemaError(field, f"must be {wanted}, not {type(value).__name__}")


def _text(value, field: str, *, optional=True) -> None:
    _typed(value, str, field, optional=optional)
    if isinstance(value, str):
        if len(value) > MAX_REASON_CHARS:
            raise SchemaError(field, f"is longer than {MAX_REASON_CHARS:,} characters")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise SchemaError(field, "holds a lone surrogate (not valid Unicode)") from None


def _dims(value, field: str) -> None:
    _typed(value, dict, field)
    for name, size in value.items():
        _text(name, f"{field} key")
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_DIM:
            raise SchemaError(f"{field}.{name}", f"must be an integer 0..{MAX_DIM}, not {size!r}")
    if len(dims_key(value)) > MAX_DIMS_KEY_CHARS:
        raise SchemaError(field, f"names a shape longer than {MAX_DIMS_KEY_CHARS} characters")


def dims_key(dims: dict) -> str:
    return ",".join(f"{k}={dims[k]}" for k in sorted(dims))


def _timing(t, field: str) -> None:
    _typed(t, dict, field)
    _dims(t.get("dims", {}), f"{field}.dims")
    _number(t.get("median_us"), f"{field}.median_us", positive=True)
    # The worker rounds samples to 4 decimals: a sample (and a quantile of them) may read 0.
    for name in ("p20_us", "p80_us", "ci_low_us", "ci_high_us"):
        _number(t.get(name), f"{field}.{name}", nonnegative=True, optional=True)
    samples = t.get("samples_us", [])
    _typed(samples, list, f"{field}.samples_us", optional=True)
    for i, s in enumerate(samples or []):
        _number(s, f"{field}.samples_us[{i}]", nonnegative=True)
    _number(t.get("tbps"), f"{field}.tbps", nonnegative=True, optional=True)
    # stored in a 64-bit and a 32-bit integer column
    for name, top in (("bytes", 2**63 - 1), ("sm_clock_mhz", 2**31 - 1)):
        value = t.get(name)
        _number(value, f"{field}.{name}", nonnegative=True, optional=True)
        if value is not None and value > top:
            raise SchemaError(f"{field}.{name}", f"must be at most {top}, not {value}")


def _verification(v, field: str) -> None:
    _typed(v, dict, field)
    _dims(v.get("dims", {}), f"{field}.dims")
    for name in ("heldout", "passed"):
        if name in v and not isinstance(v[name], bool):
            raise SchemaError(f"{field}.{name}", f"must be true or false, not {v[name]!r}")
    for name in ("rel_err", "max_abs_err"):
        value = v.get(name)
        if value is None:
            continue
        if not _is_number(value) or math.isnan(float(value)) or float(value) < 0:
            raise SchemaError(f"{field}.{name}", f"must be a non-negative number, not {value!r}")
        if v.get("passed") and not math.isfinite(float(value)):
            raise SchemaError(f"{field}.{name}", "must be finite when the shape passed")
    _text(v.get("reason"), f"{field}.reason")


def _entry_common(entry, field: str, statuses) -> None:
    _typed(entry, dict, field)
    status = entry.get("status")
    if status not in statuses:
        allowed = ", ".join(statuses)
        raise SchemaError(f"{field}.status", f"must be one of {allowed}, not {status!r}")
    _text(entry.get("reason"), f"{field}.reason")
    verification = entry.get("verification", [])
    _typed(verification, list, f"{field}.verification", optional=True)
    for i, v in enumerate(verification or []):
        _verification(v, f"{field}.verification[{i}]")
    timing = entry.get("timing", [])
    _typed(timing, list, f"{field}.timing", optional=True)
    for i, t in enumerate(timing or []):
        _timing(t, f"{field}.timing[{i}]")
    keys = [dims_key(t.get("dims") or {}) for t in timing or []]
    if len(set(keys)) != len(keys):
        raise SchemaError(f"{field}.timing", "times one shape twice")
    flags = entry.get("flags", [])
    _typed(flags, list, f"{field}.flags", optional=True)
    for i, text in enumerate(flags or []):
        _text(text, f"{field}.flags[{i}]", optional=False)
        if len(text.split(":", 1)[0].strip()) > 64:
            raise SchemaError(f"{field}.flags[{i}]", "names a kind (before ':') over 64 characters")


def shape_problems(results) -> None:
    """Check everything that needs no batch; raises SchemaError."""
    _typed(results, dict, "results")
    if results.get("format") != 1 or isinstance(results.get("format"), bool):
        raise SchemaError("format", f"must be 1, not {results.get('format')!r}")
    batch_id = results.get("batch_id")
    try:
        if not isinstance(batch_id, str):
            raise ValueError
        uuid.UUID(batch_id)
    except ValueError:
        raise SchemaError("batch_id", f"must be a batch's UUID, not {batch_id!r}") from None
    env = results.get("env", {})
    _typed(env, dict, "env", optional=True)
    for name in ("gpu", "sm", "driver"):
        value = (env or {}).get(name)
        if value is not None and not isinstance(value, str | int | float):
            raise SchemaError(f"env.{name}", f"must be a string, not {type(value).__name__}")
        if value is not None and len(str(value)) > ENV_MAX_CHARS[name]:
            raise SchemaError(f"env.{name}", f"is longer than {ENV_MAX_CHARS[name]} characters")
    _typed(results.get("timing_protocol"), dict, "timing_protocol", optional=True)
    _number(results.get("copy_ceiling_tbps"), "copy_ceiling_tbps", positive=True, optional=True)
    candidates = results.get("candidates")
    _typed(candidates, list, "candidates")
    for i, entry in enumerate(candidates):
        field = f"candidates[{i}]"
        _entry_common(entry, field, CANDIDATE_STATUSES)
        _text(entry.get("id"), f"{field}.id", optional=False)
        sha = entry.get("ptx_sha256")
        if not isinstance(sha, str) or not _SHA256.match(sha):
            raise SchemaError(
                f"{field}.ptx_sha256", f"must be the sha256 (64 hex digits) of the PTX, not {sha!r}"
            )
        _typed(entry.get("compile"), dict, f"{field}.compile", optional=True)
    baselines = results.get("baselines", [])
    _typed(baselines, list, "baselines")
    for i, entry in enumerate(baselines):
        field = f"baselines[{i}]"
        _entry_common(entry, field, BASELINE_STATUSES)
        _text(entry.get("name"), f"{field}.name", optional=False)
        if len(entry["name"]) > 64:
            raise SchemaError(f"{field}.name", "is longer than 64 characters")
        version = entry.get("version")
        if version is not None and not isinstance(version, str | int | float):
            raise SchemaError(f"{field}.version", "must be a string")
        if version is not None and len(str(version)) > 64:
            raise SchemaError(f"{field}.version", "is longer than 64 characters")
        _typed(entry.get("config"), dict, f"{field}.config", optional=True)


def expected_of(batch) -> dict:
    """What a results file for `batch` (a GpuBatch) must name: candidate id -> sha256 of the PTX
    we hold for it (the database's, not the file's), the baselines asked for (None when the
    batch document names none: a hand-made batch of the tests) and the benchmarked shapes."""
    from portal.models import Candidate

    doc = batch.batch or {}
    ids = [str(c.get("id")) for c in doc.get("candidates", []) if isinstance(c, dict)]
    held = dict(
        Candidate.objects.filter(job_id=batch.job_id, code__in=_uuids(ids)).values_list(
            "code", "ptx_sha256"
        )
    )
    sent = {cid: held.get(uuid.UUID(cid)) if _uuids([cid]) else None for cid in ids}
    asked = doc.get("baselines")
    return {
        "batch_id": str(batch.code),
        "candidates": sent,
        "baselines": None if asked is None else [str(b) for b in asked],
        "shapes": {dims_key(d) for d in doc.get("shapes", [])},
    }


def _uuids(ids):
    out = []
    for cid in ids:
        try:
            out.append(uuid.UUID(cid))
        except ValueError:
            pass
    return out


def batch_problems(results: dict, expected: dict) -> None:
    """Check `results` (already shape-checked) against `expected_of(batch)`."""
    if str(results.get("batch_id")) != expected["batch_id"]:
        raise SchemaError("batch_id", "answers another batch")
    sent = expected["candidates"]
    shapes = expected["shapes"]
    seen = set()
    for i, entry in enumerate(results["candidates"]):
        field = f"candidates[{i}]"
        cid = entry["id"]
        if cid not in sent:
            raise SchemaError(f"{field}.id", f"{cid!r} is not a candidate of this batch")
        if cid in seen:
            raise SchemaError(f"{field}.id", f"{cid!r} is reported twice")
        seen.add(cid)
        if entry["ptx_sha256"] != sent[cid]:
            raise SchemaError(
                f"{field}.ptx_sha256",
                f"does not match the PTX sent for candidate {cid} (a recording of another kernel)",
            )
        _timed_everywhere(entry, field, shapes)
    missing = [cid for cid in sent if cid not in seen]
    if missing:
        raise SchemaError("candidates", f"no record for candidate {missing[0]} of this batch")
    asked = expected["baselines"]
    named = []
    for i, entry in enumerate(results.get("baselines") or []):
        field = f"baselines[{i}]"
        name = entry["name"]
        if asked is not None and name not in asked:
            raise SchemaError(f"{field}.name", f"{name!r} was not asked for by this batch")
        if name in named:
            raise SchemaError(f"{field}.name", f"{name!r} is reported twice")
        named.append(name)
        _timed_everywhere(entry, field, shapes)
    missing = [name for name in asked or [] if name not in named]
    if missing:
        raise SchemaError("baselines", f"no record for baseline {missing[0]!r} of this batch")


def _timed_everywhere(entry: dict, field: str, shapes: set[str]) -> None:
    if entry.get("status") != "passed":
        return
    timed = {dims_key(t.get("dims") or {}) for t in entry.get("timing") or []}
    if timed != shapes:
        lacking = sorted(shapes - timed) or sorted(timed - shapes)
        raise SchemaError(
            f"{field}.timing",
            f"passed but not timed at exactly the batch's shapes ({lacking[0] or 'no dims'})",
        )


def _anywhere(value) -> None:
    """What no stored field may hold, wherever it is (the free-form JSON columns too: a compile
    report, a baseline's config, the environment): NaN or an infinity, which no JSON column
    takes, text that is not valid Unicode, and the NUL character, which PostgreSQL's text and
    jsonb refuse. Iterative; raises SchemaError with the path."""
    stack = [(value, "")]
    while stack:
        item, where = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise SchemaError(where or "results", f"must be finite, not {item}")
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise SchemaError(where or "results", "holds a lone surrogate") from None
            if "\x00" in item:
                raise SchemaError(where or "results", "holds a NUL character")
        elif isinstance(item, dict):
            for key, child in item.items():
                shown = str(key).encode("unicode_escape", "backslashreplace").decode("ascii")
                path = f"{where}.{shown}" if where else shown
                stack.append((key, f"{path} (the key)"))
                stack.append((child, path))
        elif isinstance(item, list):
            stack.extend((child, f"{where}[{i}]") for i, child in enumerate(item))


def check(results, batch=None) -> None:
    """Raise SchemaError naming the first bad field; with `batch` (a GpuBatch), also match the
    results against what was sent."""
    problem = depth_problem(results)
    if problem:
        raise SchemaError("", problem)
    shape_problems(results)
    _anywhere(results)
    if batch is not None:
        batch_problems(results, expected_of(batch))


def problem(results, batch=None) -> str | None:
    """The refusal as one sentence naming the field, or None when the results may be recorded."""
    try:
        check(results, batch)
    except SchemaError as exc:
        return str(exc)
    return None
