"""The data model of the whole pipeline.

Public ids are UUID `code` fields; integer keys never leave the server. Every row that a task
writes has a natural unique key, so a redelivered task finds the row it made instead of making a
second one. Status constants and the allowed transitions live on the models.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import uuid
from dataclasses import dataclass

from django.conf import settings
from django.db import models
from django.utils import timezone


def sha256_hex(data: str | bytes) -> str:
    if isinstance(data, str):
        data = data.encode()
    return hashlib.sha256(data).hexdigest()


def canonical_json(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def dims_key(dims: dict) -> str:
    """A stable text key for one shape, e.g. "M=16384,N=4096" (sorted by dim name)."""
    return ",".join(f"{k}={dims[k]}" for k in sorted(dims))


@dataclass(frozen=True)
class CompileSummary:
    """The parts of a stored compile report (factory.compile.CompileReport.to_dict) that pages
    and checks read; missing keys read as zero."""

    ok: bool
    registers: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0
    stack_bytes: int = 0
    smem_bytes: int = 0
    compile_ms: float = 0.0

    @classmethod
    def from_json(cls, data: dict | None) -> CompileSummary | None:
        if not data:
            return None
        return cls(
            ok=bool(data.get("ok")),
            registers=int(data.get("registers") or 0),
            spill_store_bytes=int(data.get("spill_store_bytes") or 0),
            spill_load_bytes=int(data.get("spill_load_bytes") or 0),
            stack_bytes=int(data.get("stack_bytes") or 0),
            smem_bytes=int(data.get("smem_bytes") or 0),
            compile_ms=float(data.get("compile_ms") or 0.0),
        )

    @property
    def spills(self) -> bool:
        return bool(self.spill_store_bytes or self.spill_load_bytes)


# --- Accounts -----------------------------------------------------------------------------------


class Organisation(models.Model):
    code = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    name = models.CharField(max_length=200, unique=True)
    created = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    """A user's place in an organisation. A customer sees and uploads the organisation's
    workloads; an admin is a customer who also invites people to the organisation and sets their
    roles; an engineer reviews every organisation's jobs (portal.selectors.scope)."""

    ROLE_CUSTOMER = "customer"
    ROLE_ADMIN = "admin"
    ROLE_ENGINEER = "engineer"
    ROLE_CHOICES = [
        (ROLE_CUSTOMER, "Customer"),
        (ROLE_ADMIN, "Admin"),
        (ROLE_ENGINEER, "Engineer"),
    ]

    user = models.ForeignKey(settings.AUTH_USER_MODEL, models.CASCADE, related_name="memberships")
    org = models.ForeignKey(Organisation, models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=ROLE_CHOICES, default=ROLE_CUSTOMER)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "org"], name="membership_user_org")]

    def __str__(self) -> str:
        return f"{self.user} @ {self.org} ({self.role})"

    @property
    def is_engineer(self) -> bool:
        return self.role == self.ROLE_ENGINEER

    @property
    def is_admin(self) -> bool:
        return self.role == self.ROLE_ADMIN


class Invitation(models.Model):
    """A one-time link that makes its holder a member of `org` with `role`. Only the hash of the
    link's secret is stored; the link is shown and emailed once, when made. Used once
    (`accepted`), withdrawn (`revoked`) or past `expires`, it opens nothing."""

    code = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    org = models.ForeignKey(Organisation, models.CASCADE, related_name="invitations")
    email = models.EmailField()
    role = models.CharField(
        max_length=16, choices=Membership.ROLE_CHOICES, default=Membership.ROLE_CUSTOMER
    )
    secret_sha256 = models.CharField(max_length=64, unique=True)
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created = models.DateTimeField(default=timezone.now)
    expires = models.DateTimeField()
    accepted = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, models.SET_NULL, null=True, blank=True, related_name="+"
    )
    revoked = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"invitation of {self.email} to {self.org} ({self.role})"

    @staticmethod
    def new_secret() -> tuple[str, str]:
        """(secret, its sha256) for a fresh link."""
        secret = secrets.token_urlsafe(32)
        return secret, sha256_hex(secret)

    @property
    def state(self) -> str:
        """ "accepted", "revoked", "expired" or "open"."""
        if self.accepted is not None:
            return "accepted"
        if self.revoked is not None:
            return "revoked"
        if self.expires <= timezone.now():
            return "expired"
        return "open"


