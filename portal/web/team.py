"""The team page (members and invitations of an organisation, for its admins and for engineers)
and the page an invitation link opens. The rules of who may invite whom live in
`portal.accounts`; these views ask it and show its answers."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth import get_user_model, login, password_validation
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from portal import accounts
from portal.models import Membership, Organisation
from portal.web.views import _render

ROLE_HELP = {
    Membership.ROLE_CUSTOMER: "uploads workloads, follows jobs, downloads approved kernels",
    Membership.ROLE_ADMIN: "a customer who also invites people and sets their roles",
    Membership.ROLE_ENGINEER: "reviews and approves every organisation's kernels",
}


class InvitationForm(forms.Form):
    email = forms.EmailField(label="Email address", max_length=254)
    role = forms.ChoiceField(label="Role")
    org = forms.ChoiceField(label="Organisation")

    def __init__(self, *args, roles: list[str], orgs: list[Organisation], **kwargs):
        super().__init__(*args, **kwargs)
        labels = dict(Membership.ROLE_CHOICES)
        self.fields["role"].choices = [(r, labels[r]) for r in roles]
        self.fields["role"].help_text = "What each role may do: see Roles."
        self.fields["org"].choices = [(str(o.code), o.name) for o in orgs]
        self.orgs = {str(o.code): o for o in orgs}

    def clean_org(self):
        return self.orgs[self.cleaned_data["org"]]


class AcceptForm(forms.Form):
    """A new account for the invited address: a username and a password (twice)."""

    username = forms.CharField(label="Username", max_length=150)
    password1 = forms.CharField(
        label="Password",
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
        help_text=password_validation.password_validators_help_text_html(),
    )
    password2 = forms.CharField(
        label="The password again",
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
    )

    def clean_username(self):
        User = get_user_model()
        name = self.cleaned_data["username"].strip()
        field = User._meta.get_field(User.USERNAME_FIELD)
        for validator in field.validators:
            validator(name)
        if User.objects.filter(**{f"{User.USERNAME_FIELD}__iexact": name}).exists():
            raise ValidationError("That username is taken; choose another.")
        return name

    def clean(self):
        data = super().clean()
        one, two = data.get("password1"), data.get("password2")
        if one and two and one != two:
            self.add_error("password2", "The two passwords differ.")
        elif one:
            User = get_user_model()
            probe = User(username=data.get("username") or "")
            try:
                password_validation.validate_password(one, probe)
            except ValidationError as exc:
                self.add_error("password1", exc)
        return data


def _team_org(request, orgs: list[Organisation]) -> Organisation:
    """The organisation the page shows: ?org=<code> among those the user manages, else the
    user's own, else the first."""
    wanted = request.GET.get("org") or request.POST.get("org") or ""
    for org in orgs:
        if str(org.code) == wanted:
            return org
    own = {m.org_id for m in accounts.memberships(request.user)}
    return next((o for o in orgs if o.id in own), orgs[0])


@login_required
@require_http_methods(["GET", "POST"])
def team(request):
    """Members and invitations of an organisation; the form that invites someone."""
    orgs = accounts.invitable_orgs(request.user)
    if not orgs:
        raise Http404("No such page.")  # a customer: as if the page did not exist
    org = _team_org(request, orgs)
    roles = accounts.invitable_roles(request.user)
    form = InvitationForm(
        request.POST or None,
        roles=roles,
        orgs=orgs,
        initial={"org": str(org.code), "role": Membership.ROLE_CUSTOMER},
    )
    status = 200
    if request.method == "POST":
        if form.is_valid():
            data = form.cleaned_data
            try:
                invitation, secret = accounts.invitation_create(
                    user=request.user, org=data["org"], email=data["email"], role=data["role"]
                )
            except ValidationError as exc:
                form.add_error("email", exc)
                status = 400
            else:
                link = request.build_absolute_uri(reverse("web-invitation-accept", args=[secret]))
                sent = accounts.invitation_email(invitation=invitation, link=link)
                request.session["invitation_link"] = {"code": str(invitation.code), "link": link}
                if sent:
                    messages.success(request, f"Invitation emailed to {invitation.email}.")
                else:
                    messages.error(
                        request,
                        f"The email to {invitation.email} could not be sent: pass the link on "
                        "yourself.",
                    )
                return redirect(f"{reverse('web-team')}?org={invitation.org.code}")
        else:
            status = 400
    # The link of the invitation just made, shown once (the email may go astray).
    fresh = request.session.pop("invitation_link", None)
    context = {
        "org": org,
        "orgs": orgs,
        "form": form,
        "members": accounts.team_members(org),
        "roles": [(r, dict(Membership.ROLE_CHOICES)[r]) for r in roles],
        "role_keys": roles,
        "invitations": accounts.team_invitations(org),
        "fresh": fresh,
        "role_help": [(label, ROLE_HELP[key]) for key, label in Membership.ROLE_CHOICES],
        "days": accounts.INVITATION_DAYS,
    }
    return _render(request, "web/team.html", context, nav="team", status=status)


