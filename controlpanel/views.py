"""The audit log and the health endpoint (the home dashboard lives in the top app, ``home``)."""

from django.contrib.auth.decorators import login_not_required, permission_required
from django.core.paginator import Paginator
from django.db import connection
from django.http import JsonResponse, StreamingHttpResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache

from controlpanel import services
from controlpanel.forms import AuditFilterForm


@permission_required("controlpanel.view_auditentry", raise_exception=True)
def audit_log(request):
    form = AuditFilterForm(request.GET)
    if not form.is_valid():
        # Invalid filters list nothing: an unfiltered log could pass for the filtered one.
        return render(request, "controlpanel/audit_log.html", {"form": form}, status=400)
    entries = services.audit_entries(form.cleaned_data)
    page = Paginator(entries, 50).get_page(request.GET.get("page"))
    page.object_list = services.audit_page_rows(page.object_list)
    return render(request, "controlpanel/audit_log.html", {"form": form, "page": page})


@permission_required("controlpanel.view_auditentry", raise_exception=True)
def audit_export(request, fmt: str):
    """The filtered log as CSV (streamed) or JSON (at most AUDIT_EXPORT_LIMIT entries)."""
    form = AuditFilterForm(request.GET)
    if not form.is_valid():
        return JsonResponse({"errors": form.errors.get_json_data()}, status=400)
    entries = services.audit_entries(form.cleaned_data)
    filename = services.audit_export_filename(fmt)
    if fmt == "csv":
        response = StreamingHttpResponse(
            services.audit_csv_lines(entries), content_type="text/csv; charset=utf-8"
        )
    else:
        filters = {k: v for k, v in request.GET.items() if k != "page" and v}
        response = JsonResponse(services.audit_json_export(entries, filters))
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


@login_not_required
@never_cache
def healthz(request):
    """Liveness for load balancers and compose: the process answers and the database does."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return JsonResponse({"status": "ok"})
    except Exception as exc:  # noqa: BLE001 - the answer is the point
        return JsonResponse({"status": "error", "database": str(exc)}, status=503)
