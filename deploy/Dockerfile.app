# Your pipeline in an image: onceflow's worker image (built by docker-compose.yml
# as onceflow:dev from the Dockerfile at the repository's root) with your package
# installed on top, and your configuration. Build it from your project's
# directory, which holds your pyproject.toml, your package and app.conf:
#
#   docker compose build onceflow                      # onceflow:dev, once
#   docker build -f /path/to/onceflow/deploy/Dockerfile.app -t payments:1 .
#
# then run it as docker-compose.yml's `onceflow` service (image: payments:1,
# and drop its `build:` and `command:` lines). An app.conf that keeps compose's
# hosts, stores and metrics port includes compose.conf and sets your own:
#
#   include file("/app/config/compose.conf")
#   onceflow.pipeline = "payments.pipeline:pipeline"
#   onceflow.kafka.group-id = "payments-totals"
#
# (Add your topics to the `topics` service.) Your package is installed, so the
# worker imports it from any directory. Guide: docs/guide/running-and-scaling-out.md.
ARG ONCEFLOW_IMAGE=onceflow:dev
FROM ${ONCEFLOW_IMAGE}

USER root
COPY . /src
RUN pip install /src && rm -rf /src
COPY app.conf /app/app.conf
USER onceflow

WORKDIR /app
CMD ["onceflow", "run", "-c", "/app/app.conf"]
