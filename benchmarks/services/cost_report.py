"""The cost page's report: the fleet's hourly bill and what each benchmarked config costs per
unit of useful work, ranked under an SLO among runs of one load profile. Prices come from
``benchmarks.services.prices``; the arithmetic lives in ``benchmarks.cost``; this module
fetches and arranges."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal

from django.conf import settings
from django.db.models import Count

from benchmarks import cost, cost_ranking
from benchmarks.choices import Pricing
from benchmarks.evidence import usable_as_evidence
from benchmarks.models import RUN_DOCUMENTS, BenchmarkRun, LoadProfile, Price
from benchmarks.services.prices import (
    DEFAULT_RUN_COUNT,
    PRICE_AS,
    PriceChoice,
    host_price_choices,
    same_gpus,
)
from benchmarks.services.prices import (
    listed as listed_price,
)
from controlpanel.choices import OperationStatus
from hosts.credentials import SECRET_FIELDS
from hosts.models import Deployment, Gpu, Host


def used_gpus_by_host() -> dict[int, int | None]:
    """{host pk: GPUs its deployments use}, None for "all of them" (a deployment given no
    GPUs by index runs on the whole host). Two queries whatever the fleet's size."""
    used: dict[int, int | None] = dict(
        Gpu.objects.filter(deployments__isnull=False)
        .values_list("host")
        .annotate(n=Count("pk", distinct=True))
        .order_by()
    )
    for host_id, assigned in Deployment.objects.annotate(n=Count("gpus")).values_list(
        "host_id", "n"
    ):
        if not assigned:
            used[host_id] = None
    return used


def fleet_summary() -> dict:
    """Each host's own hourly price per hour, per GPU-hour and per month (730 h), the share of
    it paying for GPUs no deployment uses, and the fleet's totals (hosts' prices are all in
    the panel's currency)."""
    hosts = list(Host.objects.annotate(gpu_count=Count("gpus")))
    used = used_gpus_by_host()
    currency = settings.PANEL_CURRENCY
    rows = []
    idle_total = Decimal("0")
    for host in hosts:
        per_gpu = host.hourly_price / host.gpu_count if host.gpu_count else None
        in_use = used.get(host.pk, 0)
        idle = (
            cost.idle_gpus(host.hourly_price, in_use, host.gpu_count)
            if in_use is not None
            else None
        )
        idle_text = ""
        if idle is not None and idle.partial:
            idle_total += idle.idle_price
            idle_text = (
                f"{idle.idle} of {idle.total} GPUs idle: {cost.money(idle.idle_price, currency)}"
                "/h not charged to any deployment"
            )
        rows.append(
            {
                "host": host,
                "per_gpu_hour": per_gpu,
                "per_month": host.hourly_price * cost.HOURS_PER_MONTH,
                "idle_text": idle_text,
            }
        )
    total = sum((h.hourly_price for h in hosts), Decimal("0"))
    return {
        "rows": rows,
        "total_hour": total,
        "total_month": total * cost.HOURS_PER_MONTH,
        "idle_hour": idle_total,
        "currency": currency,
    }


