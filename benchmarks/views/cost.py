"""STUB: being written."""

from django.http import HttpResponse


def cost(request, *args, **kwargs):
    return HttpResponse("not yet", status=501)


def price_list(request, *args, **kwargs):
    return HttpResponse("not yet", status=501)


def price_create(request, *args, **kwargs):
    return HttpResponse("not yet", status=501)


def price_edit(request, *args, **kwargs):
    return HttpResponse("not yet", status=501)


def price_delete(request, *args, **kwargs):
    return HttpResponse("not yet", status=501)