class ApiToken(models.Model):
    """A bearer token for the API and the command line. Only a hash of the key is stored; the key
    is shown once, when made. Keys look like `ptxf_<prefix>_<secret>`."""

    code = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=12, db_index=True)
    key_sha256 = models.CharField(max_length=64, unique=True)
    created = models.DateTimeField(default=timezone.now)
    last_used = models.DateTimeField(null=True, blank=True)
    # Refused from this moment (settings.API_TOKEN_DAYS after it was made; null: never).
    expires = models.DateTimeField(null=True, blank=True)
    # "read": GET only; "write": all its user may do.
    scope = models.CharField(
        max_length=8, choices=[("read", "read only"), ("write", "read and write")], default="write"
    )

    def __str__(self) -> str:
        return f"{self.user} token {self.prefix}"

    @staticmethod
    def new_key() -> tuple[str, str, str]:
        """(key, prefix, key_sha256) for a fresh token."""
        prefix = secrets.token_hex(4)
        key = f"ptxf_{prefix}_{secrets.token_urlsafe(32)}"
        return key, prefix, sha256_hex(key)

    @classmethod
    def lookup(cls, key: str) -> ApiToken | None:
        if not key.startswith("ptxf_"):
            return None
        token = cls.objects.select_related("user").filter(key_sha256=sha256_hex(key)).first()
        if token is not None and token.expires is not None and token.expires <= timezone.now():
            return None  # expired: refused like a revoked key
        return token


# --- Workloads ----------------------------------------------------------------------------------


