"""STUB: being written."""

from django.http import HttpResponse


def run_list(request, *args, **kwargs):
    return HttpResponse("not yet", status=501)


def compare(request, *args, **kwargs):
    return HttpResponse("not yet", status=501)


def run_import(request, *args, **kwargs):
    return HttpResponse("not yet", status=501)


def export_json(request, *args, **kwargs):
    return HttpResponse("not yet", status=501)


def export_csv(request, *args, **kwargs):
    return HttpResponse("not yet", status=501)
