# The panel's image: one image, three roles (web, worker, beat) chosen by the command.
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VAR_DIR=/var/lib/controlpanel \
    STATIC_ROOT=/app/staticfiles

RUN groupadd --system panel && useradd --system --gid panel --home-dir /app panel \
    && mkdir -p /var/lib/controlpanel && chown panel:panel /var/lib/controlpanel

WORKDIR /app
COPY pyproject.toml README.md ./
COPY manage.py ./
COPY controlpanel ./controlpanel
COPY hosts ./hosts
COPY benchmarks ./benchmarks
COPY changes ./changes
COPY scaling ./scaling
COPY api ./api
COPY home ./home
COPY templates ./templates
COPY static ./static
# Editable install keeps the code in /app, where settings find templates/ and static/.
RUN pip install -e . \
    && VAR_DIR=/tmp/build python manage.py collectstatic --noinput --verbosity 0 \
    && rm -rf /tmp/build

USER panel
EXPOSE 8000
CMD ["python", "-m", "controlpanel.webserver"]
