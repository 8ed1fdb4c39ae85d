"""Plotly figures for the portal, built from plain data (lists of dicts, floats, strings).

Nothing here touches the database: the views gather rows with selectors and hand them over. Each
`*_figure` function returns a figure as a plain dict (plotly's JSON schema), and `to_div` renders
one to an HTML fragment without the plotly.js bundle, which the page loads once from our own
static files. Figures are kept as dicts and rendered without validation because building
`plotly.graph_objects` figures costs tens of milliseconds per chart, which the latency budget of
a page with a 2,000-candidate population cannot afford.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

import plotly.io as pio

# Colours chosen to stay readable for the common forms of colour blindness.
CANDIDATE_COLOUR = "#1f5fbf"
BASELINE_COLOURS = ["#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#7f7f7f", "#000000"]
POPULATION_COLOUR = "rgba(31, 95, 191, 0.35)"
FAILED_COLOUR = "rgba(179, 38, 30, 0.55)"

_LAYOUT = {
    "margin": {"l": 60, "r": 20, "t": 40, "b": 60},
    "height": 360,
    "font": {"family": "system-ui, -apple-system, Segoe UI, DejaVu Sans, sans-serif", "size": 12},
    "paper_bgcolor": "#ffffff",
    "plot_bgcolor": "#ffffff",
    "legend": {"orientation": "h", "y": -0.22},
    "hovermode": "closest",
}
# automargin: the margins grow to hold the tick labels and the axis title, so a long label
# (a six-digit time, a shape over three lines) never runs under the title.
_AXIS = {
    "gridcolor": "#e7eaf0",
    "zerolinecolor": "#c8ced8",
    "linecolor": "#c8ced8",
    "automargin": True,
}


def _layout(title: str, **extra) -> dict:
    layout = {**_LAYOUT, "title": {"text": title, "x": 0.01, "font": {"size": 14}}}
    for axis in ("xaxis", "yaxis"):
        layout[axis] = {**_AXIS, **extra.pop(axis, {})}
    layout.update(extra)
    return layout


def _finite(value) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def shape_label(dims: dict) -> str:
    """A compact, stable label for a shape: ``M=16384 N=4096`` in the manifest's dim order."""
    return " ".join(f"{k}={v}" for k, v in dims.items())


def _tick(label: str) -> str:
    # One dim per line on a category axis, so long shapes never overlap or tilt.
    return label.replace(" ", "<br>")


def _log_ticks(values: list[float]) -> dict:
    """Ticks at 1, 2 and 5 times a power of ten across the data, labelled as plain numbers
    (plotly's own log ticks label the in-between digits alone: "1000, 5, 2")."""
    values = [v for v in values if _finite(v) and v > 0]
    if not values:
        return {}
    lo, hi = min(values), max(values)
    ticks = [
        m * 10.0**k
        for k in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)
        for m in (1, 2, 5)
        if lo / 2.5 <= m * 10.0**k <= hi * 2.5
    ]
    return {"tickvals": ticks, "ticktext": [_plain(t) for t in ticks]}


def _plain(value: float) -> str:
    """A tick label as a plain number: digits grouped by thin spaces from 10 000 up (never
    "1e+06", which :g gives for a million)."""
    if value >= 10_000:
        return f"{value:,.0f}".replace(",", "\u2009")
    return f"{value:g}"


def _generation_axis(gens: list[int]) -> dict:
    """An x axis over whole generations: half a generation of room either side (one generation
    is drawn at its own index, not in the middle of -1 to 1), a tick at each generation up to a
    dozen and at a round step (2, 5, 10, 20, ...) beyond."""
    lo, hi = min(gens), max(gens)
    step = 1
    while (hi - lo) / step > 12:
        step = step * 5 // 2 if str(step)[0] == "2" else step * 2
    return {
        "title": {"text": "generation", "standoff": 8},
        "range": [lo - 0.5, hi + 0.5],
        "tickmode": "linear",
        "tick0": 0,
        "dtick": step,
        "zeroline": False,
    }


# Candidate statuses still on their way to the GPU: neither timed nor failed.
IN_FLIGHT = frozenset({"proposed", "compiled", "queued"})


