"""The chart builders take plain rows and give plotly figures (dicts) that render to a div."""

import json
import time

from portal import charts


def _population(n=2000, generations=10):
    rows = []
    for i in range(n):
        gen = i % generations
        rows.append(
            {
                "generation": gen,
                "runtime_us": None if i % 7 == 0 else 100.0 / (1 + gen) + (i % 13),
                "status": "failed" if i % 7 == 0 else "passed",
                "label": f"c{i}",
            }
        )
    return rows


def test_generation_chart_draws_the_running_best_over_the_population():
    fig = charts.generations_figure(
        [
            {"generation": 0, "runtime_us": 10.0, "status": "passed"},
            {"generation": 0, "runtime_us": 12.0, "status": "passed"},
            {"generation": 1, "runtime_us": 11.0, "status": "passed"},
            {"generation": 2, "runtime_us": 7.0, "status": "passed"},
            {"generation": 2, "runtime_us": None, "status": "compile_error"},
        ]
    )
    population, best, failed = fig["data"]
    assert population["y"] == [10.0, 12.0, 11.0, 7.0]
    # Generation 1 was worse than generation 0, so the best so far stays at 10.
    assert best["x"] == [0, 1, 2] and best["y"] == [10.0, 10.0, 7.0]
    assert failed["x"] == [2]


def test_candidates_in_flight_are_not_drawn_as_failed():
    fig = charts.generations_figure(
        [
            {"generation": 0, "runtime_us": 10.0, "status": "passed"},
            {"generation": 1, "runtime_us": None, "status": "queued"},
            {"generation": 1, "runtime_us": None, "status": "rejected"},
        ]
    )
    population, best, failed = fig["data"]
    assert failed["x"] == [1] and failed["text"] == ["rejected"]


def test_baseline_chart_has_one_bar_series_per_kernel_with_asymmetric_intervals():
    fig = charts.baselines_figure(
        [
            {
                "shape": "N=1",
                "name": "torch_eager",
                "median_us": 20.0,
                "ci_low_us": 19.0,
                "ci_high_us": 22.0,
            },
            {
                "shape": "N=1",
                "name": "candidate",
                "median_us": 10.0,
                "ci_low_us": 9.5,
                "ci_high_us": 10.2,
            },
            {"shape": "N=2", "name": "triton", "median_us": None},
        ]
    )
    names = [t["name"] for t in fig["data"]]
    assert names == ["candidate", "torch_eager"]  # the failed triton row has no bar
    cand = fig["data"][0]
    assert (
        cand["error_y"]["array"] == [0.1999999999999993]
        or abs(cand["error_y"]["array"][0] - 0.2) < 1e-9
    )
    assert cand["error_y"]["arrayminus"] == [0.5]


def test_a_baseline_keeps_its_colour_with_or_without_a_candidate_beside_it():
    rows = [
        {"shape": "N=1", "name": "torch_compile", "median_us": 12.0, "tbps": 2.0},
        {"shape": "N=1", "name": "torch_eager", "median_us": 20.0, "tbps": 1.0},
    ]
    mine = {"shape": "N=1", "name": "candidate", "median_us": 10.0, "tbps": 3.0}
    for figure in (charts.baselines_figure, lambda r: charts.bandwidth_figure(r, 4.0)):
        alone = {t["name"]: t["marker"]["color"] for t in figure(rows)["data"]}
        beside = {t["name"]: t["marker"]["color"] for t in figure(rows + [mine])["data"]}
        assert alone == {"torch_compile": "#d55e00", "torch_eager": "#009e73"}
        assert beside == {**alone, "candidate": charts.CANDIDATE_COLOUR}
    assert charts.baselines_figure(rows)["layout"]["title"]["text"].startswith(
        "Baselines (no verified candidate yet)"
    )
    assert charts.baselines_figure(rows + [mine])["layout"]["title"]["text"].startswith(
        "Candidate against baselines"
    )