class Workload(models.Model):
    """A customer's operator: the manifest text is the source of truth (hashed in `sha256`); the
    optional baseline kernel is the customer's current implementation."""

    code = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    org = models.ForeignKey(Organisation, models.CASCADE, related_name="workloads")
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    manifest = models.TextField()
    sha256 = models.CharField(max_length=64)
    family = models.CharField(max_length=100, blank=True, db_index=True)
    tags = models.JSONField(default=list, blank=True)
    target_gpu = models.CharField(max_length=16, default="sm_90")
    baseline_source = models.TextField(blank=True)
    baseline_filename = models.CharField(max_length=200, blank=True)
    baseline_sha256 = models.CharField(max_length=64, blank=True)
    # Derived when written (portal.derived.row_lengths): the distinct lengths of the axis the
    # operator family splits on, from lowering the manifest; [] where no family lowers it.
    row_lengths = models.JSONField(default=list, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created"]
        constraints = [
            # The same manifest and kernel uploaded twice by one organisation is one workload.
            models.UniqueConstraint(
                fields=["org", "sha256", "baseline_sha256"], name="workload_org_content"
            )
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def shapes_label(self) -> str:
        """The manifest's shapes in a few characters ("16384x4096, 32768x4096"), to tell apart
        workloads of one name (an upload split by row length); "" when they cannot be read."""
        import tomllib

        try:
            shapes = tomllib.loads(self.manifest).get("shapes", [])
            label = ", ".join("x".join(str(v) for v in d.values()) for d in shapes)
        except (tomllib.TOMLDecodeError, AttributeError, TypeError):
            return ""
        return label if len(label) <= 80 else label[:79] + "…"

    def spec(self):
        """The validated factory.spec.Workload (parsed again from the stored text)."""
        from factory.spec import load_manifest

        return load_manifest(
            self.manifest,
            baseline_source=self.baseline_source or None,
            baseline_filename=self.baseline_filename or None,
        )


# --- Jobs ---------------------------------------------------------------------------------------


class Job(models.Model):
    QUEUED = "queued"
    RUNNING = "running"  # proposing, building or recording a generation
    WAITING_GPU = "waiting_gpu"  # a batch is out to a GPU worker (or to an air-gapped host)
    REVIEW = "review"  # the search stopped; an engineer reviews the best candidate
    APPROVED = "approved"
    REJECTED = "rejected"
    FAILED = "failed"
    CANCELLED = "cancelled"
    STATUS_CHOICES = [
        (QUEUED, "Queued"),
        (RUNNING, "Running"),
        (WAITING_GPU, "Waiting for GPU results"),
        (REVIEW, "In review"),
        (APPROVED, "Approved"),
        (REJECTED, "Rejected"),
        (FAILED, "Failed"),
        (CANCELLED, "Cancelled"),
    ]
    TRANSITIONS = {
        QUEUED: {RUNNING, CANCELLED, FAILED},
        RUNNING: {WAITING_GPU, REVIEW, FAILED, CANCELLED},
        WAITING_GPU: {RUNNING, REVIEW, FAILED, CANCELLED},
        REVIEW: {APPROVED, REJECTED, RUNNING},
        APPROVED: set(),
        REJECTED: {RUNNING},
        FAILED: set(),
        CANCELLED: set(),
    }
    ACTIVE = (QUEUED, RUNNING, WAITING_GPU)
    FINISHED = (APPROVED, REJECTED, FAILED, CANCELLED)

    # What the job is doing now, for the progress display and the stuck-work sweep.
    STAGE_PROPOSING = "proposing"
    STAGE_BUILDING = "building"
    STAGE_GPU = "gpu"
    STAGE_RECORDING = "recording"
    STAGE_DONE = "done"

    code = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    workload = models.ForeignKey(Workload, models.CASCADE, related_name="jobs")
    status = models.CharField(max_length=16, choices=STATUS_CHOICES, default=QUEUED)
    stage = models.CharField(max_length=16, blank=True)
    target_gpu = models.CharField(max_length=16, default="sm_90")
    backend = models.CharField(max_length=16, default="offline")
    seed = models.BigIntegerField(default=0)
    max_generations = models.PositiveIntegerField(default=4)
    population = models.PositiveIntegerField(default=8)
    deadline = models.DateTimeField(null=True, blank=True)
    current_generation = models.IntegerField(default=-1)
    stop_reason = models.CharField(max_length=300, blank=True)
    best_candidate = models.ForeignKey(
        "Candidate", models.SET_NULL, null=True, blank=True, related_name="+"
    )
    # Derived when a generation finishes (portal.derived.rank_correlation): the cost model's
    # Spearman rank correlation with the measured times over every verified candidate it ranked.
    model_rho = models.FloatField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created = models.DateTimeField(default=timezone.now)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)
    updated = models.DateTimeField(default=timezone.now)
    # Set when someone of its organisation archived it: hidden from the default job list, shown
    # under the list's "archived" filter, restorable (cleared). Nothing else changes.
    archived = models.DateTimeField(null=True, blank=True, db_index=True)
    # The heartbeat of a running stage (agents writing, a compile, a GPU batch): when it last
    # said it is alive and what it is; cleared when the stage ends. The sweep re-queues a stage
    # silent for too long, and fails the job after `silent_requeues` reaches its limit
    # (portal.pipeline.sweep_silent).
    heartbeat = models.DateTimeField(null=True, blank=True, db_index=True)
    heartbeat_by = models.CharField(max_length=200, blank=True)
    silent_requeues = models.PositiveSmallIntegerField(default=0)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.workload.name} job {str(self.code)[:8]}"

    @property
    def org(self) -> Organisation:
        return self.workload.org

    def can_move_to(self, status: str) -> bool:
        return status in self.TRANSITIONS[self.status]

    def claim(self, from_statuses, to_status: str, **fields) -> bool:
        """Move this job to `to_status` only if it is still in one of `from_statuses`, in one
        conditional UPDATE. False means another worker got there first: give up."""
        now = timezone.now()
        updated = Job.objects.filter(pk=self.pk, status__in=list(from_statuses)).update(
            status=to_status, updated=now, **fields
        )
        if updated:
            self.refresh_from_db()
        return bool(updated)

    @property
    def is_active(self) -> bool:
        return self.status in self.ACTIVE


