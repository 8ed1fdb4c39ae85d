"""The latency fixes of issue 51, each held by a test that fails without it.

The API's results answer costs the same number of queries whatever the number of candidates
(a deferred column read per candidate made it 2,000 queries for a 2,000-candidate job)."""

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from portal import services
from portal.models import Candidate, Generation, sha256_hex
from tests.portal.conftest import SIMPLE_PTX, make_world_for


def _queries(client, url, key):
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url, HTTP_AUTHORIZATION=f"Bearer {key}").status_code == 200
    return len(ctx.captured_queries)


def test_the_results_answer_does_not_query_per_candidate(
    client, orgs, customer, settings, tmp_path
):
    settings.MEDIA_ROOT = tmp_path / "media"
    job = make_world_for(orgs[0], customer, "acme-many")["job"]
    generation = Generation.objects.get(job=job, index=0)
    key, _ = services.api_token_create(user=customer, name="t")
    url = reverse("api-results", args=[job.code])

    def add(n):
        start = Candidate.objects.count()
        Candidate.objects.bulk_create(
            Candidate(job=job, generation=generation, ptx=SIMPLE_PTX, ptx_sha256=sha256_hex(f"{i}"))
            for i in range(start, start + n)
        )

    add(5)
    few = _queries(client, url, key)
    add(40)
    many = _queries(client, url, key)
    assert many <= few + 2  # not one a candidate (40 more were added)
    body = client.get(url, HTTP_AUTHORIZATION=f"Bearer {key}").json()
    assert len(body["candidate_results"]) == 46


def _count_instances(monkeypatch, model) -> list[int]:
    """Count the model instances Django builds from query rows (Model.from_db)."""
    built = [0]
    original = model.from_db.__func__

    def counting(cls, db, field_names, values):
        built[0] += 1
        return original(cls, db, field_names, values)

    monkeypatch.setattr(model, "from_db", classmethod(counting))
    return built


def test_the_results_csv_is_built_from_plain_rows(
    client, orgs, customer, settings, tmp_path, monkeypatch
):
    """The results spreadsheet of a job reads its candidates and their timings as plain rows:
    no Candidate or TimingResult instance (thousands a job), and neither the PTX nor the raw
    samples in any query."""
    from portal.models import GpuBatch, TimingResult

    settings.MEDIA_ROOT = tmp_path / "media"
    job = make_world_for(orgs[0], customer, "acme-csv")["job"]
    generation = Generation.objects.get(job=job, index=0)
    batch = GpuBatch.objects.create(job=job, generation=generation, status=GpuBatch.RECORDED)
    cands = Candidate.objects.bulk_create(
        Candidate(
            job=job,
            generation=generation,
            ptx=SIMPLE_PTX,
            ptx_sha256=sha256_hex(f"{i}"),
            status=Candidate.PASSED,
            score_us=10.0 + i,
            role="writer",
            backend="offline",
        )
        for i in range(30)
    )
    TimingResult.objects.bulk_create(
        TimingResult(
            candidate=c,
            batch=batch,
            dims_key=f"M={m},N=4096",
            dims={"M": m, "N": 4096},
            median_us=c.score_us * m,
            samples_us=[1.0, 2.0],
        )
        for c in cands
        for m in (1, 8)
    )
    candidates_built = _count_instances(monkeypatch, Candidate)
    timings_built = _count_instances(monkeypatch, TimingResult)
    client.force_login(customer)
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(reverse("web-job-results-csv", args=[job.code]))
    assert response.status_code == 200
    assert candidates_built == [0] and timings_built == [0]
    # (the job itself is read with its best candidate, none here: one row whatever the job)
    reads = [x["sql"] for x in ctx.captured_queries if 'FROM "portal_job"' not in x["sql"]]
    assert not [s for s in reads if '"ptx"' in s or '"samples_us"' in s]
    lines = response.content.decode().splitlines()
    assert len(lines) == 1 + 30 * 2 + 1  # header, two shapes a timed candidate, the untimed one
    fastest = lines[1].split(",")
    assert fastest[0] == str(cands[0].code) and fastest[4] == "10.0"
    assert fastest[5] == "M=1 N=4096" and fastest[6] == "10.0"
    assert lines[2].split(",")[5] == "M=8 N=4096" and lines[2].split(",")[6] == "80.0"


