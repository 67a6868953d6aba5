"""Checks that turn hostile input into dead letters before it reaches a store.

A source topic may hold anything its writers put there. What a user function
returns is checked where the runner meets it; these are the checks on what
comes from the record itself and on what a store must hold: a header name that
is not UTF-8, a source chain no onceflow step can have written, aggregate
keys no store can encode, and aggregate values no store can hold. Each
raises what the runner dead-letters (``FormatError``, ``StageFailure``), so the
record is refused with a reason and the batch goes on.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final, cast

from onceflow.stages.formats import FormatError
from onceflow.stages.lineage import Position, RootPartition
from onceflow.stages.outcome import ConsumedHeader, StageFailure
from onceflow.stages.state import TopicPartition, compact_json
from onceflow.stages.state_table import StateTable

#: Most hops a source chain may have (onceflow's own chains grow by one per republish hop).
MAX_HOPS = 100
#: Integers up to this in magnitude encode in at most 19 characters (``_fits``).
_SHORT_INT: Final = 999_999_999_999_999_999
#: Most bytes one character of a str encodes to: the json module writes a character
#: beyond U+FFFF as two escapes (``\\ud800\\udc00``) when orjson cannot take the value.
_CHAR_BYTES: Final = 12
#: Nesting ``_fits`` walks; a deeper value is encoded to be measured.
_WALK_DEPTH: Final = 64


class UnstorableState(ValueError):
    """A fold or init made a value the state store cannot hold."""


def check_header_names(headers: Sequence[ConsumedHeader]) -> None:
    """FormatError for a header name that is not UTF-8.

    Kafka header names are strings; a hand-made batch can still hold any bytes
    there, which the consumer reads with ``surrogateescape``
    (``kafka.tolerant_records``). Such a record breaks the protocol: it is
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
            if type(key) is not str or key not in states:  # a cached key was checked
                try:
                    found.append((table, checked_key(key)))
                except (TypeError, ValueError) as error:
                    raise StageFailure(table.spec.id, error) from error
    return found


def checked_key(key: object) -> str:
    """``key`` if a store and a Kafka record can hold it: a ``str`` of valid UTF-8 text;
    otherwise TypeError or ValueError naming what it is.

    The one rule for the keys user functions return, an aggregate's or a republish
    step's: checked before the key reaches a typed call, whose own refusal names
    neither the key nor the rule (protobuf's "bad argument type for built-in
    operation").
    """
    if type(key) is not str:
        raise TypeError(f"key must be str, got {type(key).__name__} {_short(key)}")
    if not key.isascii():
        try:
            key.encode()
        except UnicodeEncodeError as error:
            raise ValueError(f"key {_short(key)} is not valid UTF-8 text: {error}") from error
    return key


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else f"{text[:200]}..."


def check_state(stage_id: str, key: str, value: Any, limit: int) -> None:
    """StageFailure, naming the stage and the key, unless the stores can hold ``value``:
    ``compact_json`` (the states' encoder) takes it, in at most ``limit`` bytes.

    Called by every fold path on each value it is about to install, before it
    installs any: the record that made the value is known (it is dead-lettered,
    the states stay as before it), where the snapshot that encodes the state
    later knows no record and could only fail the worker, again on each replay.
    On the record path, so cheap: ``_fits`` bounds the encoding's length from
    the value's types alone, and only a value it cannot bound is encoded.
    """
    if _fits(value, limit, 0) >= 0:
        return
    try:
        size = len(compact_json(value))
    except Exception as error:  # TypeError, ValueError (a cycle, a huge int), RecursionError
        raise StageFailure(stage_id, UnstorableState(
            f"the state is not JSON-serialisable ({type(error).__name__}: {error})"), key
        ) from error
    if size > limit:
        raise StageFailure(stage_id, UnstorableState(
            f"the state encodes to {size} bytes, more than onceflow.state.max-bytes "
            f"({limit})"), key)


def _fits(value: object, budget: int, depth: int) -> int:
    """What is left of ``budget`` (bytes) once ``value`` is encoded, at worst; -1 when
    unknown (a type ``compact_json`` may refuse, a huge number, deep nesting) or short.

    Every type it bounds, ``compact_json`` writes (a str's character is at most
    12 bytes: the json module escapes one beyond U+FFFF as two, ``\\ud800\\udc00``;
    a float at most 24 characters; tests/unit/
    test_poisoned_states.py checks the bound against the encoder).
    """
    kind = type(value)
    if kind is int:
        number = cast(int, value)
        return budget - 20 if -_SHORT_INT <= number <= _SHORT_INT else -1
    if kind is str:
        return budget - _CHAR_BYTES * len(cast(str, value)) - 2
    if kind is float:
        return budget - 24
    if kind is bool or value is None:
        return budget - 5
    if depth >= _WALK_DEPTH:
        return -1
    if kind is dict:
        budget -= 2
        for name, item in cast(dict[object, object], value).items():
            if type(name) is not str:
                return -1
            budget -= _CHAR_BYTES * len(name) + 3
            if type(item) is int:  # the commonest leaf, without a call (a counter's)
                number = item
                if not -_SHORT_INT <= number <= _SHORT_INT:
                    return -1
                budget -= 20
            else:
                budget = _fits(item, budget, depth + 1)
            if budget < 0:
                return -1
        return budget
    if kind is list or kind is tuple:
        budget -= 2
        # a list or a tuple (a cast is checked at run time: ``onceflow.compiled``)
        for item in cast(Sequence[object], value):
            budget = _fits(item, budget - 1, depth + 1)
            if budget < 0:
                return -1
        return budget
    return -1
