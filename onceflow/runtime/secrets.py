"""Secrets in settings: read from a file or the environment, never shown.

A secret setting ``<key>`` (e.g. ``onceflow.stores.redis.password``) may be
given three ways: ``<key>-file`` (a path; the file's content, trailing
newline stripped: how Docker and Kubernetes mount secrets), or ``<key>`` in
the HOCON file, usually as an environment substitution
(``password = ${?REDIS_PASSWORD}``). Never on the command line: ``--set``
values show up in ``ps`` and shell history, so a secret given there stops
the worker at start.

The value is wrapped in ``Secret``, whose ``repr``/``str`` never show it, so
a Settings object can be logged, reported in /health or put in an error
message without leaking it. Only the code that opens a connection calls
``reveal()``.
"""

from __future__ import annotations

from pathlib import Path

from onceflow.runtime.config_reader import OVERRIDES, Reader

MASK = "****"


class Secret:
    """A secret value that does not print itself."""

    __slots__ = ("_value",)

    def __init__(self, value: str):
        self._value = value

    def reveal(self) -> str:
        """The value itself: only for the library call that needs it."""
        return self._value

    def __repr__(self) -> str:
        return f"Secret({MASK})"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


def read_secret(read: Reader, key: str) -> Secret | None:
    """The secret ``key`` from ``key`` or ``key-file``; None if neither is set.

    Raises ConfigError (without the value) if both are set, if it came from
    the command line, or if the file cannot be read or is empty.
    """
    inline, path = read.raw(key), read.raw(f"{key}-file")
    if inline is not None and path is not None:
        raise read.error(key, f"expected {key} or {key}-file, not both")
    if inline is not None:
        if read.origin(key) == OVERRIDES:
            raise read.error(key, "expected a secret from a file (-file) or the environment "
                             "(an ${?VAR} substitution in the config file), not the command "
                             "line, where ps and shell history show it")
        if not isinstance(inline, str) or not inline:
            raise read.error(key, "expected a non-empty string (value not shown)")
        return Secret(inline)
    if path is None:
        return None
    if not isinstance(path, str) or not path:
        raise read.error(f"{key}-file", "expected the path of a file holding the secret")
    try:
        value = Path(path).read_text(encoding="utf-8").rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise read.error(f"{key}-file", f"expected a readable file, got {path!r}: "
                         f"{type(exc).__name__}") from None
    if not value:
        raise read.error(f"{key}-file", f"expected a file holding the secret, {path!r} is empty")
    return Secret(value)
