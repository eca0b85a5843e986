"""The what-if pages: the form (roles that may run benchmarks), the plan's page and its status
for polling while the worker computes it (any role)."""

from __future__ import annotations

from django.contrib.auth.decorators import permission_required
from django.http import JsonResponse
from django.shortcuts import get_object_or_404, redirect, render

from hosts.models import Deployment
from scaling.forms_whatif import WhatIfForm
from scaling.models import WhatIfPlan
from scaling.services import whatif as services
from scaling.services.startup import engine_start_seconds

# Making a what-if runs the simulator on the worker, as a benchmark run does.
CREATE = "benchmarks.add_benchmarkrun"
VIEW = "hosts.view_deployment"


@permission_required(CREATE, raise_exception=True)
def new(request, pk):
    deployment = get_object_or_404(Deployment.objects.select_related("host"), pk=pk)
    form = WhatIfForm(
        request.POST or None, request.FILES or None, initial=services.form_initial(deployment)
    )
    if request.method == "POST" and form.is_valid():
        try:
            plan = services.create_plan(deployment, request.user, form.cleaned_data)
        except services.WhatIfInvalid as exc:
            for field, message in exc.errors.items():
                form.add_error(field or None, message)
        else:
            return redirect(plan)
    delay, basis = engine_start_seconds(deployment)
    context = {"deployment": deployment, "form": form, "delay": delay, "delay_basis": basis}
    return render(request, "scaling/whatif_new.html", context)


@permission_required(VIEW, raise_exception=True)
def detail(request, pk):
    plan = get_object_or_404(WhatIfPlan.objects.select_related("deployment__host"), pk=pk)
    done = plan.status == "succeeded" and plan.result
    context = {
        "plan": plan,
        "rows": services.rows(plan.result) if done else [],
        "figures": services.figures(plan.result) if done else None,
        "words": (plan.result or {}).get("words") if done else None,
        "traffic_words": services.traffic_words(plan.traffic),
    }
    return render(request, "scaling/whatif.html", context)


@permission_required(VIEW, raise_exception=True)
def status(request, pk):
    plan = get_object_or_404(WhatIfPlan, pk=pk)
    return JsonResponse(
        {
            "status": plan.status,
            "label": plan.get_status_display(),
            "finished": plan.is_finished,
            "progress": plan.progress,
            "error": plan.error,
        }
    )
