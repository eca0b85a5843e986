"""Load profile workflows: the built-in starters, new versions, traffic samples, sharing."""

from __future__ import annotations

from django.core import signing
from django.db.models import Count, IntegerField, OuterRef, Subquery
from django.db.models.functions import Coalesce

from benchmarks.choices import ProfileSource
from benchmarks.loadgen import traffic
from benchmarks.loadgen.profile import (
    BUILTINS,
    changed_fields,
    describe,
    export_document,
    read_export,
    validate,
)
from benchmarks.loadgen.spec import SpecError
from benchmarks.models import BenchmarkRun, LoadProfile
from controlpanel import userjson
from controlpanel.services import audit

SAMPLE_SALT = "benchmarks.profiles.traffic-sample"
SAMPLE_MAX_AGE_S = 6 * 3600
# A carried sample must fit in one form post (Django refuses bodies over 2.5 MB by default);
# a larger one is uploaded again with the save.
SAMPLE_MAX_CHARS = 2_000_000
MAX_IMPORT_BYTES = 25 * 1024 * 1024


def ensure_builtin_profiles() -> list[LoadProfile]:
    """Create the built-in starters that are missing (by name). Idempotent; runs after every
    migrate. A starter someone edited keeps their versions: only a missing name is created."""
    made = []
    existing = set(LoadProfile.objects.filter(name__in=BUILTINS).values_list("name", flat=True))
    for name, item in BUILTINS.items():
        if name in existing:
            continue
        made.append(
            LoadProfile.objects.create_next(
                name,
                validate(item["spec"]),
                description=item["description"],
                source=ProfileSource.BUILTIN,
                note="built-in starter",
            )
        )
    return made


# -- reading ----------------------------------------------------------------------------------


def profile_table():
    """The newest version of every name with its version count and the runs of all its
    versions, in one query."""
    versions = (
        LoadProfile.objects.filter(name=OuterRef("name"))
        .order_by()
        .values("name")
        .annotate(n=Count("pk"))
        .values("n")
    )
    runs = (
        BenchmarkRun.objects.filter(load_profile__name=OuterRef("name"))
        .order_by()
        .values("load_profile__name")
        .annotate(n=Count("pk"))
        .values("n")
    )
    return (
        LoadProfile.objects.latest()
        .select_related("created_by")
        .annotate(
            version_count=Subquery(versions, output_field=IntegerField()),
            run_count=Coalesce(Subquery(runs, output_field=IntegerField()), 0),
        )
        .order_by("name")
    )


def version_history(profile: LoadProfile) -> list[dict]:
    """Every version of ``profile``'s name, newest first, each with the fields that changed
    from the version before it."""
    versions = list(
        LoadProfile.objects.filter(name=profile.name)
        .select_related("created_by")
        .order_by("version")
    )
    rows, previous = [], None
    for version in versions:
        changed = []
        if previous is not None:
            changed = changed_fields(previous.spec, version.spec)
            if previous.description != version.description:
                changed.insert(0, "description")
        rows.append({"profile": version, "changed": changed, "current": version.pk == profile.pk})
        previous = version
    return rows[::-1]


def recent_runs(profile: LoadProfile, limit: int = 20):
    """The latest runs of any version of ``profile``'s name."""
    return (
        BenchmarkRun.objects.filter(load_profile__name=profile.name)
        .select_related("deployment__host", "load_profile", "engine_config", "requested_by")
        .order_by("-created_at")[:limit]
    )


def newest_version(profile: LoadProfile) -> LoadProfile | None:
    """The newest version of the name when ``profile`` is not it."""
    newer = LoadProfile.objects.filter(name=profile.name, version__gt=profile.version)
    return newer.order_by("-version").first()


# -- writing ----------------------------------------------------------------------------------


def _audit_spec(spec: dict) -> dict:
    """The document as the audit log keeps it: a replay's rows are counted, not copied."""
    replay = spec.get("replay")
    if not replay:
        return spec
    return {**spec, "replay": {**replay, "rows": len(replay.get("rows") or [])}}


def _after(profile: LoadProfile) -> dict:
    return {
        "name": profile.name,
        "version": profile.version,
        "source": profile.source,
        "description": profile.description,
        "note": profile.note,
        "spec": _audit_spec(profile.spec),
    }