class Generation(models.Model):
    PROPOSING = "proposing"
    BUILDING = "building"
    GPU = "gpu"  # the batch is out
    DONE = "done"  # results recorded
    STATUS_CHOICES = [
        (PROPOSING, "Proposing"),
        (BUILDING, "Building"),
        (GPU, "On the GPU"),
        (DONE, "Done"),
    ]

    job = models.ForeignKey(Job, models.CASCADE, related_name="generations")
    index = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=STATUS_CHOICES, default=PROPOSING)
    best_candidate = models.ForeignKey(
        "Candidate", models.SET_NULL, null=True, blank=True, related_name="+"
    )
    best_score_us = models.FloatField(null=True, blank=True)
    # Derived when it finishes: the cost model's rank correlation over this generation's verified
    # candidates (None with fewer than three ranked).
    model_rho = models.FloatField(null=True, blank=True)
    # What the agents spent proposing this generation (factory.loop's ProposeReport.usage:
    # tokens_in, tokens_out, cost_usd, and with a model backend its model and requests), tokens
    # of answers that produced no kernel included; {} before it was proposed.
    usage = models.JSONField(default=dict, blank=True)
    created = models.DateTimeField(default=timezone.now)
    updated = models.DateTimeField(default=timezone.now)
    finished = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["job", "index"]
        constraints = [
            models.UniqueConstraint(fields=["job", "index"], name="generation_job_index")
        ]

    def __str__(self) -> str:
        return f"generation {self.index} of {self.job}"

    def claim(self, from_statuses, to_status: str) -> bool:
        updated = Generation.objects.filter(pk=self.pk, status__in=list(from_statuses)).update(
            status=to_status, updated=timezone.now()
        )
        if updated:
            self.refresh_from_db()
        return bool(updated)


class Candidate(models.Model):
    PROPOSED = "proposed"  # written by an agent, not yet compiled
    REJECTED = "rejected"  # refused before GPU time (compile error, static check, reviewer)
    COMPILED = "compiled"  # compiled and passed review; waits for a batch
    QUEUED = "queued"  # in a GPU batch
    PASSED = "passed"  # verified at every shape and timed
    FAILED = "failed"  # failed on the GPU (wrong, crashed, timed out)
    STATUS_CHOICES = [
        (PROPOSED, "Proposed"),
        (REJECTED, "Rejected"),
        (COMPILED, "Compiled"),
        (QUEUED, "Queued for GPU"),
        (PASSED, "Passed"),
        (FAILED, "Failed"),
    ]
    SETTLED = (REJECTED, PASSED, FAILED)

    @property
    def settled(self) -> bool:
        """Refused, verified or failed: nothing more will happen to it."""
        return self.status in self.SETTLED

    code = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    job = models.ForeignKey(Job, models.CASCADE, related_name="candidates")
    generation = models.ForeignKey(Generation, models.CASCADE, related_name="candidates")
    ptx = models.TextField()
    ptx_sha256 = models.CharField(max_length=64)
    parent = models.ForeignKey(
        "self", models.SET_NULL, null=True, blank=True, related_name="children"
    )
    role = models.CharField(max_length=32, blank=True)  # planner, writer, tuner, baseline...
    backend = models.CharField(max_length=32, blank=True)  # offline, anthropic
    schedule = models.JSONField(default=dict, blank=True)
    # Derived when stored (portal.derived.schedule_label): the schedule in a few words, through
    # its operator family.
    schedule_label = models.CharField(max_length=200, blank=True)
    note = models.TextField(blank=True)
    entry = models.CharField(max_length=200, blank=True)
    params = models.JSONField(null=True, blank=True)
    launch = models.JSONField(null=True, blank=True)
    compile_report = models.JSONField(null=True, blank=True)
    review = models.JSONField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=STATUS_CHOICES, default=PROPOSED)
    reason = models.TextField(blank=True)
    gpu_status = models.CharField(max_length=16, blank=True)  # passed|failed|crashed|timeout...
    # Geometric mean of the median runtimes over the benchmarked shapes: the rank of a candidate.
    score_us = models.FloatField(null=True, blank=True)
    # The cost model's predicted time when the agents proposed it (summed over the shapes; None
    # before the model had evidence to fit): set against score_us, it tracks the model's accuracy.
    predicted_us = models.FloatField(null=True, blank=True)
    tokens_in = models.PositiveIntegerField(default=0)
    tokens_out = models.PositiveIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=10, decimal_places=6, default=0)
    created = models.DateTimeField(default=timezone.now)
    updated = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["job", "generation__index", "created"]
        constraints = [
            models.UniqueConstraint(fields=["job", "ptx_sha256"], name="candidate_job_ptx")
        ]

    def __str__(self) -> str:
        return f"candidate {str(self.code)[:8]} ({self.status})"

    @property
    def compile_summary(self) -> CompileSummary | None:
        return CompileSummary.from_json(self.compile_report)

    def claim(self, from_statuses, to_status: str, **fields) -> bool:
        updated = Candidate.objects.filter(pk=self.pk, status__in=list(from_statuses)).update(
            status=to_status, updated=timezone.now(), **fields
        )
        if updated:
            self.refresh_from_db()
        return bool(updated)


