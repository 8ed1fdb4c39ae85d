"""Writes about people and the job list: invitations to an organisation (made, withdrawn,
accepted), and archiving a job (hidden from the default list) or restoring it.

Who may do what, in one place (the pages call these and show what they refuse):

    customer   sees and uploads the organisation's workloads; archives its finished jobs
    admin      a customer who also invites people to the organisation (customer or admin)
               and changes or removes its customers and admins
    engineer   reviews every organisation's jobs; invites to any organisation (customer or
               admin; an engineer only when the inviter is staff)
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from portal.models import AuditEvent, Invitation, Job, Membership, Organisation, sha256_hex
from portal.selectors.scope import is_engineer, memberships

log = logging.getLogger("portal.accounts")

INVITATION_DAYS = 7


def _audit(actor, org, verb: str, target: str, **data) -> None:
    AuditEvent.objects.create(actor=actor, org=org, verb=verb, target=target, data=data)


# --- roles --------------------------------------------------------------------------------------


def admin_orgs(user) -> list[Organisation]:
    """The organisations `user` administers (an admin membership)."""
    return [m.org for m in memberships(user) if m.is_admin]


def invitable_orgs(user) -> list[Organisation]:
    """Where `user` may invite people: every organisation for an engineer, their own for an
    admin, none for a customer."""
    if is_engineer(user):
        return list(Organisation.objects.order_by("name"))
    return sorted(admin_orgs(user), key=lambda o: o.name)


def invitable_roles(user) -> list[str]:
    """The roles `user` may hand out: customer and admin for an engineer or an admin, engineer
    too for a staff engineer (it opens every organisation's jobs)."""
    if is_engineer(user):
        roles = [Membership.ROLE_CUSTOMER, Membership.ROLE_ADMIN]
        if user.is_staff:
            roles.append(Membership.ROLE_ENGINEER)
        return roles
    if admin_orgs(user):
        return [Membership.ROLE_CUSTOMER, Membership.ROLE_ADMIN]
    return []


def may_manage(user, org: Organisation) -> bool:
    return any(o.id == org.id for o in invitable_orgs(user))


# --- invitations --------------------------------------------------------------------------------


def invitation_create(
    *, user, org: Organisation, email: str, role: str, days: int = INVITATION_DAYS
) -> tuple[Invitation, str]:
    """A new invitation and its secret (shown and emailed once; only its hash is kept). Raises
    PermissionDenied when `user` may not invite to `org` with `role`, ValidationError when the
    address is already a member there or has an open invitation."""
    if not may_manage(user, org) or role not in invitable_roles(user):
        raise PermissionDenied("You may not invite people to this organisation with that role.")
    email = email.strip()
    if Membership.objects.filter(org=org, user__email__iexact=email).exists():
        raise ValidationError(f"{email} is already a member of {org.name}.")
    now = timezone.now()
    if Invitation.objects.filter(
        org=org, email__iexact=email, accepted__isnull=True, revoked__isnull=True, expires__gt=now
    ).exists():
        raise ValidationError(
            f"{email} already has an open invitation to {org.name}: withdraw it to send another."
        )
    secret, digest = Invitation.new_secret()
    with transaction.atomic():
        invitation = Invitation.objects.create(
            org=org,
            email=email,
            role=role,
            secret_sha256=digest,
            invited_by=user,
            created=now,
            expires=now + timedelta(days=days),
        )
        _audit(user, org, "invitation.create", f"invitation:{invitation.code}", role=role)
    return invitation, secret


def invitation_email(*, invitation: Invitation, link: str) -> bool:
    """Email the link to the invited address; False when the mail could not be sent (the
    invitation stands: the page shows the link to pass on by hand)."""
    from django.core.mail import send_mail

    inviter = invitation.invited_by
    who = (inviter.get_full_name() or inviter.username) if inviter else "Someone"
    body = (
        f"{who} invites you to {invitation.org.name} on PTX Kernel Factory, as "
        f"{invitation.get_role_display().lower()}.\n\n"
        f"Open this link to choose a username and password (it works once, until "
        f"{invitation.expires:%Y-%m-%d %H:%M} UTC):\n\n{link}\n\n"
        "If you did not expect this, ignore the email: nothing happens without the link.\n"
    )
    try:
        send_mail(
            f"[PTX Kernel Factory] An invitation to {invitation.org.name}",
            body,
            None,
            [invitation.email],
        )
    except Exception:  # noqa: BLE001 - the invitation stands even if the mail server is down
        log.exception("could not email invitation %s", invitation.code)
        return False
    return True


def invitation_for_secret(secret: str) -> Invitation | None:
    """The invitation of a link's secret, whatever its state; None for an unknown secret."""
    if not secret or len(secret) > 200:
        return None
    return (
        Invitation.objects.select_related("org", "invited_by")
        .filter(secret_sha256=sha256_hex(secret))
        .first()
    )


def invitation_revoke(*, user, code) -> Invitation:
    invitation = Invitation.objects.select_related("org").filter(code=code).first()
    if invitation is None or not may_manage(user, invitation.org):
        raise PermissionDenied("No such invitation.")
    if invitation.state != "open":
        raise ValidationError(f"The invitation is {invitation.state}; nothing to withdraw.")
    Invitation.objects.filter(pk=invitation.pk, accepted__isnull=True).update(
        revoked=timezone.now()
    )
    _audit(user, invitation.org, "invitation.revoke", f"invitation:{invitation.code}")
    invitation.refresh_from_db()
    return invitation


def invitation_accept(*, secret: str, user=None, username: str = "", password: str = ""):
    """Use the link once: the signed-in `user` joins the organisation, or a new account is made
    from `username` and `password` with the invited address. Returns the member user. Raises
    ValidationError when the link is unknown, used, withdrawn or expired, or the username is
    taken. The link is claimed in one conditional UPDATE, so two tabs cannot both use it."""
    invitation = invitation_for_secret(secret)
    if invitation is None:
        raise ValidationError("This invitation link is not valid.")
    if invitation.state != "open":
        raise ValidationError(f"This invitation link has been {invitation.state} already.")
    User = get_user_model()
    try:
        with transaction.atomic():
            now = timezone.now()
            claimed = Invitation.objects.filter(
                pk=invitation.pk,
                accepted__isnull=True,
                revoked__isnull=True,
                expires__gt=now,
            ).update(accepted=now)
            if not claimed:
                raise ValidationError("This invitation link has just been used or withdrawn.")
            if user is None:
                user = User.objects.create_user(
                    username=username, email=invitation.email, password=password
                )
            elif not user.email:
                User.objects.filter(pk=user.pk).update(email=invitation.email)
            membership, made = Membership.objects.get_or_create(
                user=user, org=invitation.org, defaults={"role": invitation.role}
            )
            if not made and membership.role != invitation.role:
                # Already a member: the invitation's role replaces the old one only upwards
                # from customer (an engineer invited as a customer stays an engineer).
                if membership.role == Membership.ROLE_CUSTOMER:
                    membership.role = invitation.role
                    membership.save(update_fields=["role"])
            Invitation.objects.filter(pk=invitation.pk).update(accepted_by=user)
            _audit(
                user,
                invitation.org,
                "invitation.accept",
                f"invitation:{invitation.code}",
                role=invitation.role,
            )
    except IntegrityError:
        raise ValidationError("That username is taken; choose another.") from None
    if hasattr(user, "_ptxf_memberships"):
        del user._ptxf_memberships  # the cached memberships are stale now
    return user


def membership_change(*, user, membership: Membership, role: str | None) -> Membership | None:
    """Give a member of an organisation another role (`role`), or take them out of it
    (`role` None). Whoever may invite to the organisation may do it, within the roles they may
    hand out: an admin never touches an engineer's membership nor makes one, and nobody
    changes their own membership here. Returns the membership (None once removed)."""
    if not may_manage(user, membership.org):
        raise PermissionDenied("You may not change this organisation's members.")
    if membership.user_id == user.id:
        raise ValidationError("You cannot change your own membership here.")
    roles = invitable_roles(user)
    if membership.role not in roles or (role is not None and role not in roles):
        raise PermissionDenied("You may not change a member to or from that role.")
    target = f"membership:{membership.user.get_username()}@{membership.org.code}"
    if role is None:
        membership.delete()
        _audit(user, membership.org, "membership.remove", target)
        return None
    old = membership.role
    Membership.objects.filter(pk=membership.pk).update(role=role)
    membership.refresh_from_db()
    _audit(user, membership.org, "membership.role", target, old=old, new=role)
    return membership


def team_members(org: Organisation):
    return (
        Membership.objects.filter(org=org).select_related("user").order_by("role", "user__username")
    )


def team_invitations(org: Organisation, limit: int = 50):
    return Invitation.objects.filter(org=org).select_related("invited_by")[:limit]


# --- archiving jobs -----------------------------------------------------------------------------


class ArchiveRefused(Exception):
    """The job cannot be archived now (it is still searching)."""


def job_archive(*, user, job: Job) -> Job:
    """Hide a job from the default list (it stays whole: pages, artifact, API). A job still
    searching is refused: stop or cancel it first. `job` must be one the user may see."""
    if job.status in Job.ACTIVE:
        raise ArchiveRefused("The job is still searching: stop or cancel it before archiving it.")
    Job.objects.filter(pk=job.pk, archived__isnull=True).update(archived=timezone.now())
    _audit(user, job.workload.org, "job.archive", f"job:{job.code}")
    job.refresh_from_db()
    return job


def job_restore(*, user, job: Job) -> Job:
    """Back onto the default list."""
    Job.objects.filter(pk=job.pk).update(archived=None)
    _audit(user, job.workload.org, "job.restore", f"job:{job.code}")
    job.refresh_from_db()
    return job
