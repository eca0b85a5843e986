"""The cost page (what a benchmarked config costs per unit of useful work) and the price list."""

from django.contrib import messages
from django.contrib.auth.decorators import permission_required
from django.db import IntegrityError
from django.shortcuts import get_object_or_404, redirect, render

from benchmarks.forms.cost import CostForm, PriceForm
from benchmarks.models import Price
from benchmarks.services import cost_report
from benchmarks.services import prices as services


@permission_required("benchmarks.view_benchmarkrun", raise_exception=True)
def cost(request):
    form = CostForm(request.GET)
    report = cost_report.cost_report(**form.report_arguments()) if form.is_valid() else None
    query = request.GET.copy()
    query.pop("focus", None)
    context = {**cost_report.fleet_summary(), "form": form, "report": report, "query": query}
    return render(request, "benchmarks/cost.html", context)


@permission_required("benchmarks.view_price", raise_exception=True)
def price_list(request):
    prices = Price.objects.prefetch_related("hosts")
    return render(request, "benchmarks/price_list.html", {"rows": services.price_rows(prices)})


def _save(request, form, template, save, price=None):
    if request.method == "POST" and form.is_valid():
        try:
            saved = save(form)
        except IntegrityError:  # a concurrent writer took the same (name, pricing)
            form.add_error(None, PriceForm.Meta.error_messages["__all__"]["unique_together"])
        else:
            messages.success(request, f"Price {saved} saved.")
            return redirect("benchmarks:prices")
    return render(request, template, {"form": form, "price": price})


@permission_required("benchmarks.add_price", raise_exception=True)
def price_create(request):
    form = PriceForm(request.POST or None)
    return _save(
        request,
        form,
        "benchmarks/price_form.html",
        lambda f: services.create_price(request.user, f),
    )


@permission_required("benchmarks.change_price", raise_exception=True)
def price_edit(request, pk):
    price = get_object_or_404(Price, pk=pk)
    form = PriceForm(request.POST or None, instance=price)
    return _save(
        request,
        form,
        "benchmarks/price_form.html",
        lambda f: services.update_price(request.user, price, f),
        price,
    )


@permission_required("benchmarks.delete_price", raise_exception=True)
def price_delete(request, pk):
    price = get_object_or_404(Price.objects.prefetch_related("hosts"), pk=pk)
    if request.method == "POST":
        services.delete_price(request.user, price)
        messages.success(request, f"Price {price} deleted.")
        return redirect("benchmarks:prices")
    return render(request, "benchmarks/price_delete.html", {"price": price})