@dataclass
class CostReport:
    """The cost page's run table, ranking, charts and worked formulas."""

    currency: str
    pricing: str
    slo: cost_ranking.Slo
    metric: str
    utilisation: float
    restart_overhead: float
    price_as: str = "host"
    rows: list[dict] = field(default_factory=list)
    ranking: cost_ranking.Ranking | None = None
    focus: dict | None = None
    default_selection: bool = False
    scatter: dict | None = None
    bars: dict | None = None
    # The one load profile whose runs are ranked ("chat v3"), its pk, and why it is the one.
    profile: str | None = None
    profile_pk: int | None = None
    profile_note: str = ""

    @property
    def cheapest(self) -> dict | None:
        """The row (a run at a price) of the cheapest option meeting the SLO."""
        best = self.ranking.cheapest if self.ranking else None
        return next((row for row in self.rows if best and row["key"] == best.key), None)

    @property
    def left_out(self) -> list[dict]:
        """Rows priced in another currency than the panel's: shown, never ranked."""
        return [row for row in self.rows if row["currency"] != self.currency]

    @property
    def other_profiles(self) -> list[tuple[str, int]]:
        """(profile, runs) of the rows left out of the ranking for their profile."""
        counts: dict[str, set] = {}
        for row in self.rows:
            if self.ranking and row["key"] in self.ranking.other_profile:
                counts.setdefault(row["option"].profile or "no profile", set()).add(row["run"].pk)
        return sorted(((name, len(pks)) for name, pks in counts.items()), key=lambda p: -p[1])

    @property
    def pricing_label(self) -> str:
        return Pricing(self.pricing).label

    @property
    def price_as_label(self) -> str:
        return PRICE_AS[self.price_as]

    @property
    def metric_label(self) -> str:
        return cost.METRICS[self.metric]

    @property
    def serving_share(self) -> float:
        return self.utilisation * (1 - self.restart_overhead)


# What the cost page never reads: a run's documents, the config's and profile's documents, and
# the host's encrypted credentials (decrypted per row otherwise).
COST_DEFERRED = (
    *RUN_DOCUMENTS,
    "engine_config__settings",
    "engine_config__env",
    "engine_config__placement",
    "load_profile__spec",
    *(f"deployment__host__{name}" for name in SECRET_FIELDS),
)


def selected_runs(pks=None, profile=None):
    """The runs to price: ``pks`` (any with results), else the latest succeeded ones (of
    the ``profile`` pk when given); one query (two for the latest), with everything the
    table shows."""
    runs = (
        BenchmarkRun.objects.select_related("deployment__host", "engine_config", "load_profile")
        .defer(*COST_DEFERRED)
        .order_by("-created_at", "-pk")
    )
    if pks:
        return list(runs.filter(pk__in=list(pks)))
    # The newest succeeded runs' ids first: sorting the whole history on the narrow columns
    # is cheap; sorting it with each run's row (its JSON past the sort key) is not.
    newest = runs.filter(status=OperationStatus.SUCCEEDED)
    if profile is not None:
        newest = newest.filter(load_profile_id=profile)
    newest = newest.values_list("pk", flat=True)
    return list(runs.filter(pk__in=list(newest[:DEFAULT_RUN_COUNT])))


NO_PROFILE = "no profile"


def profile_label(run) -> str:
    """The profile a run's option is grouped by: its load profile version ("chat v3")."""
    return str(run.load_profile) if run.load_profile_id else NO_PROFILE


def ranked_profile(runs, profile=None) -> tuple[str | None, int | None, str]:
    """(label, pk, why) of the one profile whose runs the page ranks: ``profile`` (a
    LoadProfile pk) when chosen, else the profile of most of ``runs`` (newest first), the
    newest run's deciding a tie."""
    if profile is not None:
        found = next((run for run in runs if run.load_profile_id == profile), None)
        if found is not None:
            return profile_label(found), profile, "chosen"
        chosen = LoadProfile.objects.filter(pk=profile).first()
        return (str(chosen) if chosen else NO_PROFILE), profile, "chosen (no selected run has it)"
    if not runs:
        return None, None, ""
    counts = Counter(profile_label(run) for run in runs)
    label = max(counts, key=lambda name: counts[name])  # first (newest) among equals
    pk = next(run.load_profile_id for run in runs if profile_label(run) == label)
    why = (
        "the only profile of the selected runs"
        if len(counts) == 1
        else f"the profile of most of the selected runs ({counts[label]} of {len(runs)})"
    )
    return label, pk, why


