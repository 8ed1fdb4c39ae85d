"""JSON API views. Every view is wrapped by `api_view`, which authenticates the bearer token,
checks the method, and turns every refusal into a JSON error with a 4xx status (404 for objects
of another organisation, exactly as for objects that do not exist)."""

from __future__ import annotations

import functools
import json
import logging
from datetime import timedelta

from django.core.exceptions import PermissionDenied, RequestDataTooBig, ValidationError
from django.core.serializers.json import DjangoJSONEncoder
from django.http import FileResponse, Http404, HttpResponse, JsonResponse
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from portal import accounts, catalogue, services
from portal import selectors as q
from portal.models import ApiToken, Invitation, Job, Membership, Organisation
from portal.selectors import joblist
from portal.uploads import BASELINE_EXTENSIONS, BASELINE_MAX_BYTES, MANIFEST_MAX_BYTES, check_text

log = logging.getLogger("portal.api")
API_VERSION = 1
# Don't write last_used on every call: one UPDATE a minute per token is plenty.
LAST_USED_RESOLUTION = timedelta(minutes=1)


class ApiError(Exception):
    def __init__(self, status: int, message: str, errors: list | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.errors = errors or []


def error(status: int, message: str, errors: list | None = None) -> JsonResponse:
    body = {"error": message}
    if errors:
        body["errors"] = errors
    return JsonResponse(body, status=status)


def _authenticate(request):
    header = request.headers.get("Authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise ApiError(401, "Send an API token: Authorization: Bearer <token>.")
    token = ApiToken.lookup(key.strip())
    if token is None or not token.user.is_active:
        raise ApiError(401, "The API token is not valid (revoked, expired or mistyped).")
    if token.scope == "read" and request.method not in ("GET", "HEAD", "OPTIONS"):
        raise ApiError(403, "This API token may only read (its scope is read).")
    now = timezone.now()
    if token.last_used is None or now - token.last_used > LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used=now)
    return token.user


def api_view(methods: tuple[str, ...]):
    def decorate(view):
        @csrf_exempt  # token authentication: no cookies, so no cross-site request to forge
        @functools.wraps(view)
        def wrapped(request, *args, **kwargs):
            try:
                if request.method not in methods:
                    response = error(405, f"Use {' or '.join(methods)}.")
                    response["Allow"] = ", ".join(methods)
                    return response
                request.user = _authenticate(request)
                return view(request, *args, **kwargs)
            except ApiError as exc:
                return error(exc.status, exc.message, exc.errors)
            except q.AmbiguousCode as exc:
                return error(404, str(exc))
            except Http404:
                return error(404, "Not found.")
            except PermissionDenied as exc:
                return error(403, str(exc) or "Not allowed.")
            except RequestDataTooBig:
                return error(413, "The request body is too large.")

        return wrapped

    return decorate


# --- serialisers --------------------------------------------------------------------------------


def _iso(value):
    return value.isoformat() if value else None


def _queue_json(request, queue: dict) -> dict:
    """The GPU queue as the job page shows it; which worker runs the batch only to engineers."""
    body = {
        key: queue[key]
        for key in ("arch", "dispatch", "waiting", "running", "mine_running", "position", "idle")
    }
    body["mine_started"] = _iso(queue["mine_started"])
    body["last_taken"] = _iso(queue["last_taken"])
    body["mine_failed"] = bool(queue["mine_error"])
    if q.is_engineer(request.user):
        body["mine_worker"] = queue["mine_worker"]
        body["mine_error"] = queue["mine_error"]
    return body


def _usage_json(usage: dict) -> dict:
    """The model use of a job as the API gives it: totals, and by generation (string keys)."""
    keys = ("tokens_in", "tokens_out", "cost_usd")
    return {
        **{k: usage[k] for k in keys},
        "by_generation": {
            str(g): {k: v.get(k, 0) for k in keys} for g, v in usage["by_generation"].items()
        },
        "unattributed": usage["unattributed"],
    }


def job_json(request, job: Job, progress: dict | None = None) -> dict:
    progress = progress or q.job_progress(job)
    decision = q.latest_decision(job)
    body = {
        "job": str(job.code),
        "workload": str(job.workload.code),
        "name": job.workload.name,
        "status": job.status,
        "stage": job.stage,
        "done": job.status not in Job.ACTIVE,
        "target": job.target_gpu,
        "generations_done": progress["generations_done"],
        "max_generations": job.max_generations,
        "progress": round(progress["fraction"], 3),
        "eta_s": progress["eta_s"],
        "candidates": progress["totals"],
        "gpu_queue": _queue_json(request, progress["gpu_queue"]),
        "best_candidate": str(job.best_candidate.code) if job.best_candidate_id else None,
        "best_score_us": progress["best_score_us"],
        "usage": _usage_json(q.job_model_usage(job)),
        "stop_reason": job.stop_reason,
        "archived": _iso(job.archived),
        "created": _iso(job.created),
        "finished": _iso(job.finished),
        "decision": (
            {
                "decision": decision.decision,
                "comment": decision.comment,
                "at": _iso(decision.created),
            }
            if decision
            else None
        ),
        "urls": {
            "self": request.build_absolute_uri(reverse("api-job", args=[job.code])),
            "results": request.build_absolute_uri(reverse("api-results", args=[job.code])),
            "artifact": request.build_absolute_uri(reverse("api-artifact", args=[job.code])),
            "page": request.build_absolute_uri(reverse("web-job", args=[job.code])),
        },
    }
    return body


def _timing_json(t) -> dict:
    return {
        "dims": t.dims,
        "median_us": t.median_us,
        "ci_low_us": t.ci_low_us,
        "ci_high_us": t.ci_high_us,
        "p20_us": t.p20_us,
        "p80_us": t.p80_us,
        "tbps": t.tbps,
    }


# --- views --------------------------------------------------------------------------------------


@api_view(("GET",))
def root(request):
    return JsonResponse(
        {
            "api_version": API_VERSION,
            "user": request.user.get_username(),
            "submit": request.build_absolute_uri(reverse("api-jobs")),
            # What a script can do, relative to this root; JOB, WORKLOAD and CANDIDATE are the
            # ids the other answers carry.
            "endpoints": {
                "GET jobs/": (
                    "your organisation's latest jobs: ?show=archived|all, ?status=S, ?q=words"
                ),
                "POST jobs/": "submit a manifest: {manifest, generations?, per_row_length?, "
                "baseline_source?, baseline_filename?}",
                "GET jobs/JOB/": "a job's progress",
                "GET jobs/JOB/results/": (
                    "the best kernel's verification, timings and speedups; every candidate's "
                    "status with its time or the reason it was refused"
                ),
                "GET jobs/JOB/artifact/": "the approved artifact (a zip)",
                "POST jobs/JOB/stop/": "end the search: the best verified kernel to review",
                "POST jobs/JOB/cancel/": "stop the job for good",
                "POST jobs/JOB/archive/": "hide a finished job from the job list",
                "POST jobs/JOB/unarchive/": "put an archived job back on the job list",
                "GET workloads/WORKLOAD/": "a workload and its jobs",
                "POST workloads/WORKLOAD/jobs/": "another job on it: {generations?}",
                "GET candidates/CANDIDATE/": "one candidate's evidence",
                "GET invitations/": "an organisation's invitations (admins, engineers): ?org=ORG",
                "POST invitations/": "invite someone by email: {email, role?, org?}",
                "POST invitations/INVITATION/withdraw/": "withdraw an open invitation",
            },
        }
    )


def _json_body(request, max_bytes: int, *, optional: bool = False) -> dict:
    """The request's JSON object; where `optional`, a request that sends nothing (no body, or an
    empty form) is {}."""
    try:
        raw = request.body
    except RequestDataTooBig:
        raise ApiError(413, "The request body is too large.") from None
    is_json = request.content_type == "application/json"
    if optional and (not raw.strip() or (not is_json and not request.POST)):
        return {}
    if not is_json:
        raise ApiError(415, "Send the body as JSON (Content-Type: application/json).")
    if len(raw) > max_bytes:
        raise ApiError(413, "The request body is too large.")
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, f"The body is not valid JSON: {exc}.") from None
    if not isinstance(body, dict):
        raise ApiError(400, "The body must be a JSON object.")
    return body