def test_the_results_answer_builds_no_candidate_instances(
    client, orgs, customer, settings, tmp_path, monkeypatch
):
    """The API's results answer lists every candidate from plain rows, not model instances."""
    settings.MEDIA_ROOT = tmp_path / "media"
    job = make_world_for(orgs[0], customer, "acme-rows")["job"]
    generation = Generation.objects.get(job=job, index=0)
    Candidate.objects.bulk_create(
        Candidate(
            job=job, generation=generation, ptx=SIMPLE_PTX, ptx_sha256=sha256_hex(f"{i}"), note="n"
        )
        for i in range(30)
    )
    key, _ = services.api_token_create(user=customer, name="t")
    built = _count_instances(monkeypatch, Candidate)
    body = client.get(
        reverse("api-results", args=[job.code]), HTTP_AUTHORIZATION=f"Bearer {key}"
    ).json()
    assert built == [0]
    assert len(body["candidate_results"]) == 31
    first = body["candidate_results"][0]
    assert set(first) == {
        "candidate",
        "generation",
        "status",
        "reason",
        "score_us",
        "entry",
        "note",
    }
    assert first["generation"] == 0 and body["candidate_results"][-1]["note"] == "n"


def test_model_use_reads_only_candidates_that_used_a_model(
    orgs, customer, settings, tmp_path, monkeypatch
):
    """A job's model use passes job_usage only the candidates with tokens or a cost (a search
    without a model backend has thousands with none), and the totals are theirs."""
    from decimal import Decimal

    import factory.agents.usage as usage
    from portal import selectors as q

    settings.MEDIA_ROOT = tmp_path / "media"
    job = make_world_for(orgs[0], customer, "acme-usage")["job"]
    generation = Generation.objects.get(job=job, index=0)
    Candidate.objects.bulk_create(
        Candidate(
            job=job,
            generation=generation,
            ptx=SIMPLE_PTX,
            ptx_sha256=sha256_hex(f"{i}"),
            tokens_in=100 if i == 0 else 0,
            cost_usd=Decimal("0.5") if i == 1 else 0,
        )
        for i in range(20)
    )
    seen = []
    real = usage.job_usage

    def spy(items, generations=None):
        items = list(items)
        seen.append(len(items))
        return real(items, generations)

    monkeypatch.setattr(usage, "job_usage", spy)
    out = q.job_model_usage(job)
    assert seen == [2]
    assert out["tokens_in"] == 100 and out["cost_usd"] == 0.5 and out["candidates"] == 2


def test_the_evidence_view_is_computed_once_per_evidence_version(
    orgs, customer, settings, tmp_path
):
    """The evidence page's view of a family is served from the cache while no evidence was
    added (four small queries to check), and computed again once a candidate is added."""
    from portal import selectors as q
    from portal.models import Workload

    settings.MEDIA_ROOT = tmp_path / "media"
    world = make_world_for(orgs[0], customer, "acme-evidence")
    Workload.objects.filter(pk=world["workload"].pk).update(family="softmax")
    job = world["job"]
    args = {"family": "softmax", "gpu": job.target_gpu, "dtype": None, "shape_class": None}
    first = q.evidence_view(**args)
    with CaptureQueriesContext(connection) as ctx:
        again = q.evidence_view(**args)
    assert len(ctx.captured_queries) == 4  # evidence_version's maxima, nothing else
    assert again["records"] == first["records"]
    Candidate.objects.create(
        job=job,
        generation=Generation.objects.get(job=job, index=0),
        ptx=SIMPLE_PTX,
        ptx_sha256=sha256_hex("one more"),
    )
    assert q.evidence_view(**args)["records"] == first["records"] + 1


def test_the_job_charts_are_drawn_once_per_charts_version(orgs, customer, settings, tmp_path):
    """The job page's charts are drawn once and served from the cache while the job's
    charts_version stays (two small queries to check it), and drawn again when a candidate is
    scored."""
    from portal.web import views

    settings.MEDIA_ROOT = tmp_path / "media"
    job = make_world_for(orgs[0], customer, "acme-charts")["job"]
    generation = Generation.objects.get(job=job, index=0)
    Candidate.objects.filter(job=job).update(status=Candidate.PASSED, score_us=12.0)
    first = views._job_charts(job)
    assert first.get("generations")  # the population chart has a point to draw
    with CaptureQueriesContext(connection) as ctx:
        again = views._job_charts(job)
    assert again == first
    assert len(ctx.captured_queries) == 2
    Candidate.objects.create(
        job=job,
        generation=generation,
        ptx=SIMPLE_PTX,
        ptx_sha256=sha256_hex("faster"),
        status=Candidate.PASSED,
        score_us=3.0,
    )
    with CaptureQueriesContext(connection) as ctx:
        redrawn = views._job_charts(job)
    assert len(ctx.captured_queries) > 2  # drawn again, not served from the cache
    assert redrawn.get("generations")


def test_the_results_csv_is_written_once_per_charts_version(
    client, orgs, customer, settings, tmp_path
):
    """The results spreadsheet is written once and served from the cache while the job's
    charts_version stays; a candidate scored since is in the next download."""
    settings.MEDIA_ROOT = tmp_path / "media"
    job = make_world_for(orgs[0], customer, "acme-csv-cache")["job"]
    client.force_login(customer)
    url = reverse("web-job-results-csv", args=[job.code])
    first = client.get(url).content
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).content == first
    assert not [x for x in ctx.captured_queries if 'FROM "portal_timingresult"' in x["sql"]]
    Candidate.objects.create(
        job=job,
        generation=Generation.objects.get(job=job, index=0),
        ptx=SIMPLE_PTX,
        ptx_sha256=sha256_hex("scored"),
        status=Candidate.PASSED,
        score_us=4.5,
    )
    lines = client.get(url).content.decode().splitlines()
    assert len(lines) == len(first.decode().splitlines()) + 1
    assert lines[1].split(",")[4] == "4.5"


def test_job_baselines_reads_measurements_as_plain_rows(
    orgs, customer, settings, tmp_path, monkeypatch
):
    """A job's baselines come from plain rows of their measurements (one a baseline and
    generation, each with a verification document), the latest of each baseline winning."""
    from portal import selectors as q
    from portal.models import Baseline, BaselineMeasurement, GpuBatch

    settings.MEDIA_ROOT = tmp_path / "media"
    job = make_world_for(orgs[0], customer, "acme-baselines")["job"]
    torch = Baseline.objects.create(name="torch_eager", version="2.11", config_sha256="a")
    for index, status in enumerate(("failed", "passed")):
        generation, _ = Generation.objects.get_or_create(job=job, index=index)
        batch = GpuBatch.objects.create(job=job, generation=generation)
        BaselineMeasurement.objects.create(
            baseline=torch,
            job=job,
            batch=batch,
            status=status,
            reason=f"run {status}",
            verification=[{"rel_err": 0.0}] * 50,
        )
    built = _count_instances(monkeypatch, BaselineMeasurement)
    series = q.job_baselines(job)
    assert built == [0]
    assert [(b.name, b.version, b.status, b.reason) for b in series] == [
        ("torch_eager", "2.11", "passed", "run passed")
    ]


def test_the_home_job_list_is_counted_without_its_annotations(client, orgs, customer):
    """The home page counts its job list with a plain COUNT, not over the annotated list (a
    subquery grouping every job's generations)."""
    world = make_world_for(orgs[0], customer, "acme-home")
    client.force_login(customer)
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(reverse("web-home"))
    assert response.status_code == 200
    assert str(world["job"].code)[:8] in response.content.decode()
    counts = [x["sql"] for x in ctx.captured_queries if "COUNT(" in x["sql"].upper()]
    job_counts = [s for s in counts if '"portal_job"' in s and "generation" not in s]
    assert job_counts, counts
    assert not [s for s in counts if "SELECT COUNT(*) FROM (SELECT" in s]


def test_the_results_answers_evidence_is_read_once_per_charts_version(
    client, orgs, customer, settings, tmp_path
):
    """The API's results answer serves its evidence (the candidate lines, the baselines, the
    best kernel's timings) from the cache while the job's charts_version stays, and reads it
    again once a candidate is added; the live part is read every time."""
    settings.MEDIA_ROOT = tmp_path / "media"
    job = make_world_for(orgs[0], customer, "acme-lines")["job"]
    key, _ = services.api_token_create(user=customer, name="t")
    url = reverse("api-results", args=[job.code])
    auth = {"HTTP_AUTHORIZATION": f"Bearer {key}"}
    first = client.get(url, **auth).json()
    with CaptureQueriesContext(connection) as ctx:
        again = client.get(url, **auth).json()
    assert again == first
    reads = [x["sql"] for x in ctx.captured_queries]
    assert not [s for s in reads if 'FROM "portal_candidate"' in s and '."code"' in s]
    assert not [s for s in reads if '"baseline__name"' in s]  # job_baselines
    assert [s for s in reads if 'FROM "portal_gpubatch"' in s]  # the GPU queue, live
    Candidate.objects.create(
        job=job,
        generation=Generation.objects.get(job=job, index=0),
        ptx=SIMPLE_PTX,
        ptx_sha256=sha256_hex("added"),
    )
    lines = client.get(url, **auth).json()["candidate_results"]
    assert len(lines) == len(first["candidate_results"]) + 1


def test_the_review_page_reads_the_best_kernels_timings_twice_at_most(
    client, orgs, customer, engineer, settings, tmp_path
):
    """The review page reads the best kernel's timings (with their raw samples) once for the
    checklist and once for the page, not once more for each thing the page shows."""
    from portal.models import Job

    settings.MEDIA_ROOT = tmp_path / "media"
    world = make_world_for(orgs[0], customer, "acme-review")
    job, best = world["job"], world["candidate"]
    Job.objects.filter(pk=job.pk).update(status=Job.REVIEW, best_candidate=best)
    client.force_login(engineer)
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(reverse("web-review", args=[job.code])).status_code == 200
    reads = [
        x["sql"]
        for x in ctx.captured_queries
        if 'FROM "portal_timingresult"' in x["sql"] and '"samples_us"' in x["sql"]
    ]
    assert len(reads) <= 2, reads
