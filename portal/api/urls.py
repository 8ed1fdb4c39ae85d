from django.urls import path

from portal.api import views

urlpatterns = [
    path("v1/", views.root, name="api-root"),
    path("v1/jobs/", views.jobs, name="api-jobs"),
    path("v1/jobs/<uuid:code>/", views.job, name="api-job"),
    path("v1/jobs/<uuid:code>/results/", views.results, name="api-results"),
    path("v1/jobs/<uuid:code>/cancel/", views.job_cancel, name="api-job-cancel"),
    path("v1/jobs/<uuid:code>/stop/", views.job_stop, name="api-job-stop"),
    path("v1/jobs/<uuid:code>/artifact/", views.artifact, name="api-artifact"),
    path("v1/workloads/<uuid:code>/", views.workload, name="api-workload"),
    path("v1/workloads/<uuid:code>/jobs/", views.workload_jobs, name="api-workload-jobs"),
    path("v1/candidates/<uuid:code>/", views.candidate, name="api-candidate"),
]
