"""The portal's pages: plain function views. Every read goes through `portal.selectors`, whose
`get_<thing>_for_user` helpers own the organisation check (other organisations' objects are 404);
every write through `portal.services`."""

from __future__ import annotations

import hashlib
import json
import logging
import zlib

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.cache import cache
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.http import FileResponse, Http404, HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from portal import catalogue, charts, results_schema, services
from portal import selectors as q
from portal.delivery import decide_and_deliver
from portal.demo_example import recording_of
from portal.models import Candidate, Job
from portal.web.forms import EmailForm, RerunForm, ReviewForm, TokenForm, UploadForm

log = logging.getLogger("portal.web")

# HTTP 286 tells htmx to stop polling (and still swap the content it got).
HTMX_STOP_POLLING = 286
# The job page's candidate table: the fastest first, a page at a time (a pager to the rest, and
# the whole list as CSV).
CANDIDATES_PER_PAGE = 25


def _render(request, template: str, context: dict, *, nav: str = "", status: int = 200):
    user = request.user
    base = {
        "nav": nav,
        "is_engineer": q.is_engineer(user),
        "organisation": q.primary_org(user),
        # engineers and organisation admins invite people (portal.accounts)
        "manages_team": q.is_engineer(user) or any(m.is_admin for m in q.memberships(user)),
    }
    return render(request, template, {**base, **context}, status=status)


def engineer_required(view):
    """Engineers only; to anyone else the page does not exist."""

    @login_required
    def wrapped(request, *args, **kwargs):
        if not q.is_engineer(request.user):
            raise Http404("No such page.")
        return view(request, *args, **kwargs)

    wrapped.__name__ = view.__name__
    wrapped.__doc__ = view.__doc__
    return wrapped


# --- home ---------------------------------------------------------------------------------------


# The home page's lists, newest first, a page at a time (a pager to the rest).
JOBS_PER_PAGE = 10
WORKLOADS_PER_PAGE = 10


@login_required
@require_GET
def home(request):
    from portal.selectors import joblist

    user = request.user
    engineer = q.is_engineer(user)
    query = joblist.JobQuery.from_params(request.GET)
    found = joblist.search_jobs(q.job_list(user=user), query, engineer=engineer)
    paginator = Paginator(found, JOBS_PER_PAGE)
    # counted without the list's annotations (a count of the annotated list groups every
    # job's generations in a subquery first)
    paginator.count = joblist.filter_jobs(q.job_list(user=user), query, engineer=engineer).count()
    jobs_page = paginator.get_page(request.GET.get("jobs_page"))
    jobs_page.object_list = joblist.with_vs_best_baseline(jobs_page.object_list)
    joblist.with_shapes_labels(j.workload for j in jobs_page.object_list)
    _with_status_pills(jobs_page.object_list)
    params = request.GET.copy()
    params.pop("jobs_page", None)
    context = {
        "jobs": jobs_page,
        "has_jobs": jobs_page.paginator.count > 0 or q.job_list(user=user).exists(),
        "job_query": query,
        "job_query_string": params.urlencode(),
        "status_choices": [(joblist.STATUS_ACTIVE, "Still searching"), *Job.STATUS_CHOICES],
        "show_choices": [("", "Current"), ("archived", "Archived"), ("all", "All")],
        "here": request.get_full_path(),
    }
    if engineer:
        context["queue"] = list(q.review_queue(user=user)[:20])
        context["waiting_gpu"] = q.jobs_waiting_for_gpu()
    else:
        workloads = q.workload_list(user=user).order_by("-created")
        workload_pages = Paginator(workloads, WORKLOADS_PER_PAGE)
        context["workloads"] = workload_pages.get_page(request.GET.get("page"))
        joblist.with_shapes_labels(context["workloads"].object_list)
        context["decisions"] = q.recent_decisions(user=user)
    return _render(request, "web/home.html", context, nav="home")


def _with_status_pills(jobs) -> None:
    """Set `status_pill` on each job: its status pill's HTML, rendered once per status for the
    whole list (each row shows its pill twice, for wide and narrow screens)."""
    pills: dict[str, str] = {}
    for j in jobs:
        if j.status not in pills:
            pills[j.status] = render_to_string(
                "web/partials/status_pill.html",
                {"status": j.status, "label": j.get_status_display()},
            )
        j.status_pill = pills[j.status]


def _back_to_list(request):
    """Where an archive or restore returns: the list it was pressed on (a local path only)."""
    from django.utils.http import url_has_allowed_host_and_scheme

    target = request.POST.get("next") or ""
    if target and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return redirect(target)
    return redirect("web-home")


@login_required
@require_POST
def job_archive(request, code):
    """Hide a finished job from the default job list (shown under the Archived filter)."""
    from portal import accounts

    j = q.get_job_for_user(request.user, code)
    try:
        accounts.job_archive(user=request.user, job=j)
    except accounts.ArchiveRefused as exc:
        messages.error(request, str(exc))
    else:
        messages.success(
            request,
            f"{j.workload.name} ({str(j.code)[:8]}) archived: find it under Show: Archived.",
        )
    return _back_to_list(request)


@login_required
@require_POST
def job_restore(request, code):
    """Put an archived job back on the default job list."""
    from portal import accounts

    j = q.get_job_for_user(request.user, code)
    accounts.job_restore(user=request.user, job=j)
    messages.success(request, f"{j.workload.name} ({str(j.code)[:8]}) is back on the job list.")
    return _back_to_list(request)


