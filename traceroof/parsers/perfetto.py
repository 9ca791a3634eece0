"""Perfetto protobuf traces (``.pftrace``, ``.perfetto-trace``): recognised, to be rejected
with one clear message instead of being misread.

A Perfetto ``Trace`` is ``repeated TracePacket packet = 1``, so its first byte is the tag
``0x0a``, as an ``XSpace``'s (``repeated XPlane planes = 1``). The packets are told apart by
their own fields (perfetto ``protos/perfetto/trace/trace_packet.proto``): an XPlane holds
only fields 1-6, a TracePacket carries its ``timestamp`` (8), ``trusted_packet_sequence_id``
(10), ``track_event`` (11), ``track_descriptor`` (60), ... . Reading it is not supported:
:data:`FORMAT`'s reader raises :class:`~traceroof.errors.TraceFormatError` (exit code 4).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import TraceFormatError
from . import protowire as w
from .registry import CONTENT, Head, InputFormat

if TYPE_CHECKING:
    from ..progress import Progress
    from ..trace import Trace

#: TracePacket fields that no XPlane has: field number → wire type
PACKET_FIELDS = {
    8: w.VARINT,  # timestamp
    10: w.VARINT,  # trusted_packet_sequence_id
    11: w.LEN,  # track_event
    12: w.LEN,  # interned_data
    13: w.VARINT,  # sequence_flags
    33: w.LEN,  # trace_config
    35: w.LEN,  # trace_stats
    36: w.LEN,  # synchronization_marker
    41: w.VARINT,  # incremental_state_cleared
    42: w.VARINT,  # previous_packet_dropped
    45: w.LEN,  # system_info
    58: w.VARINT,  # timestamp_clock_id
    59: w.LEN,  # trace_packet_defaults
    60: w.LEN,  # track_descriptor
    79: w.VARINT,  # trusted_pid
    87: w.VARINT,  # first_packet_on_sequence
}

MESSAGE = ("a Perfetto protobuf trace (.pftrace): not supported; traceroof reads Kineto JSON "
           "(torch.profiler export_chrome_trace) and XSpace (*.xplane.pb, jax/TensorFlow) traces")


def sniff(head: Head) -> int:
    """:data:`~.registry.CONTENT` when the first packet's visible fields are TracePacket
    fields (at least one that an XPlane cannot have), else 0."""
    data = head.data
    if data[:1] != b"\x0a":
        return 0
    first = w.first_message(data, head.size)
    if first is None:
        return 0
    seen = w.message_fields(data, *first)
    if not seen:
        return 0
    own = [n for n, wt, _, _ in seen if PACKET_FIELDS.get(n) == wt]
    return CONTENT if own else 0


def read(path: Path, progress: Progress | None = None) -> Trace:
    """Reject the file.

    Raises:
        TraceFormatError: always (``<path>: byte 0: a Perfetto protobuf trace ...``).
    """
    raise TraceFormatError(path, "byte 0", MESSAGE)


FORMAT = InputFormat(name="perfetto", read=read, sniff=sniff)
