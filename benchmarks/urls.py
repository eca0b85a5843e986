from django.urls import path

from benchmarks import views

app_name = "benchmarks"
urlpatterns = [
    path("", views.run_list, name="list"),
    path("<int:pk>/", views.run_detail, name="detail"),
]
