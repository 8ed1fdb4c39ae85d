from django.urls import path

from portal.web import views

urlpatterns = [
    path("", views.home, name="web-home"),
    path("health/", views.health, name="web-health"),
    path("workloads/new/", views.upload, name="web-upload"),
    path("workloads/<uuid:code>/", views.workload, name="web-workload"),
    path("workloads/<uuid:code>/rerun/", views.workload_rerun, name="web-workload-rerun"),
    path("jobs/<uuid:code>/", views.job, name="web-job"),
    path("jobs/<uuid:code>/progress/", views.job_progress, name="web-job-progress"),
    path("jobs/<uuid:code>/charts/", views.job_charts, name="web-job-charts"),
    path("jobs/<uuid:code>/candidates/", views.job_candidates, name="web-job-candidates"),
    path("jobs/<uuid:code>/batch/", views.job_batch, name="web-job-batch"),
    path("jobs/<uuid:code>/import/", views.job_import, name="web-job-import"),
    path("jobs/<uuid:code>/resend/", views.job_resend, name="web-job-resend"),
    path("jobs/<uuid:code>/results.csv", views.job_results_csv, name="web-job-results-csv"),
    path("jobs/<uuid:code>/cancel/", views.job_cancel, name="web-job-cancel"),
    path("jobs/<uuid:code>/stop/", views.job_stop, name="web-job-stop"),
    path("jobs/<uuid:code>/artifact/", views.artifact_download, name="web-artifact-download"),
    path("candidates/<uuid:code>/", views.candidate, name="web-candidate"),
    path("review/", views.review_queue, name="web-review-queue"),
    path("evidence/", views.evidence, name="web-evidence"),
    path("review/<uuid:code>/", views.review, name="web-review"),
    path("tokens/", views.tokens, name="web-tokens"),
    path("account/", views.profile, name="web-profile"),
    path("help/", views.help_index, name="web-help"),
    path("help/examples/", views.help_examples, name="web-help-examples"),
    path("help/<slug:name>/", views.help_doc, name="web-help-doc"),
    path("favicon.ico", views.favicon, name="web-favicon"),
    path("tokens/<uuid:code>/revoke/", views.token_delete, name="web-token-delete"),
]