def _generations(body: dict, errors: list) -> int | None:
    generations = body.get("generations")
    if generations is not None and (
        not isinstance(generations, int)
        or isinstance(generations, bool)
        or not 1 <= generations <= 50
    ):
        errors.append(["generations", "a whole number from 1 to 50"])
    return generations


def _read_submission(request) -> dict:
    body = _json_body(request, MANIFEST_MAX_BYTES + BASELINE_MAX_BYTES + 4096)
    errors = []
    manifest = body.get("manifest")
    if not isinstance(manifest, str) or not manifest.strip():
        errors.append(["manifest", "required: the manifest's TOML text"])
    elif len(manifest.encode()) > MANIFEST_MAX_BYTES:
        errors.append(["manifest", f"larger than {MANIFEST_MAX_BYTES} bytes"])
    else:
        try:
            check_text(manifest, what="manifest")
        except ValidationError as exc:
            errors.append(["manifest", exc.messages[0]])
    source = body.get("baseline_source")
    filename = body.get("baseline_filename")
    if source is not None:
        if not isinstance(source, str) or not isinstance(filename, str):
            errors.append(["baseline_filename", "a baseline needs its source text and filename"])
        else:
            ext = "." + filename.rsplit(".", 1)[-1].lower() if "." in filename else ""
            if ext not in BASELINE_EXTENSIONS:
                errors.append(["baseline_filename", "must end in .ptx or .cu"])
            if len(source.encode()) > BASELINE_MAX_BYTES:
                errors.append(["baseline_source", f"larger than {BASELINE_MAX_BYTES} bytes"])
            else:
                try:
                    check_text(source, what="kernel")
                except ValidationError as exc:
                    errors.append(["baseline_source", exc.messages[0]])
    generations = _generations(body, errors)
    per_row_length = body.get("per_row_length", False)
    if not isinstance(per_row_length, bool):
        errors.append(["per_row_length", "true or false"])
    if errors:
        raise ApiError(400, "The submission was refused.", errors)
    return {
        "manifest": manifest,
        "baseline_source": source,
        "baseline_filename": filename if source is not None else None,
        "generations": generations,
        "per_row_length": per_row_length,
    }


