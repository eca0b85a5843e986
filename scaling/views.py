"""Placeholder: the scaling pages (filled in by the pages work)."""

from django.http import HttpResponse


def fleet(request):
    return HttpResponse("")


deployment = policy_edit = signals_json = export = fleet
