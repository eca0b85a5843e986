"""STUB: being written."""

from django.http import HttpResponse


def run_new(request, *args, **kwargs):
    return HttpResponse("not yet", status=501)


def run_detail(request, *args, **kwargs):
    return HttpResponse("not yet", status=501)


def run_cancel(request, *args, **kwargs):
    return HttpResponse("not yet", status=501)


def run_timeline(request, *args, **kwargs):
    return HttpResponse("not yet", status=501)


def run_part(request, *args, **kwargs):
    return HttpResponse("not yet", status=501)
