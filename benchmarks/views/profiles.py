"""Load profile pages: the list, the editor (every save is a new version), the detail with
its version history, profiles from a traffic sample, export and import."""

import json

from django.contrib import messages
from django.contrib.auth.decorators import permission_required
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.text import slugify

from benchmarks.forms.profiles import ImportForm, ProfileForm, TrafficForm, document_json
from benchmarks.loadgen.profile import describe, length_text, normalize, plan, prompt_tokens
from benchmarks.loadgen.spec import SpecError
from benchmarks.models import LoadProfile
from benchmarks.services import profiles as services


@permission_required("benchmarks.view_loadprofile", raise_exception=True)
def profile_list(request):
    rows = list(services.profile_table())
    return render(request, "benchmarks/profile_list.html", {"profiles": rows})


@permission_required("benchmarks.add_loadprofile", raise_exception=True)
def profile_create(request):
    form = ProfileForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        profile = services.create_profile(
            request.user,
            data["name"],
            form.document,
            description=data["description"],
            note=data["note"],
        )
        messages.success(request, f"Load profile {profile} saved.")
        return redirect(profile)
    return render(request, "benchmarks/profile_form.html", {"form": form})


@permission_required("benchmarks.add_loadprofile", raise_exception=True)
def profile_edit(request, pk):
    """Editing version N saves version N+1; N stays as every run that used it saw it."""
    base = get_object_or_404(LoadProfile, pk=pk)
    form = ProfileForm(request.POST or None, base=base)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        profile = services.edit_profile(
            request.user, base, form.document, description=data["description"], note=data["note"]
        )
        messages.success(request, f"Saved as {profile}; v{base.version} is unchanged.")
        return redirect(profile)
    context = {"form": form, "base": base, "current_json": document_json(base.spec)}
    return render(request, "benchmarks/profile_form.html", context)


@permission_required("benchmarks.view_loadprofile", raise_exception=True)
def profile_detail(request, pk):
    profile = get_object_or_404(LoadProfile.objects.select_related("created_by"), pk=pk)
    spec = normalize(profile.spec)
    requests, seconds = plan(spec)
    sent = prompt_tokens(spec)
    context = {
        "profile": profile,
        "spec": spec,
        "summary": describe(spec),
        "lengths": [
            ("Input", length_text(spec["input_len"])),
            ("Output", length_text(spec["output_len"])),
        ],
        "replay_rows": len(spec["replay"]["rows"]) if spec["replay"] else None,
        "sent_tokens": sent[0],
        "sent_shared": sent[1],
        "planned_requests": requests,
        "planned_seconds": seconds,
        "newest": services.newest_version(profile),
        "history": services.version_history(profile),
        "runs": services.recent_runs(profile),
    }
    return render(request, "benchmarks/profile_detail.html", context)


@permission_required("benchmarks.add_loadprofile", raise_exception=True)
def profile_from_traffic(request):
    """Upload → preview (statistics, what fit and replay would run) → save. The preview's
    form carries the parsed sample back signed, so the save needs no second upload."""
    saving = request.POST.get("action") == "save"
    form = TrafficForm(request.POST or None, request.FILES or None, saving=saving)
    if request.method == "POST" and form.is_valid() and saving:
        data = form.cleaned_data
        try:
            profile = services.profile_from_traffic(
                request.user,
                form.rows,
                mode=data["mode"],
                name=data["name"].strip(),
                description=data["description"],
                note=data["note"],
                options=form.options,
            )
        except SpecError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, f"Load profile {profile} saved.")
            return redirect(profile)
    preview = None
    if form.rows is not None:
        try:
            preview = services.traffic_preview(form.rows)
        except SpecError as exc:
            form.add_error(None, str(exc))
        else:
            form.data = _confirm_data(request, form, preview)
    context = {"form": form, "preview": preview, "carried": bool(form.data.get("sample"))}
    return render(request, "benchmarks/profile_traffic.html", context)


def _confirm_data(request, form, preview):
    """The posted values for the confirm step: the sample signed, blanks as observed."""
    data = form.data.copy()
    data["sample"] = services.sign_sample(form.rows) or ""
    upload = request.FILES.get("file")
    if not data.get("name", "").strip() and upload is not None:
        data["name"] = upload.name.rsplit(".", 1)[0][:100]
    if not data.get("prefix_len") and preview["stats"]["prefix_len"]:
        data["prefix_len"] = str(preview["stats"]["prefix_len"])
    data.setdefault("time_scale", "1")
    data.setdefault("mode", "fit")
    return data


@permission_required("benchmarks.add_loadprofile", raise_exception=True)
def profile_import(request):
    form = ImportForm(request.POST or None, request.FILES or None)
    if request.method == "POST" and form.is_valid():
        try:
            profile = services.import_profile(
                request.user, form.cleaned_data["file"].read(), note=form.cleaned_data["note"]
            )
        except SpecError as exc:
            form.add_error("file", str(exc))
        else:
            messages.success(request, f"Imported as {profile}.")
            return redirect(profile)
    return render(request, "benchmarks/profile_import.html", {"form": form})


@permission_required("benchmarks.view_loadprofile", raise_exception=True)
def profile_export(request, pk):
    profile = get_object_or_404(LoadProfile, pk=pk)
    body = json.dumps(services.export_profile(profile), indent=2, ensure_ascii=False)
    filename = f"{slugify(profile.name) or 'profile'}-v{profile.version}.json"
    return HttpResponse(
        body,
        content_type="application/json",
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )
