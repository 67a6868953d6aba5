"""Retry with exponential backoff and jitter for store calls.

An unreachable store is retried and reported, never skipped: the caller
blocks, so nothing behind the failed call is committed meanwhile. A store
that refuses the worker's credentials, certificate or a command is not
retried: waiting does not fix a wrong password, so the call raises
``StoreAccessDenied`` at once and the worker stops with the configuration error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from tenacity import (
    Retrying,
    before_sleep_log,
    retry_if_exception,
    stop_after_delay,
    wait_exponential_jitter,
)

from onceflow.stores.access import access_denied

T = TypeVar("T")
log = logging.getLogger(__name__)


def _transient(error: BaseException) -> bool:
    return (isinstance(error, ConnectionError | TimeoutError | OSError) or type(
        error
    ).__module__.startswith(("redis.", "cassandra."))) and access_denied(error) is None


def retrying(what: str, call: Callable[[], T], give_up_after: float = 300.0) -> T:
    """Run ``call``, retrying transient failures with backoff for up to ``give_up_after`` s.

    ``call`` runs in this frame (tenacity's iterator form): a decorated
    function would sit in a reference cycle with the wrapper tenacity builds,
    keeping ``call`` and what it holds (a snapshot's rows) alive until the
    cyclic GC's rare full collections: worker memory grew with every snapshot.
    """
    policy = Retrying(
        retry=retry_if_exception(_transient),
        wait=wait_exponential_jitter(multiplier=0.1, max=5.0),
        stop=stop_after_delay(give_up_after),
        before_sleep=before_sleep_log(log, logging.WARNING),
        reraise=True,
    )
    try:
        for attempt in policy:
            with attempt:
                return call()
    except Exception as error:
        denied = access_denied(error)
        if denied is not None:
            log.error("%s failed: %s", what, denied)
            if denied is not error:
                raise denied from error
        else:
            log.error("%s failed after retries", what)
        raise
    raise AssertionError("tenacity stopped without a result or an error")  # reraise=True