def generations_figure(population: Iterable[dict]) -> dict:
    """Best time per generation (a line) over the whole population (a scatter).

    Each row: ``generation`` (int), ``runtime_us`` (float or None for candidates that never got a
    time) and ``status`` (``passed``; one of IN_FLIGHT, left out; anything else is shown on hover
    as failed). With no candidate timed the figure is empty. Times
    are a candidate's median at its job's headline shape, so points are comparable.
    """
    xs_ok, ys_ok = [], []
    xs_bad, text_bad = [], []
    best: dict[int, float] = {}
    for row in population:
        gen = int(row["generation"])
        runtime = row.get("runtime_us")
        if row.get("status") == "passed" and _finite(runtime):
            xs_ok.append(gen)
            ys_ok.append(runtime)
            best[gen] = min(best.get(gen, math.inf), runtime)
        elif row.get("status") not in IN_FLIGHT:
            xs_bad.append(gen)
            text_bad.append(str(row.get("status", "unknown")))
    if not ys_ok:
        # Nothing timed yet: no time axis to draw (the page says when the chart appears).
        return {"data": [], "layout": _layout("Time per generation (lower is better)")}
    gens = sorted(best)
    # The running best: what the search had found by the end of each generation.
    running, so_far = [], math.inf
    for gen in gens:
        so_far = min(so_far, best[gen])
        running.append(so_far)
    data = [
        {
            "type": "scatter",
            "mode": "markers",
            "name": "every passing candidate",
            "x": xs_ok,
            "y": ys_ok,
            "marker": {"color": POPULATION_COLOUR, "size": 6},
            "hovertemplate": "gen %{x}<br>%{y:.2f} µs<extra></extra>",
        },
        {
            "type": "scatter",
            "mode": "lines+markers",
            "name": "best so far",
            "x": gens,
            "y": running,
            "line": {"color": CANDIDATE_COLOUR, "width": 3, "shape": "hv"},
            "marker": {"size": 8},
            "hovertemplate": "gen %{x}<br>best %{y:.2f} µs<extra></extra>",
        },
    ]
    if xs_bad:
        # Failed candidates have no time; show them as ticks along the bottom so the failure
        # rate per generation is visible without distorting the time axis.
        floor = min(ys_ok) * 0.9
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": "failed or refused",
                "x": xs_bad,
                "y": [floor] * len(xs_bad),
                "text": text_bad,
                "marker": {"color": FAILED_COLOUR, "symbol": "line-ns-open", "size": 10},
                "hovertemplate": "gen %{x}<br>%{text}<extra></extra>",
            }
        )
    return {
        "data": data,
        "layout": _layout(
            "Time per generation (lower is better)",
            xaxis=_generation_axis(gens + xs_bad),
            # Log scale: a slow outlier must not flatten the spread of the fast ones.
            yaxis={
                "title": {"text": "median runtime (µs)", "standoff": 10},
                "type": "log",
                **_log_ticks(ys_ok),
            },
        ),
    }


def costmodel_figure(rows: Iterable[dict], rho: float | None = None) -> dict:
    """The cost model's predicted time against the measured time, one point per verified
    candidate it ranked, coloured by generation; log axes on both sides; both times summed over
    the benchmarked shapes. Points on a rising line mean the model ranks well.

    Each row: ``generation``, ``predicted_us``, ``runtime_us``.
    """
    rows = [r for r in rows if _finite(r.get("predicted_us")) and _finite(r.get("runtime_us"))]
    xs = [r["predicted_us"] for r in rows]
    ys = [r["runtime_us"] for r in rows]
    title = "Cost model: predicted against measured"
    if rho is not None:
        title += f" (rank correlation {rho:.2f})"
    return {
        "data": [
            {
                "type": "scatter",
                "mode": "markers",
                "name": "verified candidate",
                "x": xs,
                "y": ys,
                "text": [f"gen {r['generation']}" for r in rows],
                "marker": {
                    "color": [r["generation"] for r in rows],
                    "colorscale": "Viridis",
                    "size": 7,
                    # a colour scale only says something once there are several generations
                    "showscale": len({r["generation"] for r in rows}) > 1,
                    "colorbar": {"title": {"text": "gen"}, "thickness": 10, "dtick": 1},
                },
                "hovertemplate": "%{text}<br>predicted %{x:.2f}<br>measured %{y:.2f} µs"
                "<extra></extra>",
            }
        ],
        "layout": _layout(
            title,
            xaxis={
                "title": {"text": "predicted (µs, summed over shapes)"},
                "type": "log",
                **_log_ticks(xs),
            },
            yaxis={
                "title": {"text": "measured (µs, summed over shapes)"},
                "type": "log",
                **_log_ticks(ys),
            },
            showlegend=False,
        ),
    }