class GpuBatch(models.Model):
    """One batch file sent to a GPU worker (or exported to an air-gapped host); `code` is the
    batch_id of the batch and results files."""

    PENDING = "pending"
    DISPATCHED = "dispatched"
    RECORDED = "recorded"
    STATUS_CHOICES = [(PENDING, "Pending"), (DISPATCHED, "Dispatched"), (RECORDED, "Recorded")]

    code = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    job = models.ForeignKey(Job, models.CASCADE, related_name="batches")
    generation = models.ForeignKey(Generation, models.CASCADE, related_name="batches")
    arch = models.CharField(max_length=16, default="sm_90")
    status = models.CharField(max_length=16, choices=STATUS_CHOICES, default=PENDING)
    batch = models.JSONField(default=dict)
    results = models.JSONField(null=True, blank=True)
    source = models.CharField(max_length=16, blank=True)  # "worker" or "import"
    environment = models.ForeignKey(
        "Environment", models.SET_NULL, null=True, blank=True, related_name="batches"
    )
    created = models.DateTimeField(default=timezone.now)
    dispatched = models.DateTimeField(null=True, blank=True)
    # When a GPU worker took the batch off its queue, and which one (the worker says so as it
    # starts; cleared when the batch goes back to the queue). Dispatched but not started: it
    # waits in line, or for an imported results file.
    started = models.DateTimeField(null=True, blank=True)
    worker = models.CharField(max_length=200, blank=True)
    # Why the last GPU worker to take it stopped without results (a worker bug, a time limit);
    # the batch then waits to be sent again or for an imported results file.
    error = models.CharField(max_length=500, blank=True)
    finished = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "generation"], name="gpubatch_job_generation")
        ]

    def __str__(self) -> str:
        return f"batch {str(self.code)[:8]} ({self.status})"


