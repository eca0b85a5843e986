"""The "New deployment" page of a host. Thin: access, the form, one service call."""

from django.contrib import messages
from django.contrib.auth.decorators import permission_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from hosts.forms_deployments import DeploymentForm
from hosts.models import Deployment, Host
from hosts.services import deployment_review as review
from hosts.services.deployments import DeploymentRefused, create_deployment, is_simulated


@permission_required("hosts.add_deployment", raise_exception=True)
def deployment_new(request, pk):
    """GET: the form. POST: create (or, with "Check fit", only say whether the model fits);
    on any refusal the form comes back with what was typed and the fit check."""
    host = get_object_or_404(Host, pk=pk)
    form = DeploymentForm(host, request.POST or None)
    fit = None
    if request.method == "POST" and form.is_valid():
        fit = form.fit()
        if "check_fit" not in request.POST:
            try:
                deployment, fit = create_deployment(request.user, host, form.deployment_data())
            except DeploymentRefused as refused:
                form.add_refusal(refused)
            except PermissionDenied as denied:  # options only an Admin may set
                form.add_refusal(DeploymentRefused({"settings": [str(denied)]}))
            else:
                say = messages.success if fit.fits else messages.warning
                if deployment.required_approvals:
                    say(
                        request,
                        f"Deployment {deployment.name} created: {host.name} is a production "
                        f"host, so its first start waits for {deployment.required_approvals} "
                        f"approvals. {fit.message}",
                    )
                else:
                    say(request, f"Deployment {deployment.name} created, starting. {fit.message}")
                return redirect(host)
    elif request.method == "POST":
        fit = form.fit()
    context = {"form": form, "host": host, "fit": fit, "simulated": is_simulated(host)}
    return render(request, "hosts/deployment_form.html", context)


@require_POST
@permission_required("hosts.approve_deployment", raise_exception=True)
def deployment_review(request, pk):
    """Approve or reject a new deployment's first start (the rule says who may)."""
    deployment = get_object_or_404(Deployment.objects.select_related("host"), pk=pk)
    decision = request.POST.get("decision")
    if decision not in ("approve", "reject"):
        messages.error(request, "Choose approve or reject.")
        return redirect(deployment.host)
    try:
        review.review_first_start(
            request.user, deployment, decision, request.POST.get("comment", "")[:2000]
        )
    except (PermissionDenied, review.ReviewRefused) as refused:
        messages.error(request, str(refused))
    else:
        deployment.refresh_from_db()
        messages.info(request, f"{deployment.name}: {deployment.status_detail}.")
    return redirect(deployment.host)