def _job_query(params) -> joblist.JobQuery:
    """The job list's filters from the query string, as on the home page, except that an
    unknown value is refused (400) instead of read as no filter."""
    errors = []
    show = params.get("show", "")
    if show not in joblist.SHOW_CHOICES:
        errors.append(["show", "archived or all (leave it out for the jobs not archived)"])
    status = params.get("status", "")
    if status and status != joblist.STATUS_ACTIVE and status not in dict(Job.STATUS_CHOICES):
        known = ", ".join([joblist.STATUS_ACTIVE, *dict(Job.STATUS_CHOICES)])
        errors.append(["status", f"one of {known}"])
    if len(params.get("q", "")) > 100:
        errors.append(["q", "at most 100 characters"])
    if errors:
        raise ApiError(400, "The job list's filters were refused.", errors)
    return joblist.JobQuery.from_params(params)


@api_view(("GET", "POST"))
def jobs(request):
    if request.method == "GET":
        query = _job_query(request.GET)
        found = joblist.filter_jobs(
            q.job_list(user=request.user), query, engineer=q.is_engineer(request.user)
        )
        rows = q.recent_jobs(found, limit=50)
        return JsonResponse(
            {
                "jobs": [
                    {
                        "job": str(j.code),
                        "name": j.workload.name,
                        "status": j.status,
                        "created": _iso(j.created),
                        "archived": _iso(j.archived),
                    }
                    for j in rows
                ]
            }
        )
    org = q.primary_org(request.user)
    if org is None:
        raise ApiError(403, "You are not a member of any organisation.")
    data = _read_submission(request)
    from factory.spec import SpecError

    split = data["per_row_length"]
    try:
        parts = []
        if split:
            parts = catalogue.split_by_row_length(
                data["manifest"],
                baseline_source=data["baseline_source"],
                baseline_filename=data["baseline_filename"],
            )
        jobs = services.submit(
            org=org,
            user=request.user,
            manifests=[t for _, t in parts] or [data["manifest"]],
            baseline_source=data["baseline_source"],
            baseline_filename=data["baseline_filename"],
            max_generations=data["generations"],
        )
    except SpecError as exc:
        return error(400, "The manifest was refused.", [list(e) for e in exc.errors])
    except ValidationError as exc:
        return error(400, "; ".join(exc.messages))
    if split:  # asked for a job per row length: a list, of one where the rows are all alike
        return JsonResponse({"jobs": [job_json(request, j) for j in jobs]}, status=201)
    return JsonResponse(job_json(request, jobs[0]), status=201)


