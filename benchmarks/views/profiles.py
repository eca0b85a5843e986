"""STUB: being written."""

from django.http import HttpResponse


def profile_list(request, *args, **kwargs):
    return HttpResponse("not yet", status=501)


def profile_create(request, *args, **kwargs):
    return HttpResponse("not yet", status=501)


def profile_from_traffic(request, *args, **kwargs):
    return HttpResponse("not yet", status=501)


def profile_import(request, *args, **kwargs):
    return HttpResponse("not yet", status=501)


def profile_detail(request, *args, **kwargs):
    return HttpResponse("not yet", status=501)


def profile_edit(request, *args, **kwargs):
    return HttpResponse("not yet", status=501)


def profile_export(request, *args, **kwargs):
    return HttpResponse("not yet", status=501)
