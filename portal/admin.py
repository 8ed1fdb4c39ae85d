from django.contrib import admin

from portal import models


class MembershipInline(admin.TabularInline):
    model = models.Membership
    extra = 0
    raw_id_fields = ["user"]


@admin.register(models.Organisation)
class OrganisationAdmin(admin.ModelAdmin):
    list_display = ["name", "code", "created"]
    search_fields = ["name"]
    inlines = [MembershipInline]


@admin.register(models.Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "org", "role"]
    list_filter = ["role", "org"]


@admin.register(models.ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["user", "name", "prefix", "created", "last_used"]
    readonly_fields = ["prefix", "key_sha256"]


@admin.register(models.Workload)
class WorkloadAdmin(admin.ModelAdmin):
    list_display = ["name", "org", "family", "target_gpu", "created"]
    list_filter = ["org", "family"]
    search_fields = ["name", "sha256", "code"]
    readonly_fields = ["code", "sha256", "baseline_sha256"]


@admin.register(models.Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ["code", "workload", "status", "stage", "current_generation", "created"]
    list_filter = ["status", "target_gpu", "backend"]
    search_fields = ["code", "workload__name"]
    raw_id_fields = ["workload", "best_candidate"]


@admin.register(models.Generation)
class GenerationAdmin(admin.ModelAdmin):
    list_display = ["job", "index", "status", "best_score_us"]
    list_filter = ["status"]
    raw_id_fields = ["job", "best_candidate"]


@admin.register(models.Candidate)
class CandidateAdmin(admin.ModelAdmin):
    list_display = ["code", "job", "generation", "role", "backend", "status", "score_us"]
    list_filter = ["status", "role", "backend"]
    search_fields = ["code", "ptx_sha256"]
    raw_id_fields = ["job", "generation", "parent"]


@admin.register(models.GpuBatch)
class GpuBatchAdmin(admin.ModelAdmin):
    list_display = [
        "code",
        "job",
        "generation",
        "arch",
        "status",
        "source",
        "dispatched",
        "started",
        "worker",
    ]
    list_filter = ["status", "arch"]
    raw_id_fields = ["job", "generation", "environment"]


@admin.register(models.Environment)
class EnvironmentAdmin(admin.ModelAdmin):
    list_display = ["gpu", "sm", "driver", "created"]


@admin.register(models.VerificationResult)
class VerificationResultAdmin(admin.ModelAdmin):
    list_display = ["candidate", "dims_key", "heldout", "passed", "rel_err"]
    list_filter = ["passed", "heldout"]
    raw_id_fields = ["candidate", "batch"]


@admin.register(models.TimingResult)
class TimingResultAdmin(admin.ModelAdmin):
    list_display = ["candidate", "baseline_measurement", "dims_key", "median_us", "tbps"]
    raw_id_fields = ["candidate", "baseline_measurement", "batch", "environment"]


@admin.register(models.Baseline)
class BaselineAdmin(admin.ModelAdmin):
    list_display = ["name", "version"]


@admin.register(models.BaselineMeasurement)
class BaselineMeasurementAdmin(admin.ModelAdmin):
    list_display = ["baseline", "job", "status", "score_us"]
    raw_id_fields = ["job", "batch", "environment"]


@admin.register(models.Flag)
class FlagAdmin(admin.ModelAdmin):
    list_display = ["candidate", "kind", "message", "created"]
    raw_id_fields = ["candidate", "batch"]


@admin.register(models.ReviewDecision)
class ReviewDecisionAdmin(admin.ModelAdmin):
    list_display = ["job", "candidate", "reviewer", "decision", "created"]
    raw_id_fields = ["job", "candidate"]


@admin.register(models.Artifact)
class ArtifactAdmin(admin.ModelAdmin):
    list_display = ["filename", "job", "sha256", "size_bytes", "created"]
    raw_id_fields = ["job", "candidate"]


@admin.register(models.AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    list_display = ["created", "actor", "org", "verb", "target"]
    list_filter = ["verb"]
    readonly_fields = ["created", "actor", "org", "verb", "target", "data"]