@api_view(("GET",))
def job(request, code):
    j = q.get_job_for_user(request.user, code)
    return JsonResponse(job_json(request, j))


@api_view(("POST",))
def job_cancel(request, code):
    """Stop an active job for good; 409 when it had already stopped."""
    j = q.get_job_for_user(request.user, code)
    if not services.job_cancel(job=j, user=request.user):
        return error(409, f"The job is {j.get_status_display().lower()}: nothing to cancel.")
    return JsonResponse(job_json(request, j))


@api_view(("POST",))
def job_stop(request, code):
    """End the search now and send the best verified kernel so far to review; 409 when the job
    is not searching or nothing has passed verification yet."""
    j = q.get_job_for_user(request.user, code)
    try:
        j = services.job_stop_early(job=j, user=request.user)
    except services.JobControlRefused as exc:
        return error(409, str(exc))
    return JsonResponse(job_json(request, j))


@api_view(("POST",))
def job_archive(request, code):
    """Hide a finished job from the default job list (it stays whole: pages, results,
    artifact); 409 while it is still searching or when it is archived already."""
    j = q.get_job_for_user(request.user, code)
    if j.archived is not None:
        return error(409, "The job is archived already.")
    try:
        j = accounts.job_archive(user=request.user, job=j)
    except accounts.ArchiveRefused as exc:
        return error(409, str(exc))
    return JsonResponse(job_json(request, j))


@api_view(("POST",))
def job_unarchive(request, code):
    """Put an archived job back on the default job list; 409 when it is not archived."""
    j = q.get_job_for_user(request.user, code)
    if j.archived is None:
        return error(409, "The job is not archived.")
    j = accounts.job_restore(user=request.user, job=j)
    return JsonResponse(job_json(request, j))


@api_view(("GET",))
def results(request, code):
    """The job as `job` answers it, its generations, and its evidence: the baselines, the best
    kernel's verification, timings and speedups, and every candidate in a line. The live part
    (progress, GPU queue, generations) is read on every call; the evidence only changes with the
    job's `results_version` and is serialised once per version (`_results_evidence`)."""
    j = q.get_job_for_user(request.user, code)
    counts = q.job_counts(j)
    progress = q.job_progress(j, counts)
    body = job_json(request, j, progress)
    body["generations"] = [
        {
            k: g[k]
            for k in ("index", "status", "total", "passed", "failed", "best_score_us", "model_rho")
        }
        for g in progress["generations"]
    ]
    live = json.dumps(body, cls=DjangoJSONEncoder)
    evidence = _results_evidence(j, q.results_version(j, counts))
    # one JSON object: the live members, then the evidence's
    return HttpResponse(f"{live[:-1]}, {evidence}}}", content_type="application/json")


# How long a job's serialised evidence is served before it is read again even when
# `results_version` did not move.
RESULTS_EVIDENCE_TTL_S = 60