def _series_colours(names: list[str]) -> dict[str, str]:
    """The candidate in our colour; each baseline in the palette by its place among the
    baselines, so a baseline keeps its colour whether or not a candidate is drawn beside it."""
    baselines = [n for n in names if n != "candidate"]
    return {
        n: CANDIDATE_COLOUR
        if n == "candidate"
        else BASELINE_COLOURS[baselines.index(n) % len(BASELINE_COLOURS)]
        for n in names
    }


def baselines_figure(rows: Iterable[dict]) -> dict:
    """The final candidate against every baseline, per shape, with confidence intervals.

    Each row: ``shape`` (label), ``name`` (``candidate`` or a baseline's name), ``median_us``,
    ``ci_low_us`` and ``ci_high_us`` (the interval around the median). Rows without a finite
    median are left out (a baseline that failed at a shape has no bar there).
    """
    by_name: dict[str, list[dict]] = defaultdict(list)
    shapes: list[str] = []
    for row in rows:
        if not _finite(row.get("median_us")):
            continue
        by_name[row["name"]].append(row)
        if row["shape"] not in shapes:
            shapes.append(row["shape"])
    names = sorted(by_name, key=lambda n: (n != "candidate", n))
    colours = _series_colours(names)
    data = []
    for name in names:
        points = by_name[name]
        medians = [p["median_us"] for p in points]
        plus = [max(0.0, (p.get("ci_high_us") or p["median_us"]) - p["median_us"]) for p in points]
        minus = [max(0.0, p["median_us"] - (p.get("ci_low_us") or p["median_us"])) for p in points]
        colour = colours[name]
        data.append(
            {
                "type": "bar",
                "name": name,
                "x": [_tick(p["shape"]) for p in points],
                "y": medians,
                "marker": {"color": colour},
                "error_y": {
                    "type": "data",
                    "symmetric": False,
                    "array": plus,
                    "arrayminus": minus,
                    "color": "#333",
                    "thickness": 1.2,
                },
                "hovertemplate": f"{name}<br>%{{x}}<br>%{{y:.2f}} µs<extra></extra>",
            }
        )
    return {
        "data": data,
        "layout": _layout(
            (
                "Candidate against baselines"
                if "candidate" in by_name
                else "Baselines (no verified candidate yet)"
            )
            + " (median, 95% interval; lower is better)",
            barmode="group",
            xaxis={
                "title": {"text": "shape"},
                "categoryorder": "array",
                "categoryarray": [_tick(x) for x in shapes],
            },
            yaxis={"title": {"text": "runtime (µs)"}},
        ),
    }


def bandwidth_figure(rows: Iterable[dict], copy_ceiling_tbps: float | None) -> dict:
    """Achieved memory bandwidth as a fraction of the measured copy ceiling (a roofline view for
    memory-bound operators: 1.0 is as fast as a plain device-to-device copy of the same bytes).

    Each row: ``shape``, ``name``, ``tbps`` (achieved). Without a ceiling the raw TB/s is shown.
    """
    ceiling = copy_ceiling_tbps if _finite(copy_ceiling_tbps) and copy_ceiling_tbps > 0 else None
    by_name: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        if _finite(row.get("tbps")):
            by_name[row["name"]].append(row)
    names = sorted(by_name, key=lambda n: (n != "candidate", n))
    colours = _series_colours(names)
    data = []
    for name in names:
        points = by_name[name]
        ys = [p["tbps"] / ceiling if ceiling else p["tbps"] for p in points]
        colour = colours[name]
        data.append(
            {
                "type": "bar",
                "name": name,
                "x": [_tick(p["shape"]) for p in points],
                "y": ys,
                "customdata": [p["tbps"] for p in points],
                "marker": {"color": colour},
                "hovertemplate": (
                    f"{name}<br>%{{x}}<br>%{{y:.0%}} of copy ceiling"
                    "<br>%{customdata:.2f} TB/s<extra></extra>"
                    if ceiling
                    else f"{name}<br>%{{x}}<br>%{{y:.2f}} TB/s<extra></extra>"
                ),
            }
        )
    layout = _layout(
        (
            f"Bandwidth as a fraction of the measured copy ceiling ({ceiling:.2f} TB/s)"
            if ceiling
            else "Achieved bandwidth (TB/s)"
        ),
        barmode="group",
        xaxis={"title": {"text": "shape"}},
        yaxis=(
            {
                "title": {"text": "fraction of copy ceiling"},
                "tickformat": ".0%",
                "rangemode": "tozero",
            }
            if ceiling
            else {"title": {"text": "TB/s"}}
        ),
    )
    if ceiling:
        layout["shapes"] = [
            {
                "type": "line",
                "xref": "paper",
                "x0": 0,
                "x1": 1,
                "y0": 1.0,
                "y1": 1.0,
                "line": {"color": "#b3261e", "dash": "dash", "width": 1.5},
            }
        ]
        layout["annotations"] = [
            {
                "xref": "paper",
                "x": 1,
                "y": 1.0,
                "xanchor": "right",
                "yanchor": "bottom",
                "text": "copy ceiling",
                "showarrow": False,
                "font": {"color": "#b3261e", "size": 11},
            }
        ]
    return {"data": data, "layout": layout}


