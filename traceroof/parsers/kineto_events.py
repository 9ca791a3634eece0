"""The typed Kineto events the decoder produces, its statistics and the header helpers.

:class:`Event` holds only the fields traceroof uses; its ``args`` struct :class:`Args` is
built from the declarative vocabulary (:data:`.kineto_vocab.ARGS`: one field per spelling of
each argument, typed as declared). The decoders here are shared by the in-memory decoder
(:mod:`.kineto_decode`), the recovery of damaged input (:mod:`.kineto_recover`) and the
streaming decoder (:mod:`.kineto_stream`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from . import kineto_vocab as V
from .kineto_native import decode_piece

Num = int | float | str | None

#: what a msgspec decode raises on input it cannot decode: ``DecodeError`` (``ValidationError``
#: is one) and ``RecursionError`` for nesting deeper than the interpreter's recursion limit
#: (msgspec counts its depth against it: ``[[[…]]]`` 1,000 deep in an event or header)
DECODE_ERRORS = (msgspec.DecodeError, RecursionError)

#: an absent raw field (msgspec cannot make ``Raw`` optional); ``len(NO_RAW) == 0``.
NO_RAW = msgspec.Raw(b"")

#: the decoded type and default of each :data:`.kineto_vocab.NUMBER` / ``JSON_TEXT`` / ``ANY``
_VALUE_TYPES: dict[str, tuple[Any, Any]] = {
    V.NUMBER: (Num, None),
    V.JSON_TEXT: (msgspec.Raw, NO_RAW),
    V.ANY: (Any, None),
}


def _args_struct() -> type[msgspec.Struct]:
    """The ``args`` struct: one field per spelling of each :data:`.kineto_vocab.ARGS` entry
    (:meth:`~.kineto_vocab.Arg.fields`), renamed to its raw name. Unknown keys are skipped
    by the decoder."""
    fields = []
    for arg in V.ARGS:
        typ, default = _VALUE_TYPES[arg.value]
        for name, sp in zip(arg.fields(), arg.spellings):
            fields.append((name, typ, msgspec.field(default=default, name=sp.raw)))
    return msgspec.defstruct("Args", fields, gc=False, module=__name__)


#: The ``args`` keys traceroof reads (built from :data:`.kineto_vocab.ARGS`).
Args = _args_struct()


class Event(msgspec.Struct, gc=False):
    """One ``traceEvents`` element, only the fields traceroof uses."""

    ph: Any = None
    # a number or string (``"name": 7`` is kept as "7"): an array or object here is a damaged
    # event, dropped and counted by the recovery, never a column of nested values (polars
    # takes seconds and GBs to refuse ``[[[...]]]`` 500 deep)
    cat: Num = None
    name: Num = None
    pid: Num = None
    tid: Num = None
    ts: msgspec.Raw = NO_RAW
    dur: msgspec.Raw = NO_RAW
    id: Num = None
    args: Args | None = None


class Top(msgspec.Struct):
    """The top-level object. Header keys may come before or after ``traceEvents``."""

    traceEvents: msgspec.Raw = NO_RAW
    schemaVersion: Any = None
    deviceProperties: Any = None
    computeProperties: Any = None
    distributedInfo: Any = None
    baseTimeNanoseconds: Any = None
    displayTimeUnit: Any = None
    record_shapes: Any = None
    traceName: Any = None
    traceroof: Any = None  # our own generator's marker (synthetic traces)
    cuda_runtime_version: Any = None
    cuda_driver_version: Any = None
    hip_runtime_version: Any = None
    roctracer_version: Any = None


EVENTS_DECODER = msgspec.json.Decoder(list[Event])
EVENT_DECODER = msgspec.json.Decoder(Event)
HEADER_DECODER = msgspec.json.Decoder(Top)

#: Candidate boundary between two events: ``}`` ``,`` ``{`` with any whitespace.
BOUNDARY = re.compile(rb"\}\s*,\s*\{")
EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
LEADING_WS = re.compile(rb"\s*")

#: how many event boundaries a chunk may be extended by when its cut fell inside a string
MAX_EXTENSIONS = 16

#: ``on_chunk(events)``: called with each decoded list of :class:`Event`, in file order
OnChunk = Callable[[list[Event]], None]


@dataclass
class DecodeStats:
    """What the decoder saw and what it had to repair or drop."""

    events: int = 0
    repaired: int = 0
    encoding_repairs: int = 0
    dropped: int = 0
    truncated_at: int | None = None
    #: the cut fell inside an event (dropped), not between two complete events
    truncated_mid_event: bool = True
    dropped_offsets: list[int] = field(default_factory=list)
    strict: bool = True


@dataclass
class Decoded:
    """A decode's outcome: the header keys (before and after the event array) and the stats."""

    header: Top
    stats: DecodeStats


def decode_header_prefix(prefix: bytes) -> Top:
    """The header keys before ``"traceEvents"`` (``{"k": v, ...,``); empty when they do not
    decode."""
    top = decode_prefix_strict(prefix)
    return Top() if top is None else top


def decode_prefix_strict(prefix: bytes) -> Top | None:
    """As :func:`decode_header_prefix`, None when the prefix is not valid JSON."""
    text = prefix.rstrip()
    if text.endswith(b","):
        text = text[:-1]
    try:
        return HEADER_DECODER.decode(text + b"}")
    except DECODE_ERRORS:
        return None


def merge_headers(a: Top, b: Top) -> Top:
    """``a`` with the keys it lacks taken from ``b`` (a header split around the events)."""
    for f in Top.__struct_fields__:
        if getattr(a, f) is None and getattr(b, f) is not None:
            setattr(a, f, getattr(b, f))
    return a


_TRAILING = re.compile(r"trailing characters \(byte (\d+)\)")
#: what follows the ``]`` that closes the event array: ``, "key"`` or the closing ``}``
_AFTER_CLOSE = re.compile(rb'\]\s*(?:,\s*"|\})')


def closing_bracket(wrapped: bytes, exc: Exception, scanner: Any = None) -> tuple[int, list[Event]] | None:
    """Where the event array closes, when the strict decode of ``wrapped`` (``[`` + piece +
    ``]``) failed because the array ended inside the piece (msgspec: ``trailing characters
    (byte N)``, N at or just past the first character after the array) and the header tail
    follows (``, "key"`` or ``}``): the index of that ``]`` in the piece, and the events
    before it (decoded by ``scanner``, a :class:`~.kineto_native.Scanner` or None:
    :func:`~.kineto_native.decode_piece`); None otherwise."""
    m = _TRAILING.search(str(exc))
    if m is None:
        return None
    at = int(m.group(1))
    close = wrapped.rfind(b"]", 0, at)
    if close < 1 or len(wrapped[close + 1 : at].strip()) > 1 or not _AFTER_CLOSE.match(wrapped, close):
        return None
    try:
        events = decode_piece(scanner, memoryview(wrapped)[: close + 1])
    except DECODE_ERRORS:
        return None
    return close - 1, events
