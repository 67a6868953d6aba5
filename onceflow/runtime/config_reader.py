"""Typed, range-checked reads from a resolved HOCON tree, and their error messages.

:class:`Reader` turns each value into a Python type or raises a
:class:`ConfigError` naming the file (or variable, or overrides) it came from,
the key and what was expected; :func:`parse_duration`, :func:`fmt` and
:func:`show` spell durations and values the same way in every message (and never
show a secret: the value of a ``...password`` key, or the password in a URL).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta

from pyhocon import ConfigTree


class ConfigError(Exception):
    """A bad configuration: ``str(err)`` is ``<file>: <key>: <what was expected>``.

    ``key`` is the full dotted path, or None when the file as a whole is wrong
    (missing, or not HOCON); ``file`` is where the bad value came from.
    """

    def __init__(self, file: str, key: str | None, expected: str) -> None:
        self.file = file
        self.key = key
        self.expected = expected
        super().__init__(f"{file}: {key}: {expected}" if key else f"{file}: {expected}")


_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ns|us|ms|s|m|h|d)\s*")


def parse_duration(value: object) -> float:
    """Return a duration (``"500ms"``, ``"10s"``, ``"2m"``, ``"1h"``, a timedelta) in seconds.

    pyhocon turns unquoted ``10s`` (or ``10 seconds``) into a timedelta but
    leaves ``1.5s`` and quoted values as strings, so both are accepted; strings
    take the short units ns, us, ms, s, m, h, d. A bare number is refused: HOCON
    reads it as milliseconds, most people as seconds.

    Raises:
        ValueError: ``value`` is not a non-negative amount with a unit.
    """
    if isinstance(value, timedelta):
        return value.total_seconds()
    relative = _relativedelta_seconds(value)
    if relative is not None:
        return relative
    match = _DURATION.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f"not a duration: {value!r}")
    return float(match[1]) * _UNITS[match[2]]


def _relativedelta_seconds(value: object) -> float | None:
    """Seconds of a ``dateutil.relativedelta`` without months or years, else None.

    pyhocon builds durations as relativedelta instead of timedelta whenever
    python-dateutil is importable (matplotlib brings it in).
    """
    if type(value).__name__ != "relativedelta" or any(
        getattr(value, name, 1) for name in ("months", "years")
    ):
        return None
    parts = ("days", 86400.0), ("hours", 3600.0), ("minutes", 60.0), ("seconds", 1.0), \
        ("microseconds", 1e-6)
    total = sum(float(getattr(value, name, 0)) * size for name, size in parts)
    return total if total >= 0 else None


#: The origin named in errors about a ``--set`` override (the command line).
OVERRIDES = "<overrides>"

#: A name Kafka accepts for a topic (its ``Topic.validate``): 1 to 249 ASCII letters,
#: digits, ``.``, ``_`` and ``-``, but not ``.`` or ``..``.
KAFKA_TOPIC = r"(?!\.\.?\Z)[a-zA-Z0-9._-]{1,249}"
KAFKA_TOPIC_HINT = "a Kafka topic name (1 to 249 of a-z A-Z 0-9 . _ -, not '.' or '..')"


class Reader:
    """Typed, range-checked reads from the resolved tree, blaming the right source."""

    def __init__(self, tree: ConfigTree, origin: Callable[[str], str]) -> None:
        self._tree = tree
        self._origin = origin
        #: ``<file>: <key>: <problem>`` lines for values that are legal but most likely not
        #: what was meant; the worker logs them as warnings at start.
        self.warnings: list[str] = []

    def error(self, key: str, expected: str) -> ConfigError:
        return ConfigError(self._origin(key), key, expected)

    def warn(self, key: str, problem: str) -> None:
        self.warnings.append(f"{self._origin(key)}: {key}: {problem}")

    def origin(self, key: str) -> str:
        """Where ``key``'s value came from: the file, ``$ENV_VAR`` or ``OVERRIDES``."""
        return self._origin(key)

    def raw(self, key: str) -> object:
        return self._tree.get(key, None)

    def text(self, key: str, pattern: str = r".*\S.*", expected: str = "a non-empty string") -> str:
        value = self.raw(key)
        if not isinstance(value, str) or not re.fullmatch(pattern, value):
            raise self.error(key, f"expected {expected}, got {show(value, key)}")
        return value

    def integer(self, key: str, low: int, high: int) -> int:
        value = self.raw(key)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self.error(key, f"expected an integer in {low}..{high}, got {show(value, key)}")
        return value

    def boolean(self, key: str) -> bool:
        value = self.raw(key)
        if not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {show(value, key)}")
        return value

    def number(self, key: str, low: float, high: float) -> float:
        value = self.raw(key)
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not low <= value <= high:
            raise self.error(key, f"expected a number in {low}..{high}, got {show(value, key)}")
        return float(value)

    def memory(self, key: str) -> str:
        """A JVM memory size (``512m``, ``2g``). pyhocon reads an unquoted ``512m`` as a
        duration of 512 minutes (``m`` is its minute), so a duration of whole minutes is
        read back as that many megabytes: ``512m`` means the same quoted or not."""
        value = self.raw(key)
        if not isinstance(value, str):
            try:
                minutes = parse_duration(value) / 60
            except (ValueError, TypeError):
                minutes = 0.0
            if minutes >= 1 and minutes.is_integer():
                value = f"{int(minutes)}m"
        if not isinstance(value, str) or not re.fullmatch(r"\d+[kmgtKMGT]", value):
            raise self.error(key, f"expected a JVM memory size such as 512m or 2g, got "
                                  f"{show(self.raw(key), key)}")
        return value

    def duration(self, key: str, low: float, high: float) -> float:
        value = self.raw(key)
        try:
            seconds = parse_duration(value)
        except ValueError:
            raise self.error(
                key, f"expected a duration like 10s or 500ms, got {show(value, key)}"
            ) from None
        if not low <= seconds <= high:
            expected = f"a duration in {fmt(low)}..{fmt(high)}"
            raise self.error(key, f"expected {expected}, got {show(value, key)}")
        return seconds


def fmt(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds * 1000:g}ms"


#: The last part of a key whose value is a secret (``sasl.password``, ``ssl.key-password``).
_SECRET_KEY = re.compile(r"(password|passphrase|secret|token)$")
#: The password of a URL's user info (``redis://user:PASSWORD@host``).
_URL_PASSWORD = re.compile(r"(//[^/@\s:]*:)[^/@\s]+@")


def is_secret_key(key: str) -> bool:
    """Whether ``key`` names a secret, whose value no message may show."""
    return bool(_SECRET_KEY.search(key.rsplit(".", 1)[-1]))


def show(value: object, key: str | None = None) -> str:
    """``value`` as an error message shows it: never a secret key's value, nor a URL's password."""
    if key is not None and is_secret_key(key) and value is not None:
        return "a value (not shown: a secret)"
    if isinstance(value, str):
        return repr(_URL_PASSWORD.sub(r"\1****@", value))
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, timedelta):
        return fmt(value.total_seconds())
    relative = _relativedelta_seconds(value)
    if relative is not None:
        return fmt(relative)
    if isinstance(value, ConfigTree):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return str(value)
