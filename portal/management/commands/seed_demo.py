from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from portal import services
from portal.models import Membership

# Demo accounts: fixed so the README can name them. Never used outside the embedded demo.
DEMO_USERS = (
    # username, password, organisation, role, staff
    ("demo", "demo-pass-2026", "Acme", Membership.ROLE_CUSTOMER, False),
    ("engineer", "engineer-pass-2026", "Acme", Membership.ROLE_ENGINEER, True),
    ("outsider", "outsider-pass-2026", "Globex", Membership.ROLE_CUSTOMER, False),
)


class Command(BaseCommand):
    help = "Create the demo organisations and users (idempotent) and print the logins."

    def handle(self, *args, **opts):
        User = get_user_model()
        with transaction.atomic():
            for username, password, org_name, role, staff in DEMO_USERS:
                org = services.organisation_create(name=org_name)
                user, _ = User.objects.get_or_create(username=username)
                user.set_password(password)
                user.is_staff = staff
                user.is_superuser = staff
                user.save()
                services.membership_set(user=user, org=org, role=role)
        for username, password, org_name, role, _ in DEMO_USERS:
            self.stdout.write(f"  {role:9} {username} / {password}  ({org_name})")
