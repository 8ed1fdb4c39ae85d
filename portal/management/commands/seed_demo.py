from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from portal import services
from portal.models import Membership

# Demo accounts: fixed so the README can name them. They exist only in the embedded default
# (SQLite under var/, no PRODUCTION, DEBUG not switched off): `settings.DEMO_ACCOUNTS`.
# `demo` is an admin of Acme (a customer who also manages the team) so that a stranger trying the
# portal sees the Team page and its invitations too.
DEMO_USERS = (
    # username, password, organisation, role, staff
    ("demo", "demo-pass-2026", "Acme", Membership.ROLE_ADMIN, False),
    ("engineer", "engineer-pass-2026", "Acme", Membership.ROLE_ENGINEER, True),
    ("outsider", "outsider-pass-2026", "Globex", Membership.ROLE_CUSTOMER, False),
)


def demo_accounts_create() -> list[str]:
    """Create the demo organisations and users that do not exist yet; returns the usernames
    made. An account that exists is left as it is (its password may have been changed). Never
    a superuser: `engineer` is an engineer of Acme and staff, no more."""
    User = get_user_model()
    made = []
    with transaction.atomic():
        for username, password, org_name, role, staff in DEMO_USERS:
            if User.objects.filter(username=username).exists():
                continue
            org = services.organisation_create(name=org_name)
            user = User.objects.create_user(username=username, password=password)
            user.is_staff = staff
            user.is_superuser = False
            user.save(update_fields=["is_staff", "is_superuser"])
            services.membership_set(user=user, org=org, role=role)
            made.append(username)
    return made


def demo_accounts_disable() -> int:
    """Outside the embedded default the published demo logins must not work: any demo account
    left from an embedded run is deactivated with an unusable password. Returns how many."""
    User = get_user_model()
    disabled = 0
    for user in User.objects.filter(username__in=[u[0] for u in DEMO_USERS]):
        if user.check_password(dict((u[0], u[1]) for u in DEMO_USERS)[user.username]):
            user.set_unusable_password()
            user.is_active = False
            user.is_superuser = False
            user.save(update_fields=["password", "is_active", "is_superuser"])
            disabled += 1
    return disabled


class Command(BaseCommand):
    help = (
        "Create the demo organisations and users once (embedded default only) and print the "
        "logins. Refused with DEBUG=0, PRODUCTION=1 or a DATABASE_URL."
    )

    def handle(self, *args, **opts):
        if not settings.DEMO_ACCOUNTS:
            raise CommandError(
                "demo accounts exist only in the embedded default (no DATABASE_URL, no "
                "PRODUCTION, DEBUG not 0): their passwords are published in the README"
            )
        demo_accounts_create()
        from portal.demo_example import demo_example_seed  # the finished example job (issue 52)

        if demo_example_seed():
            self.stdout.write("  the finished example: a softmax job with recorded H200 results")
        for username, password, org_name, role, _ in DEMO_USERS:
            self.stdout.write(f"  {role:9} {username} / {password}  ({org_name})")
