"""Pages of every API list: ``?page=N&page_size=M`` (up to 500), with the total count."""

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import PageNumberPagination


class Pagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500

    def get_page_size(self, request):
        """DRF falls back to the default for a page size it cannot read; a script that
        asked for ``page_size=-1`` should learn that it did not get what it asked for."""
        raw = request.query_params.get(self.page_size_query_param)
        if raw is not None and (not raw.isdigit() or int(raw) < 1):
            raise ValidationError(
                {self.page_size_query_param: [f"A whole number from 1 to {self.max_page_size}."]}
            )
        return super().get_page_size(request)