# --- upload -------------------------------------------------------------------------------------


@login_required
@require_http_methods(["GET", "POST"])
def upload(request):
    org = q.primary_org(request.user)
    if org is None:
        raise PermissionDenied("You are not a member of any organisation.")
    names = catalogue.names()
    if request.method == "GET":
        initial = {"mode": UploadForm.MODE_MANIFEST, "per_row_length": True}
        sample = request.GET.get("sample")
        if sample:
            text = catalogue.sample_manifest(sample)
            if text is None:
                raise Http404("No such sample.")
            initial["manifest"] = text
        example = request.GET.get("example")
        if example:
            from portal.web import help as h

            found = h.examples().get(example)
            if found is None:
                raise Http404("No such example.")
            initial["manifest"] = found["manifest"]
            if found["kernel"]:  # its kernel file rides along, as if kept from a try
                initial["kept_baseline"] = UploadForm.sign_kept(found["kernel"])
        form = UploadForm(initial=initial, catalogue_names=names)
        return _render(request, "web/upload.html", _upload_context(form, names), nav="upload")

    form = UploadForm(request.POST, request.FILES, catalogue_names=names)
    if not form.is_valid():
        return _render(
            request, "web/upload.html", _upload_context(form, names), nav="upload", status=400
        )
    data = form.cleaned_data
    if data["mode"] == UploadForm.MODE_CATALOGUE:
        try:
            manifest = catalogue.manifest_for(
                data["operator"], data["shapes"], data["dtype"], target=data.get("target")
            )
        except catalogue.CatalogueError as exc:
            form.add_error(exc.field, exc.message)
            return _render(
                request, "web/upload.html", _upload_context(form, names), nav="upload", status=400
            )
    else:
        manifest = data["manifest_text"]
    baseline = data.get("baseline") or {}
    from factory.spec import SpecError

    try:
        parts = []
        if data.get("per_row_length"):
            parts = catalogue.split_by_row_length(
                manifest,
                baseline_source=baseline.get("source"),
                baseline_filename=baseline.get("filename"),
            )
        jobs = services.submit(
            org=org,
            user=request.user,
            manifests=[t for _, t in parts] or [manifest],
            baseline_source=baseline.get("source"),
            baseline_filename=baseline.get("filename"),
            max_generations=data.get("generations"),
        )
    except SpecError as exc:
        form.add_spec_errors(exc.errors or [("", str(exc))])
        return _render(
            request, "web/upload.html", _upload_context(form, names), nav="upload", status=400
        )
    except ValidationError as exc:
        form.add_error(None, "; ".join(exc.messages))
        return _render(
            request, "web/upload.html", _upload_context(form, names), nav="upload", status=400
        )
    if len(jobs) > 1:
        lengths = ", ".join(str(n) for n, _ in parts)
        messages.success(
            request,
            f"Workload {jobs[0].workload.name} accepted as {len(jobs)} workloads, one per row "
            f"length ({lengths}); the factory has started a job for each.",
        )
        return redirect("web-home")
    messages.success(
        request, f"Workload {jobs[0].workload.name} accepted; the factory has started."
    )
    return redirect("web-job", code=jobs[0].code)


def _upload_context(form, names):
    if form.is_bound and form.errors is not None and not form.is_valid():
        form.keep_for_retry()
    return {
        "form": form,
        "catalogue_names": names,
        "sample_name": catalogue.default_sample(),
        "catalogue_shapes": catalogue.shapes_text(),
    }


# --- workloads and jobs -------------------------------------------------------------------------


@login_required
@require_GET
def workload(request, code):
    wl = q.get_workload_for_user(request.user, code)
    jobs = q.workload_jobs(wl)
    latest = jobs[0] if jobs else None
    progress = q.job_progress(latest) if latest else None
    context = {
        "workload": wl,
        "jobs": jobs,
        "latest": latest,
        "progress": progress,
        "steps": q.stage_steps(latest, progress) if latest else [],
        "spec": q.spec_or_none(wl),
        "row_lengths": wl.row_lengths,
        "default_generations": settings.FACTORY_GENERATIONS,
        "searching": any(j.status in Job.ACTIVE for j in jobs),
    }
    timed = [j for j in reversed(jobs) if j.best_candidate and j.best_candidate.score_us]
    if len(timed) >= 2:  # one job alone has its own page; two or more compare here
        context["jobs_chart"] = charts.to_div(
            charts.jobs_figure(
                {
                    "job": str(j.code)[:8],
                    "best_us": j.best_candidate.score_us,
                    "status": j.get_status_display(),
                }
                for j in timed
            )
        )
    return _render(request, "web/workload.html", context, nav="home")


# How long what is derived from a job per `charts_version` or `results_version` (its charts,
# its candidate table, its results file...) is served before it is worked out again even when
# the word did not move.
JOB_CHARTS_TTL_S = 60


def _version_key(kind: str, job: Job, version: str) -> str:
    """The cache key of something derived from a job per `version` (a word of
    `q.charts_version` or `q.results_version`)."""
    digest = hashlib.sha256(f"{job.code}:{version}".encode()).hexdigest()
    return f"ptxf:{kind}:{digest}"


