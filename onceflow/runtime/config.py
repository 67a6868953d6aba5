"""Settings: HOCON parsed once, at the edge, into one frozen typed object.

The application file is merged over the packaged ``reference.conf`` (every
default lives there) before substitutions resolve, so it may refer to defaults
and ``${?VAR}`` environment overrides work in either file. That merge is done
here rather than by pyhocon, whose merges lose the value an unset ``${?VAR}``
falls back to. Every key is checked against the reference tree and every value
for type and range, so the rest of the runtime reads plain attributes and never
imports pyhocon. Each problem is a :class:`ConfigError`: one ``file: key:
problem`` line.

This module loads, merges, resolves and key-checks the HOCON and assembles the
result; the typed settings live in :mod:`onceflow.runtime.settings` (re-exported
here), typed reads in :mod:`~onceflow.runtime.config_reader`, and the builders of
the larger blocks in ``config_kafka``, ``config_stores`` and ``config_analytics``.

Example:
    >>> settings = load_settings("config/example.conf")  # doctest: +SKIP
    >>> settings.kafka.session_timeout  # doctest: +SKIP
    30.0
"""

from __future__ import annotations

import copy
import difflib
import functools
import math
import os
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pyhocon import ConfigFactory, ConfigParser, ConfigTree
from pyhocon.config_tree import ConfigValues
from pyhocon.exceptions import ConfigException
from pyparsing import ParseBaseException  # what pyhocon raises on bad syntax

from onceflow.runtime import cpu_placement
from onceflow.runtime.config_analytics import analytics_settings
from onceflow.runtime.config_kafka import kafka_settings
from onceflow.runtime.config_reader import OVERRIDES, ConfigError, Reader, parse_duration, show
from onceflow.runtime.config_stores import cassandra_settings, redis_settings
from onceflow.runtime.parsed_reference import parse_reference
from onceflow.runtime.settings import (
    AnalyticsSettings,
    CassandraReplication,
    CassandraSettings,
    CommitSettings,
    ConnectionCheckerSettings,
    ConsumerSettings,
    KafkaSettings,
    LandingSettings,
    MetricsSettings,
    PersistenceSettings,
    ProducerSettings,
    RedisSettings,
    Settings,
    ShutdownSettings,
    SparkSettings,
    StateSettings,
    StoresSettings,
    SupervisionSettings,
    WindowSettings,
)

__all__ = [
    "AnalyticsSettings",
    "CassandraReplication",
    "CassandraSettings",
    "CommitSettings",
    "ConfigError",
    "ConnectionCheckerSettings",
    "ConsumerSettings",
    "KafkaSettings",
    "LandingSettings",
    "MetricsSettings",
    "PersistenceSettings",
    "ProducerSettings",
    "RedisSettings",
    "Settings",
    "ShutdownSettings",
    "SparkSettings",
    "StateSettings",
    "StoresSettings",
    "SupervisionSettings",
    "load_settings",
    "parse_duration",
    "reference_default",
]

# Mirrors the ${?VAR} lines of reference.conf, so a bad value is blamed on its variable.
_ENV_VARS = {
    "onceflow.pipeline": "ONCEFLOW_PIPELINE",
    "onceflow.kafka.bootstrap-servers": "ONCEFLOW_KAFKA_BOOTSTRAP_SERVERS",
    "onceflow.kafka.group-id": "ONCEFLOW_KAFKA_GROUP_ID",
    "onceflow.kafka.ssl.key-password": "ONCEFLOW_KAFKA_SSL_KEY_PASSWORD",
    "onceflow.kafka.sasl.username": "ONCEFLOW_KAFKA_SASL_USERNAME",
    "onceflow.kafka.sasl.password": "ONCEFLOW_KAFKA_SASL_PASSWORD",
    "onceflow.stores.redis.url": "ONCEFLOW_REDIS_URL",
    "onceflow.stores.cassandra.contact-points": "ONCEFLOW_CASSANDRA_CONTACT_POINTS",
}
_PIPELINE = r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*"
_PIPELINE_HINT = "'module:attribute' naming a onceflow.stages.Pipeline"