def _results_evidence(j: Job, version: str) -> str:
    """The results answer's evidence members as JSON text without the braces, kept in this
    process's cache per `results_version` (it moves whenever a candidate is added, verified or
    scored, or a baseline measured), at most RESULTS_EVIDENCE_TTL_S seconds: every candidate's
    line is about 350 KB of JSON for 2,000 candidates, and clients poll this answer."""
    import hashlib

    from django.core.cache import cache

    key = "ptxf:api-results:" + hashlib.sha256(f"{j.code}:{version}".encode()).hexdigest()
    text = cache.get(key)
    if text is not None:
        return text
    best = j.best_candidate
    baselines = q.job_baselines(j)
    part = {
        "copy_ceiling_tbps": q.copy_ceiling_tbps(j),
        "baselines": [
            {
                "name": b.name,
                "version": b.version,
                "status": b.status,
                "reason": b.reason,
                "timing": [_timing_json(t) for t in b.timings.values()],
            }
            for b in baselines
        ],
        "best": None,
    }
    if best is not None:
        timings = q.candidate_timings(best)
        chosen = q.default_baseline(baselines, timings)
        part["best"] = {
            "candidate": str(best.code),
            "status": best.status,
            "score_us": best.score_us,
            "entry": best.entry,
            "verification": [
                {
                    "dims": v.dims,
                    "heldout": v.heldout,
                    "passed": v.passed,
                    "rel_err": v.rel_err,
                    "max_abs_err": v.max_abs_err,
                }
                for v in q.candidate_verifications(best)
            ],
            "timing": [_timing_json(t) for t in timings],
            "flags": [f.message for f in q.candidate_flags(best)],
            "compared_with": chosen,
            "speedups": q.speedups(timings, next((b for b in baselines if b.name == chosen), None)),
        }
    # Every candidate in a line, so that a client sees what was refused before GPU time and why
    # without a request per candidate (the PTX and the compile report stay on the candidate).
    part["candidate_results"] = q.candidate_results(j)
    text = json.dumps(part, cls=DjangoJSONEncoder)[1:-1]
    cache.set(key, text, RESULTS_EVIDENCE_TTL_S)
    return text


@api_view(("GET",))
def artifact(request, code):
    try:
        found = q.get_artifact_for_user(request.user, code)
    except Http404 as exc:
        # The job itself may be visible but not approved: say so (409) rather than "not found".
        try:
            q.get_job_for_user(request.user, code)
        except Http404:
            raise exc from None
        return error(409, str(exc) or "Nothing has been approved for this job.")
    services.audit_record(
        actor=request.user,
        org=found.job.workload.org,
        verb="artifact.download",
        target=f"artifact:{found.code}",
        data={"via": "api"},
    )
    response = FileResponse(
        found.file.open("rb"),
        as_attachment=True,
        filename=found.filename,
        content_type="application/zip",
    )
    response["X-Content-SHA256"] = found.sha256
    return response


@api_view(("POST",))
def workload_jobs(request, code):
    """Another job on a stored workload ({"generations": n} optional); 409 while one of its
    jobs is still searching."""
    w = q.get_workload_for_user(request.user, code)
    body = _json_body(request, 4096, optional=True)
    errors = []
    generations = _generations(body, errors)
    if errors:
        raise ApiError(400, "The request was refused.", errors)
    try:
        j = services.job_rerun(workload=w, user=request.user, max_generations=generations)
    except services.JobControlRefused as exc:
        return error(409, str(exc))
    return JsonResponse(job_json(request, j), status=201)


@api_view(("GET",))
def workload(request, code):
    w = q.get_workload_for_user(request.user, code)
    return JsonResponse(
        {
            "workload": str(w.code),
            "name": w.name,
            "description": w.description,
            "target": w.target_gpu,
            "sha256": w.sha256,
            "baseline_filename": w.baseline_filename or None,
            "created": _iso(w.created),
            "jobs": [{"job": str(j.code), "status": j.status} for j in q.workload_jobs(w)],
        }
    )


@api_view(("GET",))
def candidate(request, code):
    c = q.get_candidate_for_user(request.user, code)
    return JsonResponse(
        {
            "candidate": str(c.code),
            "job": str(c.job.code),
            "generation": c.generation.index,
            "status": c.status,
            "reason": c.reason,
            "score_us": c.score_us,
            "predicted_us": c.predicted_us,
            "parent": str(c.parent.code) if c.parent_id else None,
            "role": c.role,
            "backend": c.backend,
            "note": c.note,
            "entry": c.entry,
            "compile": c.compile_report,
            "usage": q.candidate_model_usage(c),
            "ptx_sha256": c.ptx_sha256,
            # A customer gets the PTX once it is approved (the artifact carries it too).
            "ptx": c.ptx if q.may_read_ptx(request.user, c) else None,
            "timing": [_timing_json(t) for t in q.candidate_timings(c)],
        }
    )