def cost_report(
    runs=None,
    *,
    utilisation: float = 1.0,
    restart_overhead: float = 0.0,
    pricing: str = Pricing.ON_DEMAND,
    slo: cost_ranking.Slo | None = None,
    metric: str = "per_request",
    price_as: str = "host",
    prices=None,
    focus=None,
    profile=None,
) -> CostReport:
    """Price every run in ``runs`` (pks; default the latest succeeded runs) and rank the
    options in the panel's currency that meet ``slo`` by ``metric``, working the formulas out
    for the ``focus`` option (default the cheapest).

    An option is a run at one hourly price, so the ranking answers "which config on which
    instance type": ``price_as`` "host" prices each run at its host's current ``pricing``
    price; "matching" adds every listed price under ``pricing`` whose instance type has the
    GPUs the run used (``same_gpus``); "chosen" prices each run at each of ``prices`` (Price
    pks) as they are. The throughput measured on one machine stands for the other: only
    fair for the same GPUs, which the page says where they differ.

    Only runs of one load profile are ranked (``ranked_profile``: ``profile``, a
    LoadProfile pk, else the one most of the runs used): the others are listed, not ranked."""
    if price_as not in PRICE_AS:
        raise ValueError(f"unknown price_as {price_as!r}: one of {', '.join(PRICE_AS)}")
    slo = slo or cost_ranking.Slo()
    report = CostReport(
        currency=settings.PANEL_CURRENCY,
        pricing=pricing,
        slo=slo,
        metric=metric,
        utilisation=float(utilisation),
        restart_overhead=float(restart_overhead),
        price_as=price_as,
        default_selection=not runs,
    )
    chosen_runs = selected_runs(runs, profile)
    report.profile, report.profile_pk, report.profile_note = ranked_profile(chosen_runs, profile)
    host_gpus = dict(
        Gpu.objects.filter(host__in={run.deployment.host_id for run in chosen_runs})
        .values_list("host")
        .annotate(n=Count("pk"))
        .order_by()
    )
    for run, choice in _pairs(chosen_runs, pricing, price_as, prices):
        report.rows.append(_row(report, run, choice, host_gpus))
    options = [row["option"] for row in report.rows]
    report.ranking = cost_ranking.rank(
        options, slo, currency=report.currency, metric=metric, profile=report.profile
    )
    _mark_ranking(report)
    report.focus = _focus(report.rows, focus)
    report.scatter = _scatter(report)
    report.bars = _bars(report)
    return report


def _row(report: CostReport, run, choice: PriceChoice, host_gpus: dict) -> dict:
    """The table row of one option: ``run`` priced at the share of ``choice`` that pays for
    the GPUs the run's deployment used (an instance type's GPUs when the price names them,
    else its host's)."""
    listed = choice.price.gpu_count if choice.price is not None else None
    instance_gpus = listed or (
        host_gpus.get(run.deployment.host_id) if choice.key == "host" else None
    )
    share = cost.gpu_share(choice.hourly_price, run.gpu_count, instance_gpus)
    run_cost = cost.RunCost.from_run(
        run, share.charged, choice.currency, report.utilisation, report.restart_overhead
    )
    name = run.numbered_name
    label = name if report.price_as == "host" else f"{name} @ {choice.name}"
    key = f"{run.pk}-{choice.key}"
    return {
        "key": key,
        "run": run,
        "option": cost_ranking.Option(
            key,
            run_cost,
            run.ttft_p95_ms,
            label,
            refused=usable_as_evidence(run).refusal,
            profile=profile_label(run),
        ),
        "cost": run_cost,
        "price": share.charged,
        "price_key": choice.key,
        "share": share,
        "share_text": _share_text(share, choice.currency),
        "currency": choice.currency,
        "source": choice.source,
        "gpu_note": _gpu_note(choice.price, run),
        "label": label,
    }