def split_assignment(assignment: str) -> tuple[str, str]:
    """``--set KEY=VALUE`` as (key, value); ValueError naming what was expected."""
    key, sep, value = assignment.partition("=")
    if not sep or not key:
        raise ValueError(f"--set expects KEY=VALUE, got {assignment!r}")
    return key.strip(), value


def load_settings(path: str | Path, overrides: Mapping[str, str] | None = None) -> Settings:
    """Read ``path`` over the packaged reference.conf, check it, return Settings.

    Args:
        path: the application HOCON file.
        overrides: dotted key -> HOCON value, applied last
            (``{"onceflow.kafka.bootstrap-servers": "127.0.0.1:1234"}``).

    Raises:
        ConfigError: naming the file, key and expectation of the first problem.
    """
    path = Path(path)
    label = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(label, None, "file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(label, None, f"cannot read: {exc}") from None
    schema = _reference()  # unresolved: resolving drops null keys
    defaults = _resolve(_reference())  # resolved here: ${?VAR} reads today's environment
    try:
        app = ConfigFactory.parse_string(text, basedir=str(path.parent), resolve=False)
        tree = _resolve(_merge(defaults, app))
    except _HOCON_ERRORS as exc:
        raise _hocon_error(label, exc) from None
    for key, raw in (overrides or {}).items():
        _apply_override(tree, key, raw)

    def origin(key: str) -> str:
        if any(f"{key}.".startswith(f"{k}.") or k.startswith(f"{key}.") for k in overrides or {}):
            return OVERRIDES
        env = _ENV_VARS.get(key)
        if not _declares(app, key) and env and env in os.environ:
            return f"${env}"
        return label

    _check_keys(tree.get("onceflow", None), schema["onceflow"], "onceflow", origin)
    return _build(Reader(tree, origin), label)


@functools.cache
def _parsed_reference() -> ConfigTree:
    """reference.conf parsed once per process, from the install's cache (parsed_reference)."""
    return parse_reference()


def reference_default(key: str) -> Any:
    """A key's value as reference.conf writes it (before ``${?VAR}``), from the one parse."""
    return _parsed_reference().get(key)


def _reference() -> ConfigTree:
    """A private copy of the parsed reference.conf: resolving and merging change a tree."""
    return copy.deepcopy(_parsed_reference())


def _build(read: Reader, source: str) -> Settings:
    if read.raw("onceflow.pipeline") is None:
        raise read.error("onceflow.pipeline", f"missing: set it to {_PIPELINE_HINT}")
    pipeline = read.text("onceflow.pipeline", _PIPELINE, _PIPELINE_HINT)
    kafka = kafka_settings(read)
    redis = redis_settings(read)
    return Settings(
        pipeline=pipeline,
        source=source,
        kafka=kafka,
        consumer=ConsumerSettings(
            read.integer("onceflow.consumer.max-in-flight-batches", 1, 1000),
            gap_refetches=read.integer("onceflow.consumer.gap-refetches", 0, 100),
            gap_refetch_backoff=read.duration("onceflow.consumer.gap-refetch-backoff", 0, 10),
            rewind_grace=read.duration("onceflow.consumer.rewind-grace", 1, 3600),
        ),
        persistence=PersistenceSettings(read.duration("onceflow.persistence.interval", 0.01, 3600)),
        state=StateSettings(read.integer("onceflow.state.cache.max-states", 1, 1_000_000_000),
                            _ttl_seconds(read, "onceflow.state.history.retention", "keep forever"),
                            read.integer("onceflow.state.max-bytes", 1024, 16_777_216),
                            _ttl_seconds(read, "onceflow.state.expire-after", "never expire")),
        commit=CommitSettings(read.duration("onceflow.commit.interval", 0.01, 3600)),
        stores=StoresSettings(
            redis,
            cassandra_settings(read),
        ),
        shutdown=ShutdownSettings(read.duration("onceflow.shutdown.timeout", 0.1, 3600)),
        metrics=MetricsSettings(
            read.duration("onceflow.metrics.stats-interval", 0.1, 3600),
            read.integer("onceflow.metrics.port", 0, 65535),
            read.text("onceflow.metrics.host"),
            read.duration("onceflow.metrics.stall-timeout", 1, 86400),
            read.duration("onceflow.metrics.lag-interval", 0.1, 3600),
        ),
        landing=LandingSettings(None if read.raw("onceflow.landing.dir") is None
                                else read.text("onceflow.landing.dir")),
        analytics=analytics_settings(read),
        supervision=_supervision(read),
        single_worker=read.boolean("onceflow.single-worker"),
        pipeline_settings=_pipeline_settings(read),
        windows=WindowSettings(read.duration("onceflow.windows.idle-timeout", 1, 7 * 86400),
                               read.duration("onceflow.windows.max-future", 1, 3650 * 86400)),
        cpu=_cpu(read),
        warnings=tuple(read.warnings),  # last: after every read
    )


def _cpu(read: Reader) -> str | int:
    """``auto``, ``off`` or a CPU this process may run on (``runtime.cpu_placement``)."""
    key = "onceflow.cpu"
    value = read.raw(key)
    if value in ("auto", "off"):
        return str(value)
    allowed = sorted(os.sched_getaffinity(0)) if cpu_placement.supported() else []
    if isinstance(value, int) and not isinstance(value, bool) and value in allowed:
        return value
    if isinstance(value, str) and value.isdigit() and int(value) in allowed:
        return int(value)  # from $ONCEFLOW_CPU
    expected = f"auto, off or one of this process's CPUs {allowed}" if allowed else \
        "auto or off (this platform cannot pin threads to a CPU)"
    raise read.error(key, f"expected {expected}, got {show(value, key)}")


def _ttl_seconds(read: Reader, key: str, zero: str) -> float:
    """0s (``zero``: what it means there) or 1s..20 years: the stores' TTLs, Cassandra's
    whole seconds at most that long."""
    seconds = read.duration(key, 0, math.inf)
    if seconds and not 1 <= seconds <= 7300 * 86400:
        raise read.error(key, f"expected 0s ({zero}) or a duration in 1s..7300d, "
                         f"got {show(read.raw(key))}")
    return seconds


def _pipeline_settings(read: Reader) -> dict[str, Any]:
    key = "onceflow.pipeline-settings"
    raw = read.raw(key)
    if raw is None:
        return {}
    if not isinstance(raw, ConfigTree):
        raise read.error(key, f"expected an object of factory arguments, got {show(raw)}")
    settings: dict[str, Any] = raw.as_plain_ordered_dict()
    for name in settings:
        if not re.fullmatch(r"[A-Za-z_][\w-]*", name):
            raise read.error(f"{key}.{name}", "expected a name that can be a Python keyword "
                             "argument (letters, digits, _ and -)")
    return dict(settings)


def _supervision(read: Reader) -> SupervisionSettings:
    k = "onceflow.supervision."
    return SupervisionSettings(
        policy=read.text(k + "policy", r"one_for_one|one_for_all|rest_for_one",
                         "one of one_for_one, one_for_all, rest_for_one"),
        max_restarts=read.integer(k + "max-restarts", 0, 1000),
        within=read.duration(k + "within", 0.1, 86400),
        backoff_initial=read.duration(k + "backoff.initial", 0.0, 3600),
        backoff_max=read.duration(k + "backoff.max", 0.0, 3600),
        backoff_jitter=read.duration(k + "backoff.jitter", 0.0, 3600),
        escalation_grace=read.duration(k + "escalation-grace", 0.0, 3600),
        max_repeats=read.integer(k + "max-repeats", 0, 1000),
    )


_HOCON_ERRORS = (ParseBaseException, ConfigException, OSError)


def _hocon_error(label: str, exc: Exception) -> ConfigError:
    """One line for what pyhocon raised: a syntax error, a bad substitution or include."""
    if isinstance(exc, ParseBaseException):
        where = f"line {exc.lineno}, column {exc.col}"
        return ConfigError(label, None, f"{where}: syntax error: {exc.msg}")
    if isinstance(exc, OSError):  # include required("missing.conf")
        return ConfigError(label, None, f"cannot include: {exc}")
    return ConfigError(label, None, " ".join(str(exc).split()))  # pyhocon gives (line: N, col: M)


def _merge(base: ConfigTree, top: ConfigTree) -> ConfigTree:
    """Merge the unresolved ``top`` over the resolved ``base`` in place, as HOCON does.

    Not ConfigTree.merge_configs: that makes an app's ``key = ${?VAR}`` fall back
    to base's value instead of the app's own earlier one (chimpler/pyhocon#154).
    """
    for key, value in top.items():
        old = OrderedDict.get(base, key)  # ConfigTree.get would split quoted keys on dots
        if isinstance(old, ConfigTree) and isinstance(value, ConfigTree):
            _merge(old, value)
            continue
        if isinstance(value, ConfigValues):  # unset ${?VAR} falls back along overridden_value
            tail = value
            while isinstance(tail.overridden_value, ConfigValues):
                tail = tail.overridden_value
            if tail.overridden_value is None:
                tail.overridden_value = old
        OrderedDict.__setitem__(base, key, value)
        if base.root:  # pyhocon's self-reference fixup reads each root key's history
            base.history[key] = [*base.history.get(key, []), value]
    return base


def _resolve(tree: ConfigTree) -> ConfigTree:
    """Resolve substitutions in place, after fixing what pyhocon's own merges broke.

    pyhocon copies an object when a later one merges into it, but leaves its
    substitutions pointing at the old copy, so a nested ``key = ${?VAR}`` with
    VAR unset resolves to None instead of the earlier value (chimpler/pyhocon#331).
    """

    def relink(node: ConfigTree) -> None:
        for key, value in node.items():
            if isinstance(value, ConfigValues):
                value.parent, value.key = node, key
            elif isinstance(value, ConfigTree):
                relink(value)

    relink(tree)
    ConfigParser.resolve_substitutions(tree)
    return tree


def _apply_override(tree: ConfigTree, key: str, raw: str) -> None:
    """Put ``key = raw`` (one HOCON value, parsed on its own) into the resolved ``tree``."""
    if not key.startswith("onceflow."):
        raise ConfigError(OVERRIDES, key, "unknown key (settings live under 'onceflow.')")
    try:
        parsed = ConfigFactory.parse_string(f"value = {raw}")
    except _HOCON_ERRORS:
        parsed = None
    if parsed is None or list(parsed) != ["value"]:  # `a:1,b:2` is "a:1" plus a key `b`
        raise ConfigError(OVERRIDES, key, f"expected one HOCON value, got {show(raw, key)} "
                          "(quote it)")
    tree.put(key, parsed.get("value", None))


def _check_keys(
    tree: object, schema: ConfigTree, prefix: str, origin: Callable[[str], str]
) -> None:
    """Reject keys the reference does not know, and scalars where it has objects."""
    if not isinstance(tree, ConfigTree):
        raise ConfigError(origin(prefix), prefix, f"expected an object, got {show(tree, prefix)}")
    for name, value in tree.items():
        key = f"{prefix}.{name}"
        if name not in schema:
            close = difflib.get_close_matches(name, list(schema), n=1)
            hint = f"did you mean {close[0]!r}?" if close else "known: " + ", ".join(schema)
            raise ConfigError(origin(key), key, f"unknown key ({hint})")
        if isinstance(schema[name], ConfigTree):
            _check_keys(value, schema[name], key, origin)


def _declares(tree: ConfigTree, key: str) -> bool:
    """Whether ``tree`` (the unresolved application file) assigns ``key``."""
    node: object = tree
    for part in key.split("."):
        if not isinstance(node, ConfigTree) or part not in node:
            return False
        node = node[part]
    return True