def create_profile(
    actor,
    name: str,
    spec: dict,
    *,
    description: str = "",
    note: str = "",
    source: str = ProfileSource.MANUAL,
    action: str = "profile.create",
) -> LoadProfile:
    """Save ``spec`` (validated again here) as the next version of ``name``: version 1 of a
    new name, N+1 of an existing one. Versions are never changed once saved."""
    before = LoadProfile.objects.filter(name=name).order_by("-version").first()
    profile = LoadProfile.objects.create_next(
        name,
        validate(spec),
        description=description,
        note=note,
        source=source,
        created_by=actor if getattr(actor, "is_authenticated", False) else None,
    )
    audit(
        actor,
        action,
        profile,
        before={"version": before.version, "spec": _audit_spec(before.spec)} if before else None,
        after=_after(profile),
    )
    return profile


def edit_profile(actor, base: LoadProfile, spec: dict, *, description: str, note: str):
    """The next version of ``base``'s name (editing never changes a saved version). The
    source stays what it was, except that a starter edited by hand is the team's own."""
    source = ProfileSource.MANUAL if base.source == ProfileSource.BUILTIN else base.source
    return create_profile(actor, base.name, spec, description=description, note=note, source=source)


def export_profile(profile: LoadProfile) -> dict:
    return export_document(profile.name, profile.description, profile.spec)


def import_profile(actor, data: bytes, *, note: str = "") -> LoadProfile:
    """Create the next version of the exported profile's name from an export file. Raises
    ``SpecError`` saying what is wrong with the file."""
    if len(data) > MAX_IMPORT_BYTES:
        raise SpecError(f"import: larger than {MAX_IMPORT_BYTES // 2**20} MB")
    try:
        document = userjson.parse(data, what="import: the file")
    except userjson.UserJSONError as exc:
        raise SpecError(str(exc)) from None
    name, description, spec = read_export(document)
    return create_profile(
        actor,
        name,
        spec,
        description=description,
        note=note or "imported",
        source=ProfileSource.IMPORTED,
        action="profile.import",
    )


# -- traffic samples --------------------------------------------------------------------------


def sign_sample(rows: list[traffic.TrafficRow]) -> str | None:
    """The parsed sample, compressed and signed, for the confirm form to carry back; None
    when it is too large for a form post (the file is then uploaded again)."""
    token = signing.dumps(traffic.to_columns(rows), salt=SAMPLE_SALT, compress=True)
    return token if len(token) <= SAMPLE_MAX_CHARS else None


def unsign_sample(token: str) -> list[traffic.TrafficRow]:
    """The rows of a signed sample, checked again as if read from the file."""
    try:
        data = signing.loads(token, salt=SAMPLE_SALT, max_age=SAMPLE_MAX_AGE_S)
    except signing.SignatureExpired:
        raise SpecError("sample: the preview expired; upload the file again") from None
    except signing.BadSignature:
        raise SpecError("sample: the carried sample was altered; upload the file again") from None
    return traffic.from_columns(data)


def traffic_document(rows, mode: str, options: dict) -> dict:
    """The profile document a sample makes: ``mode`` "fit" (its distributions) or "replay"
    (its requests). ``options``: time_scale, prefix_len, num_requests, duration_s,
    concurrency, max_concurrency, warmup_requests (None = default)."""
    given = {k: v for k, v in options.items() if v is not None}
    extra = {k: given.pop(k) for k in ("warmup_requests", "endpoint", "slo") if k in given}
    if mode == "replay":
        return traffic.replay(
            rows, given.get("time_scale", 1.0), prefix_len=given.get("prefix_len"), **extra
        )
    if mode != "fit":
        raise SpecError(f"mode: {mode!r} is neither fit nor replay")
    given.pop("time_scale", None)
    return traffic.fit(rows, **given, **extra)


def traffic_preview(rows) -> dict:
    """What the page shows before saving: the sample's statistics and what each choice would
    run."""
    stats = traffic.stats(rows)
    preview = {"stats": stats, "fit": describe(traffic.fit(rows)), "replay": None}
    if stats["has_timestamps"]:
        preview["replay"] = describe(traffic.replay(rows))
    return preview


def profile_from_traffic(
    actor,
    rows,
    *,
    mode: str,
    name: str,
    description: str = "",
    note: str = "",
    options: dict | None = None,
) -> LoadProfile:
    """Save a profile fitted to (or replaying) a traffic sample as the next version of
    ``name``."""
    spec = traffic_document(rows, mode, options or {})
    source = ProfileSource.REPLAY if mode == "replay" else ProfileSource.TRAFFIC
    note = note or f"{'replay of' if mode == 'replay' else 'fitted to'} {len(rows)} requests"
    return create_profile(actor, name, spec, description=description, note=note, source=source)