def _job_charts(job: Job, baselines=None, *, version: str | None = None) -> dict:
    """The job page's charts, drawn once per `results_version` of the job (`version`, when the
    caller has it) and kept in this process's cache (at most JOB_CHARTS_TTL_S seconds): drawing
    reads every candidate and timing of the job, and the page, its chart refreshes and the
    review page all show them; approving the job keeps them."""
    version = q.results_version(job) if version is None else version
    key = _version_key("job-charts", job, version)
    out = cache.get(key)
    if out is None:
        out = _draw_job_charts(job, baselines)
        cache.set(key, out, JOB_CHARTS_TTL_S)
    return out


def _draw_job_charts(job: Job, baselines=None) -> dict:
    """The job page's charts as HTML fragments (None when there is nothing to draw yet);
    `baselines` as `job_baselines` reads them, when the caller has them already."""
    best = job.best_candidate
    baselines = q.job_baselines(job) if baselines is None else baselines
    comparison = q.comparison_rows(best, baselines)
    out = {}
    population = charts.generations_figure(q.population_rows(job))
    out["generations"] = None if charts.is_empty(population) else charts.to_div(population)
    ranked = q.costmodel_rows(job)
    if len(ranked) >= 3:
        out["costmodel"] = charts.to_div(charts.costmodel_figure(ranked, job.model_rho))
    spec = q.spec_or_none(job.workload)
    throughput, peak = q.throughput_rows(spec, job.target_gpu, comparison)
    if peak is not None:
        out["throughput_family"] = True  # the note names throughput, not bandwidth
    if comparison:
        if any(row["name"] != "candidate" for row in comparison):
            out["baselines"] = charts.to_div(charts.baselines_figure(comparison))
        else:  # only our own bars: a chart titled "against baselines" would mislead
            out["baselines_missing"] = True
        if peak is not None:  # compute-bound: TFLOP/s against the dense peak, not TB/s
            if throughput:
                out["throughput"] = charts.to_div(charts.throughput_figure(throughput, peak))
        else:
            figure = charts.bandwidth_figure(comparison, q.copy_ceiling_tbps(job))
            if charts.is_empty(figure):  # no timing carried a byte count: no TB/s to draw
                out["bandwidth_missing"] = True
            else:
                out["bandwidth"] = charts.to_div(figure)
    if best is not None:
        verifications = q.candidate_verifications(best)
        if verifications:
            tol = None
            if spec is not None and spec.tolerance:
                tol = max(t.rel_norm for t in spec.tolerance.values())
            out["correctness"] = charts.to_div(
                charts.correctness_figure(q.correctness_rows(verifications), tol)
            )
    return out


@login_required
@require_GET
def job(request, code):
    return _job_page(request, q.get_job_for_user(request.user, code))


def _candidates_html(request, j: Job, counts: q.JobCounts) -> str:
    """One page of the job's candidate table (best first, CANDIDATES_PER_PAGE a page, the page
    the request asks for), rendered once per `results_version`, page and whether the job is
    still searching, and kept in this process's cache (at most JOB_CHARTS_TTL_S seconds): the
    job page and the table's refreshes show it. Counted from `counts`, read as plain rows: no
    query per row."""
    paginator = Paginator(q.top_candidates(j), CANDIDATES_PER_PAGE)
    paginator.count = counts.candidates  # counted already: no COUNT query
    number = paginator.validate_number(_page_number(request.GET.get("page"), paginator))
    # a stopped job's unsettled candidates read "Not run"
    version = f"{q.results_version(j, counts)}:{j.is_active}"
    key = f"{_version_key('job-candidates', j, version)}:{number}"
    html = cache.get(key)
    if html is None:
        page = paginator.page(number)
        labels = dict(Candidate.STATUS_CHOICES)
        page.object_list = [
            {
                **row,
                "status_label": labels.get(row["status"], row["status"]),
                "settled": row["status"] in Candidate.SETTLED,
            }
            for row in page.object_list
        ]
        html = render_to_string(
            "web/partials/candidates.html", {"job": j, "candidates": page}, request=None
        )
        cache.set(key, html, JOB_CHARTS_TTL_S)
    return mark_safe(html)  # noqa: S308 - rendered by our own template, escaped there