def throughput_figure(rows: Iterable[dict], peak_tflops: float | None) -> dict:
    """Achieved arithmetic throughput as a fraction of the card's dense peak (the roofline view
    for compute-bound operators such as matrix products). Each row: ``shape``, ``name``,
    ``tflops``. Without a peak the raw TFLOP/s is shown."""
    peak = peak_tflops if _finite(peak_tflops) and peak_tflops > 0 else None
    by_name: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        if _finite(row.get("tflops")):
            by_name[row["name"]].append(row)
    names = sorted(by_name, key=lambda n: (n != "candidate", n))
    colours = _series_colours(names)
    data = []
    for name in names:
        points = by_name[name]
        data.append(
            {
                "type": "bar",
                "name": name,
                "x": [_tick(p["shape"]) for p in points],
                "y": [p["tflops"] / peak if peak else p["tflops"] for p in points],
                "customdata": [p["tflops"] for p in points],
                "marker": {"color": colours[name]},
                "hovertemplate": (
                    f"{name}<br>%{{x}}<br>%{{y:.0%}} of dense peak"
                    "<br>%{customdata:.0f} TFLOP/s<extra></extra>"
                    if peak
                    else f"{name}<br>%{{x}}<br>%{{y:.0f}} TFLOP/s<extra></extra>"
                ),
            }
        )
    layout = _layout(
        f"Throughput as a fraction of the dense peak ({peak:.0f} TFLOP/s)"
        if peak
        else "Achieved throughput (TFLOP/s)",
        barmode="group",
        xaxis={"title": {"text": "shape"}},
        yaxis=(
            {
                "title": {"text": "fraction of dense peak"},
                "tickformat": ".0%",
                "rangemode": "tozero",
            }
            if peak
            else {"title": {"text": "TFLOP/s"}}
        ),
    )
    if peak:
        layout["shapes"] = [
            {
                "type": "line",
                "xref": "paper",
                "x0": 0,
                "x1": 1,
                "y0": 1.0,
                "y1": 1.0,
                "line": {"color": "#b3261e", "dash": "dash", "width": 1.5},
            }
        ]
    return {"data": data, "layout": layout}