@login_required
@require_POST
def invitation_revoke(request, code):
    try:
        invitation = accounts.invitation_revoke(user=request.user, code=code)
    except PermissionDenied:
        raise Http404("No such invitation.") from None
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
        return redirect("web-team")
    messages.success(request, f"The invitation of {invitation.email} is withdrawn.")
    return redirect(f"{reverse('web-team')}?org={invitation.org.code}")


@login_required
@require_POST
def member_change(request, code, username):
    """Another role for a member of the organisation `code`, or out of it (role "remove")."""
    membership = (
        Membership.objects.select_related("org", "user")
        .filter(org__code=code, user__username=username)
        .first()
    )
    if membership is None or not accounts.may_manage(request.user, membership.org):
        raise Http404("No such member.")
    choice = request.POST.get("role", "")
    role = None if choice == "remove" else choice
    if role is not None and role not in dict(Membership.ROLE_CHOICES):
        messages.error(request, "Choose a role.")
        return redirect(f"{reverse('web-team')}?org={code}")
    try:
        accounts.membership_change(user=request.user, membership=membership, role=role)
    except PermissionDenied as exc:
        messages.error(request, str(exc))
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
    else:
        if role is None:
            messages.success(request, f"{username} is no longer a member of {membership.org}.")
        else:
            label = dict(Membership.ROLE_CHOICES)[role].lower()
            messages.success(request, f"{username} is now {label} of {membership.org}.")
    return redirect(f"{reverse('web-team')}?org={code}")


@require_http_methods(["GET", "POST"])
def invitation_accept(request, secret):
    """What an invitation link opens: a new account for the invited address, or (signed in)
    joining the organisation. Anything but an open invitation says why it opens nothing."""
    invitation = accounts.invitation_for_secret(secret)
    state = invitation.state if invitation else "unknown"
    signed_in = request.user.is_authenticated
    form = AcceptForm(request.POST or None) if not signed_in else None
    status = 200 if state == "open" else 410 if invitation else 404
    error = ""
    if request.method == "POST" and state == "open":
        try:
            if signed_in:
                user = accounts.invitation_accept(secret=secret, user=request.user)
            elif form.is_valid():
                user = accounts.invitation_accept(
                    secret=secret,
                    username=form.cleaned_data["username"],
                    password=form.cleaned_data["password1"],
                )
                login(request, user, backend="django.contrib.auth.backends.ModelBackend")
            else:
                user = None
                status = 400
        except ValidationError as exc:
            error = "; ".join(exc.messages)
            status = 400
        else:
            if user is not None:
                messages.success(
                    request,
                    f"Welcome to {invitation.org.name}: you are a "
                    f"{invitation.get_role_display().lower()} here.",
                )
                return redirect("web-home")
    context = {
        "invitation": invitation,
        "state": state,
        "form": form,
        "error": error,
        "role_help": ROLE_HELP.get(invitation.role, "") if invitation else "",
    }
    return _render(request, "web/invitation.html", context, status=status)
