# The onceflow worker. Built by docker-compose.yml; runs config/example.conf,
# which takes Kafka and Redis addresses from ONCEFLOW_* environment variables.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# README* may not exist yet; pyproject.toml is what pip needs.
COPY pyproject.toml README* ./
COPY onceflow ./onceflow
RUN pip install .  # the worker alone: no analytics, no embedded services

COPY config ./config

RUN useradd --system --uid 10001 --no-create-home onceflow
USER onceflow

# SIGTERM (docker stop) starts a drain bounded by onceflow.shutdown.timeout.
CMD ["onceflow", "run", "-c", "/app/config/example.conf"]
