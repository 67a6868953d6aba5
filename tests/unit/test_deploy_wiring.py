"""docker-compose.yml, the Dockerfiles and the configs they use, checked against each other.

No Docker engine runs the tests, so the deployment is never started: these
checks read the files and fail where `docker compose up` would not come up, or
would come up wrong (a host that is no service, a keyspace no single node can
hold, a healthcheck on a port the worker does not open, a file the image lacks).
"""

from __future__ import annotations

import glob
import os
import re
import shlex
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from onceflow.runtime.config import Settings, load_settings
from onceflow.runtime.worker import GRACE

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
HEALTH_URL = re.compile(r"http://(127\.0\.0\.1|localhost):(\d+)/health\b")
#: Where each stateful image keeps its data (kafka: KAFKA_LOG_DIRS).
DATA_DIRS = {"redis": "/data", "cassandra": "/var/lib/cassandra"}


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def services() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = compose()["services"]
    return found


def context_of(service: dict[str, Any]) -> Path:
    build = service["build"]
    return ROOT / (build if isinstance(build, str) else build.get("context", "."))


def dockerfile_of(service: dict[str, Any]) -> Path | None:
    build = service.get("build")
    if build is None:
        return None
    name = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
    return context_of(service) / name


def instructions(dockerfile: Path) -> Iterator[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            yield word.upper(), rest.strip()


def copies(dockerfile: Path) -> Iterator[tuple[list[str], PurePosixPath]]:
    """Each COPY from the build context: its sources and where each lands in the image
    (a directory when it ends with / or takes several sources)."""
    workdir = PurePosixPath("/")
    for word, rest in instructions(dockerfile):
        if word == "WORKDIR":
            workdir = workdir / rest
        elif word == "COPY":
            args = shlex.split(rest)
            if any(a.startswith("--from") for a in args):
                continue
            *sources, dest = [a for a in args if not a.startswith("--")]
            into = len(sources) > 1 or dest.endswith("/")
            for source in sources:
                yield [source], (workdir / dest / PurePosixPath(source).name if into
                                 else workdir / dest)


def command(service: dict[str, Any]) -> list[str]:
    """What the service runs: its ``command``, else its image's CMD."""
    if "command" in service:
        cmd = service["command"]
        return shlex.split(cmd) if isinstance(cmd, str) else list(cmd)
    dockerfile = dockerfile_of(service)
    cmds = [] if dockerfile is None else [rest for word, rest in instructions(dockerfile)
                                           if word == "CMD"]
    if not cmds:
        return []
    cmd_json: list[str] = yaml.safe_load(cmds[-1])
    return cmd_json


def onceflow_services() -> dict[str, dict[str, Any]]:
    return {name: s for name, s in services().items() if command(s)[:1] == ["onceflow"]}


def in_repo(service: dict[str, Any], image_path: str) -> Path:
    """The file of the build context the image holds at ``image_path`` (it must hold one)."""
    dockerfile = dockerfile_of(service)
    assert dockerfile is not None, "an onceflow service is built from a Dockerfile here"
    target = PurePosixPath(image_path)
    for [source], copied in copies(dockerfile):
        if target == copied or copied in target.parents:
            return context_of(service) / source / target.relative_to(copied)
    raise AssertionError(f"{image_path} is not copied into the image by {dockerfile.name}")


def settings_of(name: str, service: dict[str, Any], monkeypatch: pytest.MonkeyPatch
                ) -> Settings:
    """The settings the service's worker loads: its ``-c`` file, under its environment."""
    cmd = command(service)
    assert "-c" in cmd, f"{name}: {cmd} names no config file"
    path = in_repo(service, cmd[cmd.index("-c") + 1])
    assert path.is_file(), f"{name}: {path} does not exist"
    with monkeypatch.context() as patch:
        for key in [k for k in os.environ if k.startswith("ONCEFLOW_")]:
            patch.delenv(key)
        for key, value in (service.get("environment") or {}).items():
            patch.setenv(key, str(value))
        return load_settings(path)  # ConfigError on a key reference.conf does not know


def hosts(settings: Settings) -> set[str]:
    """Every host the settings name: brokers, Redis, Cassandra, the Spark master."""
    named = {server.rsplit(":", 1)[0] for server in settings.kafka.bootstrap_servers.split(",")}
    named.add(urlsplit(settings.stores.redis.url).hostname or "")
    named.update(settings.stores.cassandra.contact_points)
    master = urlsplit(settings.analytics.spark.master)
    if master.scheme == "spark":
        named.add(master.hostname or "")
    return named


def service_names() -> set[str]:
    return set(services()) | {s["hostname"] for s in services().values() if "hostname" in s}


def test_every_onceflow_service_loads_a_config_of_known_keys(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """load_settings refuses a key reference.conf does not know, and every wrong type."""
    found = onceflow_services()
    assert {"onceflow", "analytics"} <= set(found)
    for name, service in found.items():
        settings_of(name, service, monkeypatch)


def test_every_host_a_config_names_is_a_compose_service(
        monkeypatch: pytest.MonkeyPatch) -> None:
    known = service_names()
    for name, service in onceflow_services().items():
        missing = hosts(settings_of(name, service, monkeypatch)) - known
        assert not missing, f"{name} reaches {sorted(missing)}, which are no compose services"
        settings = settings_of(name, service, monkeypatch)
        for server in settings.kafka.bootstrap_servers.split(","):
            advertised = services()["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
            assert f"//{server}" in advertised, f"{name}: {server} is no advertised listener"


def test_cassandra_keyspace_and_consistency_fit_the_compose_nodes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A replication above the node count, or a datacenter the node is not in, fails
    every write (the old example.conf: dc1 = 3 at LOCAL_QUORUM on one datacenter1 node)."""
    nodes = [s for s in services().values() if str(s.get("image", "")).startswith("cassandra")]
    assert len(nodes) == 1
    env = nodes[0].get("environment") or {}
    datacenter = env.get("CASSANDRA_DC", "datacenter1")
    for name, service in onceflow_services().items():
        cassandra = settings_of(name, service, monkeypatch).stores.cassandra
        replication = cassandra.replication
        if replication.strategy == "SimpleStrategy":
            assert replication.replication_factor <= len(nodes), name
        else:
            assert dict(replication.datacenters).keys() <= {datacenter}, name
            assert sum(dict(replication.datacenters).values()) <= len(nodes), name
        assert cassandra.local_datacenter in (None, datacenter), name


def test_every_named_volume_is_declared_and_every_store_keeps_its_data_in_one() -> None:
    declared = set(compose().get("volumes") or {})
    for name, service in services().items():
        for volume in service.get("volumes") or []:
            source = volume.split(":")[0]
            if not source.startswith((".", "/", "~")):
                assert source in declared, f"{name}: volume {source!r} is not declared"
    data_dirs = dict(DATA_DIRS, kafka=services()["kafka"]["environment"]["KAFKA_LOG_DIRS"])
    for name, directory in data_dirs.items():
        mounted = {v.split(":")[1]: v.split(":")[0] for v in services()[name]["volumes"]}
        assert mounted.get(directory) in declared, f"{name} keeps {directory} in no volume"


def test_redis_fsyncs_every_write_before_acknowledging_it() -> None:
    """Offsets follow a written state: an acknowledged write lost in a crash loses events."""
    args = command(services()["redis"])
    options = {args[i]: args[i + 1] for i in range(1, len(args) - 1, 2)
               if args[i].startswith("--")}
    assert options.get("--appendonly") == "yes", args
    assert options.get("--appendfsync") == "always", args


def test_every_healthcheck_hits_an_endpoint_the_worker_enables(
        monkeypatch: pytest.MonkeyPatch) -> None:
    workers = {n: s for n, s in onceflow_services().items() if command(s)[1:2] == ["run"]}
    assert workers
    for name, service in workers.items():
        test = service.get("healthcheck", {}).get("test")
        assert test, f"{name} has no healthcheck"
        url = HEALTH_URL.search(" ".join(test))
        assert url, f"{name}: the healthcheck {test} hits no /health"
        metrics = settings_of(name, service, monkeypatch).metrics
        assert metrics.port != 0 and metrics.port == int(url[2]), \
            f"{name}: the healthcheck hits port {url[2]}, onceflow.metrics.port is {metrics.port}"
        assert metrics.host in ("0.0.0.0", "127.0.0.1", "localhost"), metrics.host
        assert test[0] in ("CMD", "CMD-SHELL") and "python" in test[1], \
            "the slim image has no curl: the check runs python"
        shutdown = settings_of(name, service, monkeypatch).shutdown.timeout
        grace = float(str(service["stop_grace_period"]).rstrip("s"))
        assert grace > shutdown + GRACE, f"{name}: Docker kills before the drain ends"


def test_every_topic_the_worker_writes_is_created_before_it_starts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A dead-letter or late-events topic must exist at start (preflight)."""
    topics = services().get("topics")
    assert topics is not None, "no service creates the topics"
    created = set(topics["environment"]["TOPICS"].split())
    worker = services()["onceflow"]
    assert worker["depends_on"]["topics"]["condition"] == "service_completed_successfully"
    kafka = settings_of("onceflow", worker, monkeypatch).kafka
    assert {kafka.dead_letter_topic, kafka.late_events_topic} <= created


def test_every_file_a_dockerfile_copies_exists() -> None:
    ignored = set((ROOT / ".dockerignore").read_text().split())
    dockerfiles = {dockerfile_of(s) for s in services().values()} - {None}
    assert {ROOT / "Dockerfile", ROOT / "Dockerfile.analytics"} <= dockerfiles
    for dockerfile in dockerfiles:
        assert dockerfile is not None
        for [source], _ in copies(dockerfile):
            assert glob.glob(str(dockerfile.parent / source)), \
                f"{dockerfile.name}: COPY {source}: no such file"
            assert source not in ignored, f"{dockerfile.name}: COPY {source} is ignored"


def test_the_app_dockerfile_builds_on_the_worker_image() -> None:
    """deploy/Dockerfile.app: your package on top of the image compose builds."""
    app = dict(instructions(ROOT / "deploy" / "Dockerfile.app"))
    image = services()["onceflow"]["image"]
    assert app["ARG"] == f"ONCEFLOW_IMAGE={image}" and app["FROM"] == "${ONCEFLOW_IMAGE}"
    assert yaml.safe_load(app["CMD"])[:3] == ["onceflow", "run", "-c"]


def test_prometheus_scrapes_the_worker_port_and_loads_the_alerts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    prometheus = services()["prometheus"]
    mounts = dict(v.split(":")[:2] for v in prometheus["volumes"])
    config_dir = ROOT / next(src for src, dst in mounts.items() if dst == "/etc/prometheus")
    config = yaml.safe_load((config_dir / "prometheus.yml").read_text())
    for rules in config["rule_files"]:
        assert (config_dir / rules).is_file(), rules
    port = settings_of("onceflow", services()["onceflow"], monkeypatch).metrics.port
    targets = {t for job in config["scrape_configs"] for sc in job["static_configs"]
               for t in sc["targets"]}
    assert targets == {f"onceflow:{port}"}


def test_the_executor_memory_fits_a_spark_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """An executor larger than every worker is never granted: the job waits for ever."""
    def megabytes(size: str) -> int:
        return int(size[:-1]) * (1024 if size[-1].lower() == "g" else 1)

    worker_memory = services()["spark-worker"]["environment"]["SPARK_WORKER_MEMORY"]
    spark = settings_of("analytics", services()["analytics"], monkeypatch).analytics.spark
    assert megabytes(spark.executor_memory) <= megabytes(worker_memory)
