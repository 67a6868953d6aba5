"""Checks that turn hostile input into dead letters before it reaches a store.

A source topic may hold anything its writers put there. What a user function
returns is checked where the runner meets it; these are the checks on what
comes from the record itself and on what a store must hold: a header name that
is not UTF-8, a source chain no onceflow step can have written, and aggregate
keys no store can encode. Each
raises what the runner dead-letters (``FormatError``, ``StageFailure``), so the
record is refused with a reason and the batch goes on.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from onceflow.stages.formats import FormatError
from onceflow.stages.lineage import Position, RootPartition
from onceflow.stages.outcome import ConsumedHeader, StageFailure
from onceflow.stages.state import StateTable, TopicPartition

#: Most hops a source chain may have (onceflow's own chains grow by one per republish hop).
MAX_HOPS = 100


def check_header_names(headers: Sequence[ConsumedHeader]) -> None:
    """FormatError for a header name that is not UTF-8.

    Kafka header names are strings; a hand-made batch can still hold any bytes
    there, which the consumer reads with ``surrogateescape``
    (``actors.tolerant_records``). Such a record breaks the protocol: it is
    dead-lettered with the name's bytes rather than handed to user functions,
    whose encoding of the name would fail far from the record.
    """
    for name, _ in headers:
        if not name.isascii():
            try:
                name.encode()
            except UnicodeEncodeError:
                raw = name.encode(errors="surrogateescape") if _escaped(name) else name
                raise FormatError("header", f"header name {raw!r} is not UTF-8 (Kafka "
                                  "header names are strings)") from None


def _escaped(name: str) -> bool:
    """Whether ``name`` came from bytes decoded with ``surrogateescape``."""
    try:
        name.encode(errors="surrogateescape")
    except UnicodeEncodeError:
        return False
    return True


def check_chain(hops: int, root: RootPartition, position: Position, consumed: TopicPartition,
                offset: int) -> None:
    """FormatError for a source chain no onceflow step can have written: ``hops`` entries,
    the ``root`` and ``position`` it gives a record consumed from ``consumed`` at ``offset``
    (``lineage.chain_origin``).

    Its root cannot be the partition it is consumed from at or after its own
    offset (an output is written after its input); such a chain would set the
    record's watermarks ahead of the partition and make later records look like
    copies. More than ``MAX_HOPS`` hops would grow every state it reaches.
    """
    if hops > MAX_HOPS:
        raise FormatError("chain", f"source chain of {hops} hops (at most {MAX_HOPS})")
    if position[0] >= offset and root == consumed:
        raise FormatError("chain", f"source chain rooted at {root[0]}/{root[1]}/"
                          f"{position[0]}, not before the record itself ({consumed[0]}/"
                          f"{consumed[1]}/{offset}): forged or corrupt")


def unknown_keys(shares: Iterable[tuple[StateTable, Sequence[Any]]]
                 ) -> list[tuple[StateTable, str]]:
    """The (table, key) pairs of one record not cached yet; StageFailure for a key no store
    can hold.

    Keys come from user functions over hostile input: a number, a list or a
    string with lone surrogates (JSON ``"\\ud800"``) would fail the store's
    load or write, far from the record, and stop the worker (a batch mixing
    ``str`` and ``int`` keys could not even be sorted for the load).
    """
    found = []
    for table, keys in shares:
        states = table.states
        for key in keys:
            if type(key) is not str:
                raise StageFailure(table.spec.id, TypeError(
                    f"key must be str, got {type(key).__name__} {_short(key)}"))
            if key not in states:
                if not key.isascii():
                    try:
                        key.encode()
                    except UnicodeEncodeError as error:
                        raise StageFailure(table.spec.id, ValueError(
                            f"key {_short(key)} is not valid UTF-8 text: {error}")) from error
                found.append((table, key))
    return found


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else f"{text[:200]}..."
