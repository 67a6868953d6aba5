# The onceflow worker. Built by docker-compose.yml (image onceflow:dev); runs
# config/compose.conf, whose hosts are the compose services. The base of an
# image of your own pipeline: deploy/Dockerfile.app.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# pyproject.toml names README.md as the package's readme: pip needs both.
COPY pyproject.toml README.md ./
COPY onceflow ./onceflow
RUN pip install .  # the worker alone: no analytics, no embedded services

COPY config ./config

RUN useradd --system --uid 10001 --no-create-home onceflow
USER onceflow

# SIGTERM (docker stop) starts a drain bounded by onceflow.shutdown.timeout.
CMD ["onceflow", "run", "-c", "/app/config/compose.conf"]