def _mark_ranking(report: CostReport) -> None:
    """Each row's place in the ranking, whether it meets the SLO, and its numbers as text."""
    best = report.ranking.cheapest
    ranked = {option.key for option in report.ranking.ranked}
    for row in report.rows:
        option = row["option"]
        row["status"] = report.ranking.status(option)
        row["meets_slo"] = report.slo.meets(option.ttft_p95_ms, option.error_rate)
        row["cheapest"] = best is not None and option.key == best.key
        row["ranked"] = option.key in ranked
        row["text"] = {
            "price": cost.money(row["price"], significant=cost.EXACT),
            "error_rate": cost.percent(row["cost"].error_rate),
            **{key: cost.money(row["cost"].value(key)) for key in cost.METRICS},
        }


def _pairs(runs: list, pricing: str, price_as: str, prices) -> list[tuple]:
    """(run, PriceChoice) for every option on the page, a run's in the order: its host's
    price, then the others by name. The same few queries whatever the number of runs."""
    if price_as == "chosen":
        listed = [listed_price(p) for p in Price.objects.filter(pk__in=list(prices or []))]
        return [(run, choice) for run in runs for choice in listed]
    own = host_price_choices({run.deployment.host for run in runs}, pricing)
    if price_as == "host":
        return [(run, own[run.deployment.host_id]) for run in runs]
    candidates = list(
        Price.objects.filter(pricing=pricing, gpu_count__isnull=False)
        .exclude(gpu_model="")
        .prefetch_related("hosts")
    )
    pairs = []
    for run in runs:
        pairs.append((run, own[run.deployment.host_id]))
        for price in candidates:
            # The instance type the host is already priced as is its own price, not another.
            linked = any(host.pk == run.deployment.host_id for host in price.hosts.all())
            if not linked and same_gpus(price, run.gpu_model, run.gpu_count):
                pairs.append((run, listed_price(price)))
    return pairs


def _share_text(share: cost.GpuShare, currency: str) -> str:
    """Says that only the used GPUs are charged, and what the idle ones cost."""
    if not share.partial:
        return ""
    return (
        f"{share.describe(currency)}; {share.idle} idle GPU"
        f"{'s' if share.idle != 1 else ''} ({cost.money(share.idle_price, currency)}/h) "
        "not charged to this run"
    )


def _gpu_note(price: Price | None, run) -> str:
    """Says when a chosen price's instance type has other GPUs than the run measured on."""
    if price is None or not (price.gpu_model and price.gpu_count):
        return ""
    if same_gpus(price, run.gpu_model, run.gpu_count):
        return ""
    used = f"{run.gpu_count or '?'} × {run.gpu_model}" if run.gpu_model else "unknown GPUs"
    return (
        f"measured on {used}; this price is for {price.gpu_count} × {price.gpu_model}: "
        "its throughput may differ there"
    )


def _focus(rows: list[dict], focus) -> dict | None:
    """The row named by ``focus``: a row key ("12-host", "12-3") or a run pk (its first
    row); else the cheapest, else the first row with a cost."""
    if focus not in (None, ""):
        focus = str(focus)
        for row in rows:
            if row["key"] == focus or str(row["run"].pk) == focus:
                return row
    return next((row for row in rows if row["cheapest"]), None) or next(
        (row for row in rows if row["cost"].per_request is not None), rows[0] if rows else None
    )


def _hover(row) -> str:
    run = row["run"]
    config = f"config v{run.engine_config.version}" if run.engine_config else "no config"
    return (
        f"{row['label']}<br>{run.deployment}<br>{config}<br>{run.load_profile or 'no profile'}"
        f"<br>priced as {row['source']}"
    )


# The scatter's groups of options: (legend name, colour, marker symbol, which rows).
SCATTER_GROUPS = (
    ("meets the SLO", "#16a34a", "circle", lambda r: r["meets_slo"] and not r["cheapest"]),
    ("misses the SLO", "#9ca3af", "circle", lambda r: not r["meets_slo"]),
    ("cheapest meeting the SLO", "#2563eb", "star", lambda r: r["cheapest"]),
)
SLO_COLOUR = "#dc2626"


