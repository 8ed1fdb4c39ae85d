"""Pages load htmx and plotly.js from our own static files, never from a CDN."""

import re

import pytest
from django.contrib.staticfiles import finders
from django.urls import reverse

pytestmark = pytest.mark.django_db


def test_htmx_plotly_and_our_stylesheet_are_found_by_the_static_finders():
    for path in ("django_htmx/htmx-2.min.js", "vendor/plotly.min.js", "css/portal.css"):
        assert finders.find(path), path


def test_a_page_references_only_local_scripts_and_styles(client, customer):
    client.force_login(customer)
    html = client.get(reverse("web-home")).content.decode()
    sources = re.findall(r'(?:src|href)="([^"]+\.(?:js|css))"', html)
    assert sources and all(s.startswith("/static/") for s in sources), sources
