from django.urls import path, register_converter

from portal.api import views


class CodeConverter:
    """A full UUID, or a prefix of at least 8 of its hex digits (what the pages and `ptxf`
    show); `portal.selectors` resolves a prefix within the caller's scope, 404 when ambiguous."""

    regex = r"[0-9a-fA-F]{8}[0-9a-fA-F-]{0,28}"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value) -> str:
        return str(value)


register_converter(CodeConverter, "code")

urlpatterns = [
    path("v1/", views.root, name="api-root"),
    path("v1/jobs/", views.jobs, name="api-jobs"),
    path("v1/jobs/<code:code>/", views.job, name="api-job"),
    path("v1/jobs/<code:code>/results/", views.results, name="api-results"),
    path("v1/jobs/<code:code>/cancel/", views.job_cancel, name="api-job-cancel"),
    path("v1/jobs/<code:code>/stop/", views.job_stop, name="api-job-stop"),
    path("v1/jobs/<code:code>/archive/", views.job_archive, name="api-job-archive"),
    path("v1/jobs/<code:code>/unarchive/", views.job_unarchive, name="api-job-unarchive"),
    path("v1/jobs/<code:code>/artifact/", views.artifact, name="api-artifact"),
    path("v1/workloads/<code:code>/", views.workload, name="api-workload"),
    path("v1/workloads/<code:code>/jobs/", views.workload_jobs, name="api-workload-jobs"),
    path("v1/candidates/<code:code>/", views.candidate, name="api-candidate"),
    path("v1/invitations/", views.invitations, name="api-invitations"),
    path(
        "v1/invitations/<code:code>/withdraw/",
        views.invitation_withdraw,
        name="api-invitation-withdraw",
    ),
]
