"""The time-per-generation chart: one generation is drawn at its own index (not in the middle of
an axis from -1 to 1), many generations get round tick steps, and the y-axis title never runs
over the tick labels. Checked as data, then as Chromium draws it with our plotly.js."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from portal import charts
from tests.browser.conftest import CHROMIUM, browser  # noqa: F401 - the browser fixture

PLOTLY_JS = Path(__file__).resolve().parents[2] / "static" / "vendor" / "plotly.min.js"


def _rows(generations: int, per_generation: int = 8, slow_us: float = 214_393.46) -> list[dict]:
    # Times like the CPU interpreter's (six digits of µs): the longest tick labels we draw.
    return [
        {
            "generation": g,
            "runtime_us": slow_us / (1 + k) / (1 + 0.1 * g),
            "status": "passed" if k else "failed",
        }
        for g in range(generations)
        for k in range(per_generation)
    ]


def test_one_generation_gets_an_axis_around_it_with_one_tick():
    xaxis = charts.generations_figure(_rows(1))["layout"]["xaxis"]

    assert xaxis["range"] == [-0.5, 0.5]
    assert xaxis["tick0"] == 0 and xaxis["dtick"] == 1


@pytest.mark.parametrize(("generations", "step"), [(3, 1), (13, 1), (30, 5), (200, 20)])
def test_many_generations_get_at_most_a_dozen_round_ticks(generations, step):
    xaxis = charts.generations_figure(_rows(generations, 2))["layout"]["xaxis"]

    assert xaxis["range"] == [-0.5, generations - 0.5]
    assert xaxis["dtick"] == step
    assert (generations - 1) / xaxis["dtick"] <= 12


def test_tick_labels_are_plain_numbers_even_at_a_million():
    fig = charts.generations_figure(_rows(2, slow_us=2_500_000.0))
    text = fig["layout"]["yaxis"]["ticktext"]

    assert "1\u2009000\u2009000" in text
    assert not any("e+" in t for t in text)


def _drawn(browser, figure: dict, width: int) -> dict:  # noqa: F811 - the fixture
    """Draw `figure` with our plotly.js at `width` px; the x range, the x tick labels and the
    boxes of the y title and y tick labels as Chromium laid them out."""
    page = browser.new_page(viewport={"width": width, "height": 600})
    try:
        page.set_content(f'<div id="g" style="width:{width - 20}px"></div>')
        page.add_script_tag(path=str(PLOTLY_JS))
        return page.evaluate(
            """async (fig) => {
                const gd = document.getElementById("g");
                await Plotly.newPlot(gd, fig.data, fig.layout, {displayModeBar: false});
                const box = (e) => { const r = e.getBoundingClientRect();
                    return {left: r.left, right: r.right, top: r.top, bottom: r.bottom}; };
                return {
                    range: gd._fullLayout.xaxis.range,
                    xticks: [...gd.querySelectorAll(".xtick text")].map((e) => e.textContent),
                    title: box(gd.querySelector(".ytitle")),
                    yticks: [...gd.querySelectorAll(".ytick text")].map(box),
                };
            }""",
            json.loads(json.dumps(figure)),
        )
    finally:
        page.close()


@pytest.mark.browser
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is missing")
@pytest.mark.parametrize("width", [1360, 390])
@pytest.mark.parametrize("generations", [1, 40])
def test_the_drawn_chart_has_whole_generations_and_a_clear_y_title(
    browser,  # noqa: F811 - the fixture
    generations,
    width,
):
    drawn = _drawn(browser, charts.generations_figure(_rows(generations)), width)

    assert drawn["range"] == [-0.5, generations - 0.5]
    assert drawn["xticks"][0] == "0" and "−1" not in drawn["xticks"]
    assert all(float(t.replace("−", "-")) == int(t) for t in drawn["xticks"])
    if generations == 1:
        assert drawn["xticks"] == ["0"]
    assert drawn["yticks"]
    # The title (rotated, left of the axis) ends before the first tick label begins.
    assert drawn["title"]["right"] <= min(t["left"] for t in drawn["yticks"])