class Environment(models.Model):
    """Where a measurement was taken: GPU, driver and library versions (clock and times are kept
    per measurement, not here). Unique by the hash of its canonical JSON."""

    # Per batch, not per machine: clocks, times, and the worker's restart bookkeeping.
    VOLATILE_KEYS = (
        "sm_clock_mhz",
        "started_at",
        "finished_at",
        "hostname",
        "worker_restarts",
        "restart_s",
        "restart_log",
        "warm_spare",
        "spares_started",
        "spare_disabled",
    )

    gpu = models.CharField(max_length=100)
    sm = models.CharField(max_length=16, blank=True)
    driver = models.CharField(max_length=50, blank=True)
    versions = models.JSONField(default=dict)
    sha256 = models.CharField(max_length=64, unique=True)
    created = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.gpu} ({self.sm}, driver {self.driver})"

    @classmethod
    def describe(cls, env: dict, timing_protocol: dict | None = None) -> dict:
        """The stable part of a results file's `env`, with how it timed (the L2 flush: a write
        flush adds ~4 us to every 256 MB kernel, so the two are not the same measurement)."""
        out = {k: v for k, v in env.items() if k not in cls.VOLATILE_KEYS}
        if timing_protocol and timing_protocol.get("l2_flush"):
            out["l2_flush"] = str(timing_protocol["l2_flush"])
        return dict(sorted(out.items()))


class VerificationResult(models.Model):
    candidate = models.ForeignKey(Candidate, models.CASCADE, related_name="verifications")
    batch = models.ForeignKey(GpuBatch, models.CASCADE, related_name="verifications")
    dims_key = models.CharField(max_length=200)
    dims = models.JSONField(default=dict)
    heldout = models.BooleanField(default=False)
    passed = models.BooleanField(default=False)
    rel_err = models.FloatField(null=True, blank=True)
    max_abs_err = models.FloatField(null=True, blank=True)
    reason = models.TextField(blank=True)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["candidate", "dims_key", "batch"], name="verification_candidate_dims"
            )
        ]


class Baseline(models.Model):
    """A reference implementation we time against: the customer's kernel, torch eager,
    torch.compile, Triton... one row per (name, version, configuration)."""

    name = models.CharField(max_length=64)
    version = models.CharField(max_length=64, blank=True)
    config = models.JSONField(default=dict, blank=True)
    config_sha256 = models.CharField(max_length=64)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["name", "version", "config_sha256"], name="baseline_identity"
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} {self.version}".strip()


class BaselineMeasurement(models.Model):
    baseline = models.ForeignKey(Baseline, models.CASCADE, related_name="measurements")
    job = models.ForeignKey(Job, models.CASCADE, related_name="baseline_measurements")
    batch = models.ForeignKey(GpuBatch, models.CASCADE, related_name="baseline_measurements")
    status = models.CharField(max_length=16)
    reason = models.TextField(blank=True)
    verification = models.JSONField(default=list, blank=True)
    score_us = models.FloatField(null=True, blank=True)
    environment = models.ForeignKey(Environment, models.SET_NULL, null=True, blank=True)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["baseline", "batch"], name="baselinemeasurement_batch")
        ]


class TimingResult(models.Model):
    """One timed shape, of a candidate or of a baseline measurement, with the raw samples."""

    candidate = models.ForeignKey(
        Candidate, models.CASCADE, null=True, blank=True, related_name="timings"
    )
    baseline_measurement = models.ForeignKey(
        BaselineMeasurement, models.CASCADE, null=True, blank=True, related_name="timings"
    )
    batch = models.ForeignKey(GpuBatch, models.CASCADE, related_name="timings")
    dims_key = models.CharField(max_length=200)
    dims = models.JSONField(default=dict)
    median_us = models.FloatField()
    p20_us = models.FloatField(null=True, blank=True)
    p80_us = models.FloatField(null=True, blank=True)
    ci_low_us = models.FloatField(null=True, blank=True)
    ci_high_us = models.FloatField(null=True, blank=True)
    samples_us = models.JSONField(default=list, blank=True)
    bytes = models.BigIntegerField(null=True, blank=True)
    tbps = models.FloatField(null=True, blank=True)
    sm_clock_mhz = models.IntegerField(null=True, blank=True)
    environment = models.ForeignKey(Environment, models.SET_NULL, null=True, blank=True)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=(
                    models.Q(candidate__isnull=False, baseline_measurement__isnull=True)
                    | models.Q(candidate__isnull=True, baseline_measurement__isnull=False)
                ),
                name="timing_of_one_thing",
            ),
            models.UniqueConstraint(
                fields=["candidate", "batch", "dims_key"],
                condition=models.Q(candidate__isnull=False),
                name="timing_candidate_dims",
            ),
            models.UniqueConstraint(
                fields=["baseline_measurement", "dims_key"],
                condition=models.Q(baseline_measurement__isnull=False),
                name="timing_baseline_dims",
            ),
        ]