def _page_number(value, paginator: Paginator) -> int:
    """The page a `?page=` parameter asks for, as Paginator.get_page reads it: the first page
    for anything that is not a number, the last for a number past the end."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        return 1
    return min(max(number, 1), max(paginator.num_pages, 1))


def _live_tokens(j: Job, progress: dict) -> dict[str, str]:
    """What the page's charts and candidate table were drawn from, in a word each: the progress
    poll carries them, and when they change it tells the page to fetch that part again."""
    best = j.best_candidate_id or 0
    by_status: dict[str, int] = {}
    for g in progress.get("generations") or []:
        for status, n in g["by_status"].items():
            by_status[status] = by_status.get(status, 0) + n
    counts = "-".join(f"{status}{n}" for status, n in sorted(by_status.items()))
    return {
        "charts": f"g{progress.get('generations_done', 0)}b{best}",
        "candidates": f"{counts}b{best}",
    }


def _unmeasured_baselines(baselines) -> list[dict]:
    """The baselines asked for, grouped by why they have no time (status and reason), in the
    order first seen: five baselines refused for one reason read as one line, not five."""
    groups: dict[tuple[str, str], dict] = {}
    for b in baselines:
        status = "timed at only some shapes" if b.timings else (b.status or "not run")
        group = groups.setdefault(
            (status, b.reason or ""), {"names": [], "status": status, "reason": b.reason}
        )
        group["names"].append(b.name)
    return list(groups.values())


def _measured_on(timings) -> str:
    """Where a kernel's timings were taken, in words (the GPU and driver, or the CPU
    interpreter); several machines are named in the order first seen; "" when none is recorded."""
    seen = []
    for t in timings:
        if t.environment_id and str(t.environment) not in seen:
            seen.append(str(t.environment))
    return "; ".join(seen)


def _job_summary(j: Job, version: str) -> dict:
    """What the job page shows that changes only with `charts_version`: the decision and the
    artifact, the best kernel's speedups over the default baseline, the baselines asked for,
    model use, the recording it was replayed from. Plain data, worked out once per version and
    kept in this process's cache (at most JOB_CHARTS_TTL_S seconds)."""
    key = _version_key("job-summary", j, version)
    out = cache.get(key)
    if out is not None:
        return out
    best = j.best_candidate
    baselines = q.job_baselines(j)
    speed = []
    chosen = None
    measured_on = None
    if best is not None:
        timings = q.candidate_timings(best)
        chosen = q.default_baseline(baselines, timings)
        speed = q.speedups(timings, next((b for b in baselines if b.name == chosen), None))
        measured_on = _measured_on(timings)
    out = {
        "decision": q.latest_decision(j),
        "artifact": q.job_artifact(j),
        # the names only: the page lists which were asked for
        "baselines": [{"name": b.name} for b in baselines],
        "speedups": speed,
        "timed_shapes": sum(1 for s in speed if not s["missing"]),
        "slower_shapes": sum(1 for s in speed if not s["missing"] and s["speedup"] < 1),
        "chosen_baseline": chosen,
        "measured_on": measured_on,
        "unmeasured": _unmeasured_baselines(baselines) if not speed else [],
        "recording": recording_of(j),
        "usage": q.job_model_usage(j),
    }
    cache.set(key, out, JOB_CHARTS_TTL_S)
    return out


def _stopped_progress_html(j: Job, counts: q.JobCounts, *, engineer: bool) -> str | None:
    """The progress card of a job that stopped searching (nothing in it moves any more),
    rendered once per `charts_version` and kept in this process's cache (at most
    JOB_CHARTS_TTL_S seconds); None while the job searches (its card is live, drawn on every
    poll)."""
    if j.is_active:
        return None
    key = f"{_version_key('job-progress', j, q.charts_version(j, counts))}:{engineer}"
    html = cache.get(key)
    if html is None:
        progress = q.job_progress(j, counts)
        context = {
            "job": j,
            "progress": progress,
            "steps": q.stage_steps(j, progress),
            "live": _live_tokens(j, progress),
            "is_engineer": engineer,
        }
        html = render_to_string("web/partials/progress.html", context)
        cache.set(key, html, JOB_CHARTS_TTL_S)
    return mark_safe(html)  # noqa: S308 - rendered by our own template, escaped there


def _job_page(request, j: Job, *, status: int = 200, import_error: str = ""):
    # The counts are read once (two queries) and give the versions every cached part of the
    # page is kept under; a searching job's progress card is live and drawn every time.
    counts = q.job_counts(j)
    engineer = q.is_engineer(request.user)
    progress_html = _stopped_progress_html(j, counts, engineer=engineer)
    progress = None if progress_html else q.job_progress(j, counts)
    context = {
        "job": j,
        "workload": j.workload,
        "progress_html": progress_html,
        # the live card when the job searches (a stopped job's is progress_html)
        "progress": progress,
        "candidates_total": counts.candidates,
        "live": _live_tokens(j, progress) if progress else None,
        "steps": q.stage_steps(j, progress) if progress else None,
        "charts": _job_charts(j, version=q.results_version(j, counts)),
        "candidates_html": _candidates_html(request, j, counts),
        **_job_summary(j, q.charts_version(j, counts)),
        "open_batch": q.open_batch(j) if engineer else None,
        "import_error": import_error,
        "gpu_dispatch": settings.GPU_DISPATCH,
    }
    return _render(request, "web/job.html", context, nav="home", status=status)


# --- air-gapped GPU hosts: batch out, results in ------------------------------------------------

RESULTS_MAX_BYTES = 64 * 1024 * 1024


