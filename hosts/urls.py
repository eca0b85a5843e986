from django.urls import path

from hosts import views

app_name = "hosts"
urlpatterns = [
    path("", views.host_list, name="list"),
    path("new/", views.host_create, name="create"),
    path("<int:pk>/", views.host_detail, name="detail"),
    path("<int:pk>/edit/", views.host_edit, name="edit"),
    path("<int:pk>/check/", views.host_check, name="check"),
    path("<int:pk>/checks/", views.host_checks, name="checks"),
]