def _charted(report: CostReport) -> list[dict]:
    """The rows the charts draw: the ranked profile's, in the panel's currency."""
    other = report.ranking.other_profile if report.ranking else {}
    return [
        row for row in report.rows if row["currency"] == report.currency and row["key"] not in other
    ]


def _scatter(report: CostReport) -> dict | None:
    """Cost per 1M output tokens against p95 TTFT, the SLO as a vertical line."""
    points = [
        row
        for row in _charted(report)
        if row["cost"].per_million_output is not None and row["run"].ttft_p95_ms is not None
    ]
    if not points:
        return None
    data = []
    for name, colour, symbol, keep in SCATTER_GROUPS:
        chosen = [row for row in points if keep(row)]
        if chosen:
            data.append(_scatter_trace(report, name, colour, symbol, chosen))
    layout = {
        "height": 320,
        "margin": {"t": 10, "b": 50, "l": 70, "r": 10},
        "xaxis": {"title": {"text": "p95 TTFT (ms)"}, "rangemode": "tozero"},
        "yaxis": {
            "title": {"text": f"{report.currency} per 1M output tokens"},
            "rangemode": "tozero",
        },
        "legend": {"orientation": "h", "y": -0.25},
    }
    if report.slo.ttft_p95_ms is not None:
        layout.update(_slo_line(report.slo.ttft_p95_ms))
    return {"data": data, "layout": layout}


def _scatter_trace(report: CostReport, name: str, colour: str, symbol: str, rows) -> dict:
    return {
        "type": "scatter",
        "mode": "markers",
        "name": name,
        "x": [row["run"].ttft_p95_ms for row in rows],
        "y": [row["cost"].per_million_output for row in rows],
        "text": [_hover(row) for row in rows],
        "hovertemplate": "%{text}<br>p95 TTFT %{x:.0f} ms<br>%{y:.4f} "
        + report.currency
        + " per 1M output tokens<extra></extra>",
        "marker": {
            "color": colour,
            "symbol": symbol,
            "size": 14 if symbol == "star" else 10,
        },
    }


def _slo_line(ttft_p95_ms: float) -> dict:
    """The layout's vertical dashed line at the SLO's p95 TTFT, with its label."""
    return {
        "shapes": [
            {
                "type": "line",
                "xref": "x",
                "yref": "paper",
                "x0": ttft_p95_ms,
                "x1": ttft_p95_ms,
                "y0": 0,
                "y1": 1,
                "line": {"color": SLO_COLOUR, "dash": "dash", "width": 2},
            }
        ],
        "annotations": [
            {
                "x": ttft_p95_ms,
                "y": 1,
                "xref": "x",
                "yref": "paper",
                "text": f"SLO {cost.number(ttft_p95_ms)} ms",
                "showarrow": False,
                "xanchor": "left",
                "yanchor": "top",
                "font": {"color": SLO_COLOUR},
            }
        ],
    }


def _bars(report: CostReport) -> dict | None:
    """Cost per successful request of each run in the panel's currency, cheapest first."""
    rows = [row for row in _charted(report) if row["cost"].per_request is not None]
    if not rows:
        return None
    rows.sort(key=lambda row: row["cost"].per_request)

    def colour(row):
        return "#2563eb" if row["cheapest"] else "#16a34a" if row["meets_slo"] else "#9ca3af"

    return {
        "data": [
            {
                "type": "bar",
                "x": [row["label"] for row in rows],
                "y": [row["cost"].per_request for row in rows],
                "text": [_hover(row) for row in rows],
                "hovertemplate": "%{text}<br>%{y:.6f} " + report.currency + "<extra></extra>",
                "marker": {"color": [colour(row) for row in rows]},
            }
        ],
        "layout": {
            "height": 320,
            "margin": {"t": 10, "b": 80, "l": 80, "r": 10},
            "xaxis": {"type": "category", "title": {"text": "run"}},
            "yaxis": {"title": {"text": f"{report.currency} per successful request"}},
        },
    }
