"""Placeholder: the what-if pages (filled in by the what-if work)."""

from django.http import HttpResponse


def new(request, pk):
    return HttpResponse("")


detail = status = new
