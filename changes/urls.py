from django.urls import include, path

from changes import views

app_name = "changes"
urlpatterns = [
    path("", views.change_list, name="list"),
    path("new/", views.change_new, name="new"),
    path("preview/", views.change_preview, name="preview"),
    path("<int:pk>/", views.change_detail, name="detail"),
    path("<int:pk>/timeline.json", views.change_timeline, name="timeline"),
    path("<int:pk>/part/<str:part>/", views.change_part, name="part"),
    # Actions: each a POST of its own (CSRF, audit), back to the change's page.
    path("<int:pk>/submit/", views.change_submit, name="submit"),
    path("<int:pk>/approve/", views.change_approve, name="approve"),
    path("<int:pk>/approve-override/", views.change_approve_override, name="approve_override"),
    path("<int:pk>/reject/", views.change_reject, name="reject"),
    path("<int:pk>/withdraw/", views.change_withdraw, name="withdraw"),
    path("<int:pk>/comment/", views.change_comment, name="comment"),
    path("<int:pk>/rebase/", views.change_rebase, name="rebase"),
    path("<int:pk>/apply/", views.change_apply, name="apply"),
    path("<int:pk>/resume/", views.change_resume, name="resume"),
    path("<int:pk>/rollback/", views.change_rollback, name="rollback"),
    # Config history
    path("configs/", views.all_configs, name="all_configs"),
    path("configs/<int:pk>/rollback/", views.propose_rollback, name="propose_rollback"),
    path("deployments/<int:pk>/configs/", views.deployment_configs, name="configs"),
    path("advisor/", include("changes.views_advisor")),
    path("sweeps/", include("changes.views_sweeps")),
]