# --- invitations --------------------------------------------------------------------------------
# The Team page's rules (portal.accounts): an organisation's admins invite customers and admins
# to it; engineers invite to any organisation, and staff engineers may invite engineers too.


def invitation_json(invitation: Invitation) -> dict:
    inviter = invitation.invited_by
    return {
        "invitation": str(invitation.code),
        "org": str(invitation.org.code),
        "org_name": invitation.org.name,
        "email": invitation.email,
        "role": invitation.role,
        "state": invitation.state,
        "invited_by": inviter.get_username() if inviter else None,
        "created": _iso(invitation.created),
        "expires": _iso(invitation.expires),
        "accepted": _iso(invitation.accepted),
        "revoked": _iso(invitation.revoked),
    }


def _managed_orgs(user) -> list[Organisation]:
    orgs = accounts.invitable_orgs(user)
    if not orgs:
        raise ApiError(
            403,
            "Only an organisation's admins (and engineers) manage its invitations; ask one of "
            "your organisation's admins.",
        )
    return orgs


def _managed_org(user, orgs: list[Organisation], code) -> Organisation:
    """The organisation `code` names among those the user manages (a full code or a prefix of
    8 or more hex digits); without a code, the user's own, as on the Team page."""
    if code is None or code == "":
        own = {m.org_id for m in q.memberships(user)}
        return next((o for o in orgs if o.id in own), orgs[0])
    if not isinstance(code, str):
        raise ApiError(400, "The request was refused.", [["org", "an organisation's id"]])
    from portal.selectors.scope import _one

    return _one(Organisation.objects.filter(id__in=[o.id for o in orgs]), code)


@api_view(("GET", "POST"))
def invitations(request):
    orgs = _managed_orgs(request.user)
    if request.method == "GET":
        org = _managed_org(request.user, orgs, request.GET.get("org"))
        return JsonResponse(
            {
                "org": str(org.code),
                "org_name": org.name,
                "roles": accounts.invitable_roles(request.user),
                "invitations": [invitation_json(i) for i in accounts.team_invitations(org)],
            }
        )
    body = _json_body(request, 4096)
    errors = []
    email = body.get("email")
    if not isinstance(email, str) or not email.strip():
        errors.append(["email", "required: the address to invite"])
    else:
        from django.core.validators import validate_email

        email = email.strip()
        try:
            validate_email(email)
        except ValidationError:
            errors.append(["email", "not a valid email address"])
        if len(email) > 254:
            errors.append(["email", "at most 254 characters"])
    role = body.get("role", Membership.ROLE_CUSTOMER)
    allowed = accounts.invitable_roles(request.user)
    if role not in allowed:
        errors.append(["role", f"one of {', '.join(allowed)}"])
    if errors:
        raise ApiError(400, "The invitation was refused.", errors)
    org = _managed_org(request.user, orgs, body.get("org"))
    try:
        invitation, secret = accounts.invitation_create(
            user=request.user, org=org, email=email, role=role
        )
    except ValidationError as exc:
        return error(409, "; ".join(exc.messages))
    link = request.build_absolute_uri(reverse("web-invitation-accept", args=[secret]))
    sent = accounts.invitation_email(invitation=invitation, link=link)
    answer = invitation_json(invitation)
    # The link is in the answer this once (only its hash is kept), in case the email goes astray.
    answer["link"] = link
    answer["emailed"] = sent
    return JsonResponse(answer, status=201)


@api_view(("POST",))
def invitation_withdraw(request, code):
    """Withdraw an open invitation: its link opens nothing from now on; 409 when it was
    accepted, withdrawn or expired already."""
    orgs = _managed_orgs(request.user)
    from portal.selectors.scope import _one

    found = _one(
        Invitation.objects.select_related("org", "invited_by").filter(
            org_id__in=[o.id for o in orgs]
        ),
        code,
    )
    try:
        invitation = accounts.invitation_revoke(user=request.user, code=found.code)
    except ValidationError as exc:
        return error(409, "; ".join(exc.messages))
    return JsonResponse(invitation_json(invitation))
