from django.urls import path

from benchmarks.views import cost, history, probes, profiles, runs

app_name = "benchmarks"
urlpatterns = [
    # History, compare, export and import (views/history.py)
    path("", history.run_list, name="list"),
    path("compare/", history.compare, name="compare"),
    path("import/", history.run_import, name="import"),
    path("import/<int:pk>/", history.import_job, name="import_job"),
    path("import/<int:pk>/progress/", history.import_job_progress, name="import_job_progress"),
    path("<int:pk>/export.json", history.export_json, name="export_json"),
    path("<int:pk>/requests.csv", history.export_csv, name="export_csv"),
    # Launching and watching one run (views/runs.py)
    path("new/", runs.run_new, name="new"),
    path("<int:pk>/", runs.run_detail, name="detail"),
    path("<int:pk>/cancel/", runs.run_cancel, name="cancel"),
    path("<int:pk>/timeline.json", runs.run_timeline, name="timeline"),
    path("<int:pk>/part/<str:part>/", runs.run_part, name="part"),
    # Load profiles (views/profiles.py)
    path("profiles/", profiles.profile_list, name="profiles"),
    path("profiles/new/", profiles.profile_create, name="profile_create"),
    path("profiles/from-traffic/", profiles.profile_from_traffic, name="profile_from_traffic"),
    path("profiles/import/", profiles.profile_import, name="profile_import"),
    path("profiles/<int:pk>/", profiles.profile_detail, name="profile"),
    path("profiles/<int:pk>/edit/", profiles.profile_edit, name="profile_edit"),
    path("profiles/<int:pk>/export.json", profiles.profile_export, name="profile_export"),
    # Quality probes (views/probes.py)
    path("probes/", probes.probe_sets, name="probe_sets"),
    path("probes/sets/upload/", probes.probe_set_upload, name="probe_set_upload"),
    path("probes/sets/<int:pk>/", probes.probe_set, name="probe_set"),
    path("probes/new/", probes.probe_new, name="probe_new"),
    path("probes/<int:pk>/", probes.probe_run, name="probe_run"),
    path("probes/<int:pk>/part/", probes.probe_run_part, name="probe_run_part"),
    path("probes/<int:pk>/cancel/", probes.probe_cancel, name="probe_cancel"),
    path("probes/compare/<int:a>/<int:b>/", probes.probe_compare, name="probe_compare"),
    path("quality/", probes.quality, name="quality"),
    # Prices (views/cost.py; the cost page itself is /cost/, wired in controlpanel/urls.py)
    path("prices/", cost.price_list, name="prices"),
    path("prices/new/", cost.price_create, name="price_create"),
    path("prices/<int:pk>/edit/", cost.price_edit, name="price_edit"),
    path("prices/<int:pk>/delete/", cost.price_delete, name="price_delete"),
]