@engineer_required
@require_GET
def job_batch(request, code):
    """The batch waiting for a GPU, as a file for `python -m gpuworker run` on a GPU host."""
    j = q.get_job_for_user(request.user, code)
    batch = q.open_batch(j)
    if batch is None:
        raise Http404("No batch is waiting for a GPU.")
    response = HttpResponse(json.dumps(batch.batch, indent=1), content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="batch-{batch.code}.json"'
    return response


@engineer_required
@require_POST
def job_import(request, code):
    """A results file carried back from a GPU host; it must answer one of this job's batches."""
    j = q.get_job_for_user(request.user, code)
    upload = request.FILES.get("results")
    error = ""
    results = None
    if upload is None:
        error = "Choose the results file (results.json) that the GPU host wrote."
    elif upload.size > RESULTS_MAX_BYTES:
        error = f"The results file is {upload.size:,} bytes; the limit is {RESULTS_MAX_BYTES:,}."
    else:
        try:
            results = results_schema.loads(upload.read())  # bounded depth and integers
        except (UnicodeDecodeError, ValueError) as exc:
            error = f"The results file is not JSON: {exc}"
    if not error:
        batch_id = str(results.get("batch_id", "")) if isinstance(results, dict) else ""
        if batch_id not in q.batch_codes(j):
            error = "This results file answers a batch of another job (its batch_id is not ours)."
    if not error:
        try:
            batch = services.results_import(results=results, user=request.user)
        except services.ResultsError as exc:
            error = f"The results file was refused: {exc}"
        else:
            messages.success(request, f"Results of batch {str(batch.code)[:8]} recorded.")
            return redirect("web-job", code=j.code)
    return _job_page(request, j, status=400, import_error=error)


@engineer_required
@require_POST
def job_resend(request, code):
    """Send the job's waiting batch to its GPU queue again (a stopped or lost batch)."""
    j = q.get_job_for_user(request.user, code)
    try:
        batch = services.gpu_batch_resend(job=j, user=request.user)
    except services.ResendRefused as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Batch {str(batch.code)[:8]} is back in the GPU queue.")
    return redirect("web-job", code=j.code)


CSV_COLUMNS = (
    "candidate",
    "generation",
    "status",
    "made_by",
    "score_us",
    "shape",
    "median_us",
    "ci_low_us",
    "ci_high_us",
    "p20_us",
    "p80_us",
    "tbps",
    "reason",
)


@login_required
@require_GET
def job_results_csv(request, code):
    """Every candidate of the job with its time at each shape, one row per (candidate, shape),
    for a spreadsheet; a candidate without a time has one row with the time columns blank.
    Each baseline has a row per shape too (its name in the candidate column)."""
    j = q.get_job_for_user(request.user, code)
    # Kept compressed in the process cache per results_version (it changes whenever a candidate
    # is added, verified or scored, or a baseline measured), at most JOB_CHARTS_TTL_S seconds:
    # the file is a row per candidate and shape, about 0.9 MB for 2,000 candidates.
    version = f"{j.code}:{q.results_version(j)}"
    key = "ptxf:results-csv:" + hashlib.sha256(version.encode()).hexdigest()
    packed = cache.get(key)
    if packed is None:
        packed = zlib.compress(_results_csv(j).encode(), 1)
        cache.set(key, packed, JOB_CHARTS_TTL_S)
    response = HttpResponse(zlib.decompress(packed), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="job-{str(j.code)[:8]}-results.csv"'
    return response


def _results_csv(j: Job) -> str:
    """The results spreadsheet's text (see job_results_csv)."""
    import csv
    import io

    from portal.charts import shape_label

    timings = q.job_timings_by_candidate(j)

    def measured(t: tuple | None) -> list:
        if t is None:
            return [""] * 7
        dims, *cells = t
        return [shape_label(dims)] + ["" if x is None else x for x in cells]

    def text(value: str) -> str:
        # A spreadsheet runs a cell that starts like a formula: a reason quoting a compiler log
        # (with the customer's identifiers in it) must stay text.
        return "'" + value if value[:1] in ("=", "+", "-", "@", "\t", "\r") else value

    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(CSV_COLUMNS)
    for pk, cand_code, gen_index, status, role, backend, score, reason in q.results_file_candidates(
        j
    ):
        head = [
            str(cand_code),
            gen_index,
            status,
            text(f"{role} {backend}".strip()),
            "" if score is None else score,
        ]
        tail = [text(reason)]
        writer.writerows(head + measured(t) + tail for t in timings.get(pk) or [None])
    for b in q.job_baselines(j):
        for t in b.timings.values():
            cells = (t.dims, t.median_us, t.ci_low_us, t.ci_high_us, t.p20_us, t.p80_us, t.tbps)
            row = [text(b.name), "", b.status, "baseline", ""] + measured(cells)
            row.append(text(b.reason))
            writer.writerow(row)
    return buffer.getvalue()


# --- job controls: a customer or an engineer of the job's organisation ---------------------------


@login_required
@require_POST
def job_cancel(request, code):
    """Stop an active job for good (no review)."""
    j = q.get_job_for_user(request.user, code)
    if services.job_cancel(job=j, user=request.user):
        messages.success(request, "The job is cancelled: nothing more goes to the agents or GPU.")
    else:
        messages.error(request, f"The job is {j.get_status_display().lower()}: nothing to cancel.")
    return redirect("web-job", code=j.code)


@login_required
@require_POST
def job_stop(request, code):
    """End the search now; the best verified kernel so far goes to review."""
    j = q.get_job_for_user(request.user, code)
    try:
        services.job_stop_early(job=j, user=request.user)
    except services.JobControlRefused as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, "The search is stopped; its best kernel is up for review.")
    return redirect("web-job", code=j.code)


@login_required
@require_POST
def workload_rerun(request, code):
    """Another job on this workload, with the budget asked for (the default when blank)."""
    wl = q.get_workload_for_user(request.user, code)
    form = RerunForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Generations: " + " ".join(form.errors.get("generations", [])))
        return redirect("web-workload", code=wl.code)
    try:
        j = services.job_rerun(
            workload=wl, user=request.user, max_generations=form.cleaned_data["generations"]
        )
    except services.JobControlRefused as exc:
        messages.error(request, str(exc))
        return redirect("web-workload", code=wl.code)
    messages.success(request, "A new job has started; it begins from what earlier jobs found.")
    return redirect("web-job", code=j.code)


@login_required
@require_GET
def job_charts(request, code):
    """The job page's charts, fetched again when a generation or the best kernel changed."""
    j = q.get_job_for_user(request.user, code)
    return _render(request, "web/partials/charts.html", {"job": j, "charts": _job_charts(j)})


@login_required
@require_GET
def job_candidates(request, code):
    """The job page's candidate table (one page of it), fetched again when candidates change."""
    j = q.get_job_for_user(request.user, code)
    return HttpResponse(_candidates_html(request, j, q.job_counts(j)))


@login_required
@require_GET
def job_progress(request, code):
    """The live part of the job page, polled by htmx every second while the job is active."""
    j = q.get_job_for_user(request.user, code)
    counts = q.job_counts(j)
    stopped = _stopped_progress_html(j, counts, engineer=q.is_engineer(request.user))
    if stopped is not None:
        # the last poll of a page drawn while the job ran: stop, and reload the page once so
        # the charts and the results (not part of the polled fragment) appear
        response = HttpResponse(stopped, status=HTMX_STOP_POLLING)
        if request.GET.get("live") == "1":
            response["HX-Refresh"] = "true"
        return response
    progress = q.job_progress(j, counts)
    live = _live_tokens(j, progress)
    context = {
        "job": j,
        "progress": progress,
        "steps": q.stage_steps(j, progress),
        "live": live,
    }
    response = _render(request, "web/partials/progress.html", context)
    # The rest of the page is not polled: tell it which parts to fetch again.
    stale = [
        f"{part}-stale"
        for part in ("charts", "candidates")
        if request.GET.get(part) and request.GET[part] != live[part]
    ]
    if stale:
        response["HX-Trigger"] = ", ".join(stale)
    return response


@login_required
@require_GET
def candidate(request, code):
    c = q.get_candidate_for_user(request.user, code)
    timings = q.candidate_timings(c)
    verifications = q.candidate_verifications(c)
    samples = {charts.shape_label(t.dims): t.samples_us for t in timings if t.samples_us}
    show_ptx = q.may_read_ptx(request.user, c)
    context = {
        "candidate": c,
        "job": c.job,
        "workload": c.job.workload,
        "show_ptx": show_ptx,
        "ptx_lines": c.ptx.splitlines() if show_ptx else [],
        "compile": c.compile_report or {},
        "compile_rows": _compile_rows(c.compile_report or {}),
        "compile_cached": bool((c.compile_report or {}).get("cached")),
        "usage": q.candidate_model_usage(c),
        "agent_review": c.review or {},
        "review_checks": _static_review_checks(c),
        "verifications": verifications,
        "timings": timings,
        "flags": q.candidate_flags(c),
        "children": q.candidate_children(c),
        "samples_chart": charts.to_div(charts.samples_figure(samples)) if samples else None,
        "is_best": c.job.best_candidate_id == c.id,
    }
    return _render(request, "web/candidate.html", context, nav="home")


def _static_review_checks(c: Candidate) -> list[tuple[str, str]]:
    """What the static reviewer (factory.agents.review) looked at before the kernel cost GPU
    time, as (check, what this kernel showed) rows, from its compile report and launch; empty
    when it was not compiled."""
    report = c.compile_report or {}
    if not report.get("ok"):
        return []
    from factory import families
    from factory.agents.review import MIN_WARPS_PER_SM, occupancy_warps

    rows = [("Compiled", f"for {report.get('arch') or c.job.target_gpu}, no errors")]
    stored, loaded = report.get("spill_store_bytes"), report.get("spill_load_bytes")
    stack = report.get("stack_bytes")
    if stored is not None or stack is not None:
        rows.append(
            (
                "No local memory",
                f"{stored or 0} B spilled, {loaded or 0} B reloaded, {stack or 0} B stack frame",
            )
        )
    block = (c.launch or {}).get("block") or []
    registers = report.get("registers")
    if block and registers:
        threads = 1
        for b in block:
            threads *= int(b)
        smem = int(report.get("smem_bytes") or 0) + int((c.launch or {}).get("smem_bytes") or 0)
        warps = occupancy_warps(int(registers), threads, smem)
        # the reviewer's floor: the generator family's own, the default for anything else
        floor = MIN_WARPS_PER_SM
        schedule = c.schedule or {}
        if schedule.get("family") and not schedule.get("ptx_edit"):
            try:
                floor = families.of_schedule(schedule).min_warps_per_sm
            except KeyError:
                pass
        rows.append(
            (
                "Fits an SM",
                f"{threads} threads × {registers} registers, {smem} B shared: {warps} warps "
                f"resident per SM (at least {floor} needed)",
            )
        )
    rows.append(
        (
            "Nothing forbidden",
            "no managed memory, no calls outside the module (printf, malloc), no breakpoints",
        )
    )
    warned = str((c.review or {}).get("reason") or "").startswith("warning:")
    rows.append(
        (
            "Vector accesses",
            "allowed with a warning (below)"
            if warned
            else "no scalar global loads or stores that could have been one",
        )
    )
    return rows


def _compile_rows(report: dict) -> list[tuple[str, str]]:
    """The compile report as (label, text) rows; fields a report lacks show as a dash."""

    def get(key, unit=""):
        value = report.get(key)
        if value is None or value == "":
            return "–"
        if isinstance(value, float):
            value = f"{value:.1f}"
        return f"{value}{unit}"

    stored, loaded = report.get("spill_store_bytes"), report.get("spill_load_bytes", 0)
    spills = "–" if stored is None else f"{stored} B stored / {loaded} B loaded"
    return [
        ("Registers per thread", get("registers")),
        ("Spills", spills),
        ("Stack frame", get("stack_bytes", " B")),
        ("Shared memory", get("smem_bytes", " B")),
        ("Barriers", get("barriers")),
        ("Compile time", get("compile_ms", " ms")),
        ("nvJitLink", get("nvjitlink_version")),
    ]


# --- review -------------------------------------------------------------------------------------


@engineer_required
@require_GET
def review_queue(request):
    page = Paginator(q.review_queue(user=request.user), 25).get_page(request.GET.get("page"))
    recent = q.recent_decisions(user=request.user, limit=10)
    return _render(request, "web/review_queue.html", {"page": page, "recent": recent}, nav="review")


@engineer_required
@require_GET
def evidence(request):
    """The evidence memory: what every job has taught, by family, GPU, dtype and shape class."""
    families = q.evidence_families()
    known = {row["family"] for row in families}
    gpus = q.evidence_gpus()
    family = request.GET.get("family") or ""
    gpu = request.GET.get("gpu") or gpus[0]
    context = {"families": families, "gpus": gpus, "family": family, "gpu": gpu, "view": None}
    status = 200
    if family:
        if family not in known or gpu not in gpus:
            context["error"] = "No evidence for that family and GPU."
            status = 404
        else:
            context["dtype"] = request.GET.get("dtype") or ""
            context["shape_class"] = request.GET.get("shape_class") or ""
            context["view"] = q.evidence_view(
                family=family,
                gpu=gpu,
                dtype=context["dtype"] or None,
                shape_class=context["shape_class"] or None,
            )
    return _render(request, "web/evidence.html", context, nav="evidence", status=status)


@engineer_required
@require_http_methods(["GET", "POST"])
def review(request, code):
    j = q.get_job_for_user(request.user, code)
    best = j.best_candidate
    if best is None:
        raise Http404("This job has no candidate to review.")
    form = ReviewForm(request.POST or None)
    baseline_name = request.POST.get("baseline") or request.GET.get("baseline")
    # A decision is taken on the evidence as it is now; the page reads it from the cache.
    if request.method == "POST":
        evidence = _review_evidence(j, best, baseline_name)
    else:
        evidence = _review_evidence_cached(j, best, baseline_name)
    checks, all_ok = evidence["checks"], evidence["all_ok"]
    status = 200
    if request.method == "POST":
        # The kernel the page showed (a hidden field): a decision is about that one, not one that
        # became the best while the engineer read (a batch landing after an early stop).
        shown = request.POST.get("candidate")
        if j.status != Job.REVIEW:
            form.add_error(None, f"The job is {j.get_status_display().lower()}, not in review.")
            status = 409
        elif shown and shown != str(best.code):
            form.add_error(
                None,
                "The best kernel changed while you read: a faster one was verified after the "
                "search stopped. This page now shows it; decide on it.",
            )
            status = 409
        elif form.is_valid():
            decision = form.cleaned_data["decision"]
            if decision == "approve" and not all_ok and not form.cleaned_data["override"]:
                form.add_error(
                    None,
                    "A check fails: approve only with an override and a comment explaining it.",
                )
                status = 400
            else:
                checklist = {c.key: {"ok": c.ok, "detail": c.detail} for c in checks}
                checklist["baseline"] = evidence["chosen_baseline"]
                checklist["override"] = bool(form.cleaned_data["override"])
                try:
                    _, artifact = decide_and_deliver(
                        job=j,
                        reviewer=request.user,
                        decision=decision,
                        comment=form.cleaned_data["comment"],
                        checklist=checklist,
                    )
                except (ValidationError, ValueError) as exc:
                    msgs = exc.messages if isinstance(exc, ValidationError) else [str(exc)]
                    form.add_error(None, "; ".join(msgs))
                    status = 400
                else:
                    verb = "approved" if decision == "approve" else "rejected"
                    messages.success(
                        request,
                        f"{j.workload.name} {verb}; the customer has been told"
                        + (f" and artifact {artifact.filename} is ready." if artifact else "."),
                    )
                    return redirect("web-review-queue")
        else:
            status = 400
    context = {
        "job": j,
        "workload": j.workload,
        "candidate": best,
        **evidence,
        "form": form,
        "history": q.job_history(j),
        "decisions": q.job_decisions(j),
    }
    return _render(request, "web/review.html", context, nav="review", status=status)


def _review_evidence(j: Job, best: Candidate, baseline_name: str | None) -> dict:
    """What the review page shows of the best kernel's evidence: the checklist against the
    chosen baseline (`baseline_name`, else the strongest measured), its speedups, the baselines
    to choose from, where it was measured, and the chart against the baselines. Plain data."""
    checks, speed, baselines = q.review_checklist(j, best, baseline_name)
    best_timings = q.candidate_timings(best)  # read once for the default and "measured on"
    chosen = next((r for r in baselines if r.name == baseline_name), None)
    comparison = q.comparison_rows(best, baselines)
    return {
        "checks": checks,
        "all_ok": all(c.ok for c in checks),
        "speedups": speed,
        # what the baseline picker shows of each
        "baselines": [
            {"name": b.name, "version": b.version, "status": b.status} for b in baselines
        ],
        "chosen_baseline": chosen.name if chosen else q.default_baseline(baselines, best_timings),
        "measured_on": _measured_on(best_timings),
        "unmeasured": _unmeasured_baselines(baselines),
        "baseline_chart": charts.to_div(charts.baselines_figure(comparison))
        if any(row["name"] != "candidate" for row in comparison)
        else None,
    }


def _review_evidence_cached(j: Job, best: Candidate, baseline_name: str | None) -> dict:
    """`_review_evidence`, worked out once per `charts_version` of the job and baseline asked
    for, and kept in this process's cache (at most JOB_CHARTS_TTL_S seconds)."""
    asked = hashlib.sha256(str(baseline_name).encode()).hexdigest()
    key = f"{_version_key('review', j, q.charts_version(j))}:{asked}"
    out = cache.get(key)
    if out is None:
        out = _review_evidence(j, best, baseline_name)
        cache.set(key, out, JOB_CHARTS_TTL_S)
    return out


# --- artifacts ----------------------------------------------------------------------------------


@login_required
@require_GET
def artifact_download(request, code):
    artifact = q.get_artifact_for_user(request.user, code)
    services.audit_record(
        actor=request.user,
        org=artifact.job.workload.org,
        verb="artifact.download",
        target=f"artifact:{artifact.code}",
    )
    response = FileResponse(
        artifact.file.open("rb"),
        as_attachment=True,
        filename=artifact.filename,
        content_type="application/zip",
    )
    response["X-Content-SHA256"] = artifact.sha256
    return response


# --- API tokens ---------------------------------------------------------------------------------


@login_required
@require_http_methods(["GET", "POST"])
def tokens(request):
    new_key = None
    form = TokenForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        new_key, _ = services.api_token_create(user=request.user, name=form.cleaned_data["name"])
    rows = q.api_token_list(user=request.user)
    return _render(
        request,
        "web/tokens.html",
        {
            "form": form,
            "tokens": rows,
            "new_key": new_key,
            "api_url": request.build_absolute_uri(reverse("api-root")),
        },
        nav="tokens",
    )


@login_required
@require_POST
def token_delete(request, code):
    services.api_token_revoke(user=request.user, code=code)
    messages.success(request, "Token revoked.")
    return redirect("web-tokens")


# --- help ---------------------------------------------------------------------------------------


@login_required
@require_GET
def help_index(request):
    """What every verdict, chart and schedule label means, and where the references are."""
    from portal.web import help as h

    context = {
        "job_verdicts": h.JOB_VERDICTS,
        "candidate_verdicts": h.CANDIDATE_VERDICTS,
        "charts": h.CHARTS,
        "legends": h.schedule_legends(),
    }
    return _render(request, "web/help.html", context, nav="help")


@login_required
@require_GET
def help_doc(request, name):
    """docs/MANIFEST.md or docs/PYTORCH.md, rendered."""
    from portal.web import help as h

    if name not in h.DOCS:
        raise Http404("No such help page.")
    titles = {"manifest": "The manifest reference", "pytorch": "From PyTorch code"}
    context = {"title": titles[name], "body": h.doc_html(name), "doc": name}
    return _render(request, "web/help_doc.html", context, nav="help")


@login_required
@require_GET
def help_examples(request):
    """The catalogue's operators and factory/examples, each loadable into the upload form."""
    from portal.web import help as h

    context = {"examples": list(h.examples().values()), "catalogue_names": catalogue.names()}
    return _render(request, "web/help_examples.html", context, nav="help")


@login_required
@require_http_methods(["GET", "POST"])
def profile(request):
    """The user's email address (where decisions on their jobs go) and password."""
    from django.contrib.auth import update_session_auth_hash
    from django.contrib.auth.forms import PasswordChangeForm

    which = request.POST.get("form") if request.method == "POST" else ""
    from portal.models import NotificationSettings

    prefs = NotificationSettings.objects.filter(user=request.user).first()
    email_form = EmailForm(
        request.POST if which == "email" else None,
        initial={
            "email": request.user.email,
            "on_review": prefs.email_on_review if prefs else True,
            "on_decision": prefs.email_on_decision if prefs else True,
            "on_failure": prefs.email_on_failure if prefs else True,
        },
    )
    password_form = PasswordChangeForm(request.user, request.POST if which == "password" else None)
    status = 200
    if which == "email":
        if email_form.is_valid():
            data = email_form.cleaned_data
            services.user_email_set(
                user=request.user,
                email=data["email"],
                on_review=data["on_review"],
                on_decision=data["on_decision"],
                on_failure=data["on_failure"],
            )
            messages.success(request, "Email address saved.")
            return redirect("web-profile")
        status = 400
    elif which == "password":
        if password_form.is_valid():
            user = password_form.save()
            update_session_auth_hash(request, user)
            messages.success(request, "Password changed.")
            return redirect("web-profile")
        status = 400
    context = {"email_form": email_form, "password_form": password_form}
    return _render(request, "web/profile.html", context, nav="profile", status=status)


@require_GET
def favicon(request):
    """Browsers ask for /favicon.ico whatever the page links: send them the icon."""
    from django.templatetags.static import static

    return redirect(static("favicon.svg"), permanent=True)


@require_GET
def health(request):
    """For a load balancer or a person: the database answers, and which workers of this machine
    consume their queues (workers on other hosts report through their own portal host)."""
    from django.db import connection
    from django.http import JsonResponse

    from portal.celery import ready_dir

    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        database = "ok"
    except Exception as exc:  # noqa: BLE001 - any failure is the answer
        database = f"unavailable: {type(exc).__name__}"
    # a count, not the names: this answers anyone, logged in or not
    workers = sum(1 for _ in ready_dir().glob("*.ready"))
    body = {"status": "ok" if database == "ok" else "degraded", "database": database}
    body["workers_ready_here"] = workers
    return JsonResponse(body, status=200 if database == "ok" else 503)