def correctness_figure(rows: Iterable[dict], rel_norm_tolerance: float | None = None) -> dict:
    """Relative error per shape (log scale), benchmarked and held-out shapes told apart, with the
    tolerance drawn as a line. Each row: ``shape``, ``heldout`` (bool), ``rel_err``, ``passed``.
    A zero error is drawn at a floor of 1e-12 so it stays on the log axis."""
    groups = {False: ([], [], []), True: ([], [], [])}
    for row in rows:
        err = row.get("rel_err")
        if not _finite(err):
            continue
        xs, ys, text = groups[bool(row.get("heldout"))]
        xs.append(_tick(row["shape"]))
        ys.append(max(err, 1e-12))
        text.append("passed" if row.get("passed") else "FAILED")
    data = []
    for heldout, (xs, ys, text) in groups.items():
        if not xs:
            continue
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": "held-out shape" if heldout else "benchmarked shape",
                "x": xs,
                "y": ys,
                "text": text,
                "marker": {
                    "size": 11,
                    "symbol": "diamond" if heldout else "circle",
                    "color": "#009e73" if heldout else CANDIDATE_COLOUR,
                },
                "hovertemplate": "%{x}<br>rel err %{y:.2e}<br>%{text}<extra></extra>",
            }
        )
    # Whole decades from the smallest error to the tolerance, so there are always at least two
    # labelled ticks (one tick per decade) around the points.
    errors = [y for _, ys, _ in groups.values() for y in ys]
    top = max(errors + ([rel_norm_tolerance] if _finite(rel_norm_tolerance) else []), default=1.0)
    low = min(errors, default=top / 100)
    yrange = [math.floor(math.log10(low)) - 0.2, math.ceil(math.log10(top)) + 0.2]
    if yrange[1] - yrange[0] < 1.5:
        yrange[0] -= 1
    layout = _layout(
        "Correctness: relative error per shape (lower is better)",
        xaxis={"title": {"text": "shape"}},
        yaxis={
            "title": {"text": "‖out − ref‖ / ‖ref‖"},
            "type": "log",
            "range": yrange,
            "dtick": 1,  # one tick per decade
            "exponentformat": "power",
        },
    )
    if _finite(rel_norm_tolerance):
        layout["shapes"] = [
            {
                "type": "line",
                "xref": "paper",
                "x0": 0,
                "x1": 1,
                "y0": rel_norm_tolerance,
                "y1": rel_norm_tolerance,
                "line": {"color": "#b3261e", "dash": "dash", "width": 1.5},
            }
        ]
        layout["annotations"] = [
            {
                "xref": "paper",
                "x": 1,
                "y": math.log10(rel_norm_tolerance),
                "xanchor": "right",
                "yanchor": "bottom",
                "text": f"tolerance {rel_norm_tolerance:g}",
                "showarrow": False,
                "font": {"color": "#b3261e", "size": 11},
            }
        ]
    return {"data": data, "layout": layout}


def samples_figure(samples_by_shape: dict[str, list[float]]) -> dict:
    """The raw timing samples of one candidate, one box per shape (shows the spread the median
    hides: outliers, bimodal clocks)."""
    data = [
        {
            "type": "box",
            "name": _tick(shape),
            "y": samples,
            "boxpoints": "outliers",
            "marker": {"color": CANDIDATE_COLOUR, "size": 3},
            "hovertemplate": "%{y:.2f} µs<extra></extra>",
        }
        for shape, samples in samples_by_shape.items()
        if samples
    ]
    return {
        "data": data,
        "layout": _layout(
            "Timing samples per shape",
            showlegend=False,
            yaxis={"title": {"text": "runtime (µs)"}},
        ),
    }


def jobs_figure(rows: Iterable[dict]) -> dict:
    """A workload's jobs side by side: each job's best kernel (its score, the geometric mean of
    its times over the shapes), oldest job first, so a job run again shows what it gained.

    Each row: ``job`` (a short label), ``best_us`` (None: nothing verified, left out) and
    ``status``.
    """
    timed = [r for r in rows if _finite(r.get("best_us"))]
    return {
        "data": [
            {
                "type": "bar",
                "name": "best kernel",
                "x": [r["job"] for r in timed],
                "y": [r["best_us"] for r in timed],
                "text": [r["status"] for r in timed],
                "texttemplate": "%{y:.2f} µs<br>%{text}",
                "marker": {"color": CANDIDATE_COLOUR},
                "hovertemplate": "job %{x} (%{text})<br>%{y:.2f} µs<extra></extra>",
            }
        ]
        if timed
        else [],
        "layout": _layout(
            "Best kernel per job (geometric mean over the shapes; lower is better)",
            showlegend=False,
            xaxis={"title": {"text": "job, oldest first"}, "type": "category"},
            yaxis={"title": {"text": "µs"}, "rangemode": "tozero"},
        ),
    }


def is_empty(figure: dict) -> bool:
    return not any(trace.get("x") or trace.get("y") for trace in figure.get("data", []))


def to_div(figure: dict, *, div_id: str | None = None) -> str:
    """Render a figure to an HTML fragment (a div and a script) that expects plotly.js to be
    already loaded by the page. Responsive, without plotly's logo or its cloud buttons."""
    return pio.to_html(
        figure,
        include_plotlyjs=False,
        full_html=False,
        validate=False,
        div_id=div_id,
        default_height="360px",
        config={"displaylogo": False, "responsive": True, "modeBarButtonsToRemove": ["lasso2d"]},
    )
