"""The API's resources, one module per area; each exposes ``urlpatterns`` (api/urls.py)."""
