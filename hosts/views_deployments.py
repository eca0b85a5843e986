"""The "New deployment" page of a host. Thin: access, the form, one service call."""

from django.contrib import messages
from django.contrib.auth.decorators import permission_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect, render

from hosts.forms_deployments import DeploymentForm
from hosts.models import Host
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
                say(request, f"Deployment {deployment.name} created, starting. {fit.message}")
                return redirect(host)
    elif request.method == "POST":
        fit = form.fit()
    context = {"form": form, "host": host, "fit": fit, "simulated": is_simulated(host)}
    return render(request, "hosts/deployment_form.html", context)
