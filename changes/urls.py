from django.urls import path

from changes import views

app_name = "changes"
urlpatterns = [
    path("", views.change_list, name="list"),
]
