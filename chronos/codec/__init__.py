"""Chronos header codec: parse/validate chronos Kafka headers and (de)serialize header lists.

Two implementations share one interface (see ``chronos.codec.types``):

* ``chronos.codec._native`` -- Cython, built from ``native/_native.pyx``;
* ``chronos.codec._python`` -- pure Python reference.

Both also read a consumed message's headers straight from librdkafka (``read_headers``, see
``chronos.codec.librdkafka``), so that no header name can break the consumer.

The environment variable ``CHRONOS_IMPL`` selects one at import time:
``native`` (fail with ImportError if it cannot be loaded), ``python``, or
unset/empty (native if available, else python).  ``IMPL`` tells which one is in use.
"""
from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import TYPE_CHECKING, cast

from chronos.codec import types as _types
from chronos.codec.types import (
    ACTION_CANCEL,
    ACTION_REPLACE,
    CHRONOS_HEADERS,
    HEADER_ACTION,
    HEADER_CRON,
    HEADER_DEADLINE,
    HEADER_DST_POLICY,
    HEADER_ID,
    HEADER_ORDERING_KEY,
    HEADER_TIMEZONE,
    HEADER_TOPIC,
    MAX_DEADLINE_MS,
    MAX_DEADLINE_US,
    MAX_ID_LENGTH,
    MAX_ORDERING_KEY_LENGTH,
    MAX_TOPIC_LENGTH,
    MIN_DEADLINE_US,
    REASON_CODES,
    COPY_COLUMNS,
    Codec,
    CopyRow,
    Parsed,
    bad_header_name,
    escape_header_name,
)

__all__ = ["IMPL", "implementation", "parse_headers", "parse_deadline", "encode_headers", "decode_headers",
           "read_headers", "copy_rows", "intake", *_types.__all__]

ENV_VAR = "CHRONOS_IMPL"
_MODULES = {"native": "chronos.codec._native", "python": "chronos.codec._python"}


def implementation(name: str) -> ModuleType:
    """Return the codec module ``"native"`` or ``"python"`` (both share one interface)."""
    if name not in _MODULES:
        raise ValueError(f"unknown codec implementation {name!r}: expected 'native' or 'python'")
    if name == "native":
        try:
            return importlib.import_module(_MODULES["native"])
        except ImportError as exc:
            raise ImportError(
                f"CHRONOS_IMPL=native but the native codec could not be loaded: {exc} "
                "(build it with `pip install -e . --no-build-isolation` or "
                "`python setup.py build_ext --inplace`)"
            ) from exc
    return importlib.import_module(_MODULES[name])


def _select(choice: str | None) -> ModuleType:
    """Pick the implementation for a ``CHRONOS_IMPL`` value (None/"" = auto)."""
    name = (choice or "").strip().lower()
    if name in _MODULES:
        return implementation(name)
    if name:
        raise ValueError(
            f"invalid {ENV_VAR}={choice!r}: expected 'native', 'python' or unset/empty (auto)"
        )
    try:
        return implementation("native")
    except ImportError:
        return implementation("python")


if TYPE_CHECKING:  # the type checker holds both modules (the native one through its .pyi) to Codec
    from chronos.codec import _native, _python
    _native_codec: Codec = _native
    _python_codec: Codec = _python

_impl = cast(Codec, _select(os.environ.get(ENV_VAR)))

IMPL = _impl.IMPL
parse_headers = _impl.parse_headers
parse_deadline = _impl.parse_deadline
encode_headers = _impl.encode_headers
decode_headers = _impl.decode_headers
read_headers = _impl.read_headers
copy_rows = _impl.copy_rows
intake = _impl.intake

del _impl
