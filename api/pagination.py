"""Pages of every API list: ``?page=N&page_size=M`` (up to 500), with the total count."""

from rest_framework.pagination import PageNumberPagination


class Pagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500