class Flag(models.Model):
    """A plausibility warning raised by the GPU worker (above the copy ceiling, suspiciously
    faster than an expert baseline...). A flagged candidate needs an engineer's eye."""

    candidate = models.ForeignKey(Candidate, models.CASCADE, related_name="flags")
    batch = models.ForeignKey(GpuBatch, models.CASCADE, related_name="flags")
    kind = models.CharField(max_length=64)
    message = models.TextField()
    message_sha256 = models.CharField(max_length=64)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["candidate", "batch", "message_sha256"], name="flag_identity"
            )
        ]


# --- Review and delivery ------------------------------------------------------------------------


class ReviewDecision(models.Model):
    APPROVE = "approve"
    REJECT = "reject"
    DECISION_CHOICES = [(APPROVE, "Approve"), (REJECT, "Reject")]
    # What an engineer confirms before approving.
    CHECKLIST = (
        ("verified_all_shapes", "Verified at every benchmarked and held-out shape"),
        ("flags_explained", "Every plausibility flag is explained"),
        ("ptx_read", "The PTX was read: no shape-specialised tricks"),
        ("faster_than_baselines", "Faster than the baselines, within the physical limit"),
    )

    code = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    job = models.ForeignKey(Job, models.CASCADE, related_name="reviews")
    candidate = models.ForeignKey(Candidate, models.CASCADE, related_name="reviews")
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, models.PROTECT, related_name="+")
    decision = models.CharField(max_length=16, choices=DECISION_CHOICES)
    comment = models.TextField(blank=True)
    checklist = models.JSONField(default=dict, blank=True)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created"]


class Artifact(models.Model):
    """The delivered bundle of an approved candidate. Customers download only these."""

    code = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    job = models.ForeignKey(Job, models.CASCADE, related_name="artifacts")
    candidate = models.ForeignKey(Candidate, models.CASCADE, related_name="artifacts")
    filename = models.CharField(max_length=200)
    sha256 = models.CharField(max_length=64)
    size_bytes = models.BigIntegerField(default=0)
    file = models.FileField(upload_to="artifacts/%Y/%m/")
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "sha256"], name="artifact_job_sha256")
        ]

    def __str__(self) -> str:
        return self.filename


class AuditEvent(models.Model):
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, models.SET_NULL, null=True, blank=True, related_name="+"
    )
    org = models.ForeignKey(
        Organisation, models.SET_NULL, null=True, blank=True, related_name="audit_events"
    )
    verb = models.CharField(max_length=64)  # workload.create, job.start, review.approve...
    target = models.CharField(max_length=200, blank=True)  # "job:<code>"
    data = models.JSONField(default=dict, blank=True)
    created = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.created:%Y-%m-%d %H:%M} {self.actor} {self.verb} {self.target}"


class NotificationSettings(models.Model):
    """Which emails a user wants (all of them until they say otherwise); the address is the
    user's own `email`."""

    REVIEW = "review"
    DECISION = "decision"
    FAILED = "failed"

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, models.CASCADE, related_name="notification_settings"
    )
    email_on_review = models.BooleanField(default=True)
    email_on_decision = models.BooleanField(default=True)
    email_on_failure = models.BooleanField(default=True)

    @classmethod
    def wants(cls, user, event: str) -> bool:
        """Whether `user` wants the email of `event` (REVIEW, DECISION or FAILED)."""
        row = cls.objects.filter(user=user).first()
        if row is None:
            return True
        return {
            cls.REVIEW: row.email_on_review,
            cls.DECISION: row.email_on_decision,
            cls.FAILED: row.email_on_failure,
        }.get(event, True)
