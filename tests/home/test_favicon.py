"""The favicon: linked from every page, and /favicon.ico answers without a login."""

import pytest
from django.contrib.staticfiles import finders
from django.urls import reverse

pytestmark = pytest.mark.django_db


def test_favicon_ico_redirects_to_the_static_icon_without_a_login(client):
    response = client.get("/favicon.ico")
    assert response.status_code == 301
    assert response["Location"].endswith("controlpanel/favicon.svg")
    assert finders.find("controlpanel/favicon.svg"), "the icon the redirect names must exist"


def test_every_page_links_the_icon(client, viewer):
    login = client.get(reverse("login")).content.decode()
    assert 'rel="icon"' in login and "controlpanel/favicon.svg" in login
    client.force_login(viewer)
    dashboard = client.get(reverse("dashboard")).content.decode()
    assert 'rel="icon"' in dashboard