def test_bandwidth_chart_divides_by_the_copy_ceiling_and_draws_it():
    fig = charts.bandwidth_figure(
        [{"shape": "N=1", "name": "candidate", "tbps": 3.0}], copy_ceiling_tbps=4.0
    )
    assert fig["data"][0]["y"] == [0.75]
    assert fig["layout"]["shapes"][0]["y0"] == 1.0


def test_bandwidth_chart_without_a_ceiling_shows_raw_bandwidth():
    fig = charts.bandwidth_figure([{"shape": "N=1", "name": "candidate", "tbps": 3.0}], None)
    assert fig["data"][0]["y"] == [3.0]
    assert "shapes" not in fig["layout"]


def test_correctness_chart_separates_heldout_shapes_and_keeps_zero_error_on_a_log_axis():
    fig = charts.correctness_figure(
        [
            {"shape": "N=1", "heldout": False, "rel_err": 0.0, "passed": True},
            {"shape": "N=3", "heldout": True, "rel_err": 1e-4, "passed": True},
        ],
        rel_norm_tolerance=1e-3,
    )
    bench, heldout = fig["data"]
    assert bench["y"] == [1e-12]
    assert heldout["name"] == "held-out shape"
    assert fig["layout"]["shapes"][0]["y0"] == 1e-3


def test_a_figure_renders_to_a_div_without_the_plotly_bundle():
    html = charts.to_div(charts.samples_figure({"N=1": [1.0, 1.1, 0.9]}), div_id="samples")
    assert 'id="samples"' in html
    assert "Plotly.newPlot" in html
    assert len(html) < 20_000  # the 4.8 MB bundle is served once as a static file, not inlined


def test_empty_data_gives_an_empty_figure():
    assert charts.is_empty(charts.generations_figure([]))
    # Candidates still on their way to the GPU and refusals alone: nothing timed, no axis.
    waiting = [{"generation": 0, "runtime_us": None, "status": s} for s in charts.IN_FLIGHT]
    assert charts.is_empty(
        charts.generations_figure(
            waiting + [{"generation": 0, "runtime_us": None, "status": "rejected"}]
        )
    )
    assert not charts.is_empty(charts.samples_figure({"a": [1.0]}))


def test_a_two_thousand_candidate_population_renders_in_a_few_milliseconds():
    rows = _population()
    start = time.perf_counter()
    html = charts.to_div(charts.generations_figure(rows))
    elapsed_ms = (time.perf_counter() - start) * 1000
    assert elapsed_ms < 100, elapsed_ms
    payload = html[html.index("[{") : html.rindex("}]") + 2]
    assert json.loads(payload)[0]["x"]  # the data went through as JSON


def test_a_hostile_name_cannot_close_the_chart_script():
    hostile = "</script><script>alert(1)</script>"
    html = charts.to_div(
        charts.baselines_figure([{"shape": "N=1", "name": hostile, "median_us": 1.0}])
    )
    assert hostile not in html and html.count("</script>") == 1


def test_log_time_axes_are_labelled_at_one_two_and_five():
    fig = charts.generations_figure(
        [{"generation": 0, "runtime_us": v, "status": "passed"} for v in (80.0, 160.0, 1133.0)]
    )
    ticks = fig["layout"]["yaxis"]["tickvals"]
    assert {100.0, 200.0, 500.0, 1000.0} <= set(ticks)
    assert fig["layout"]["yaxis"]["ticktext"][ticks.index(1000.0)] == "1000"


def test_the_cost_model_chart_plots_predicted_against_measured_and_names_the_correlation():
    rows = [
        {"generation": 0, "predicted_us": 5.0, "runtime_us": 10.0},
        {"generation": 1, "predicted_us": float("inf"), "runtime_us": 11.0},
        {"generation": 1, "predicted_us": 7.0, "runtime_us": None},
        {"generation": 1, "predicted_us": 6.0, "runtime_us": 12.0},
    ]
    figure = charts.costmodel_figure(rows, 0.87)
    (trace,) = figure["data"]
    assert trace["x"] == [5.0, 6.0] and trace["y"] == [10.0, 12.0]
    assert "0.87" in figure["layout"]["title"]["text"]
    assert figure["layout"]["xaxis"]["type"] == "log"
