"""The Kineto vocabulary: raw category and argument names → what they mean to traceroof.

Declarative and in one place, so a new PyTorch/ROCm spelling is one new entry (in the spirit
of HTA's versioned ``event_args`` mapping). Eras seen in real traces
(``../shared/fixtures/real/MANIFEST.md``, "Format quirks"):

* PyTorch 1.8/1.9: ``Operator``/``Runtime``/``Kernel``/``Memcpy``/``Memset``, flow cat ``async``,
  kernel args ``external id`` (lower case), GPU tids written as ``"stream 7"``.
* ~1.10-1.12: ``Kernel``/``Runtime`` with flows ``async_gpu``/``async_cpu_to_gpu``.
* later: ``kernel``, ``gpu_memcpy``, ``gpu_memset``, ``cuda_runtime``, ``cuda_driver``,
  ``cpu_op``, ``user_annotation``, ``gpu_user_annotation``, ``python_function``, flows ``ac2g``.
* ROCm reuses the CUDA names (``cuda_runtime``, ``kernel``) and adds ``hip_*`` header keys.
* MTIA: ``mtia_runtime`` (host) and ``mtia_ccp_events`` (device).
* Intel XPU (Kineto's XPUPTI plugin, ``libkineto/src/plugin/xpupti``, PyTorch 2.4+): SYCL /
  Unified Runtime calls ``xpu_runtime`` (``urEnqueueKernelLaunch``, ``urEnqueueUSMMemcpy``,
  older ``piEnqueueKernelLaunch``) with ``correlation`` and ``External id``, exactly as
  ``cuda_runtime``; the Level Zero calls they make ``xpu_driver``
  (``zeCommandListAppendLaunchKernel``, same correlation, nested inside the runtime call);
  kernels ``kernel`` (``gpu_memcpy``/``gpu_memset`` for copies) on ``pid`` = the XPU device
  index, ``tid`` = the SYCL queue (thread name ``Stream N``), args ``correlation``,
  ``External id``, ``device``, ``sycl queue``, ``l0 queue``, and no ``stream`` (the queue id
  in the ``tid`` stands for it).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..dtypes import ITEMSIZE, SCALAR_TYPE_NAMES

#: category → device-op kind (rows of the op table).
DEVICE_CATEGORIES: dict[str, str] = {
    "kernel": "kernel",
    "Kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "Memcpy": "memcpy",
    "gpu_memset": "memset",
    "Memset": "memset",
    "mtia_ccp_events": "kernel",
}

#: category → normalised host category (rows of the host table).
HOST_CATEGORIES: dict[str, str] = {
    "cpu_op": "cpu_op",
    "Operator": "cpu_op",
    "operator": "cpu_op",
    "cuda_runtime": "runtime",
    "Runtime": "runtime",
    "cuda_driver": "runtime",
    "hip_runtime": "runtime",
    "mtia_runtime": "runtime",
    "privateuse1_runtime": "runtime",
    "xpu_runtime": "runtime",
    "user_annotation": "annotation",
    "gpu_user_annotation": "gpu_annotation",
    "cuda_sync": "sync",
}

#: categories that are counted but not kept (they can be millions of rows, BC-02).
#: ``xpu_driver``: the Level Zero calls inside each ``xpu_runtime`` call, with its
#: correlation: kept, they would count every launch twice (the runtime call is the launch).
COUNTED_ONLY: frozenset[str] = frozenset(
    {"python_function", "Trace", "overhead", "cpu_instant_event", "fwdbwd", "ac2g",
     "async", "async_gpu", "async_cpu_to_gpu", "gpu_mem_ops", "Memory", "xpu_driver"}
)

#: runtime category → the device family whose launches it records: a trace whose
#: ``deviceProperties`` name no device is still known to have run on that family (the chip
#: is then asked for, never guessed: ``device_family``).
DEVICE_FAMILY_BY_RUNTIME: dict[str, str] = {
    "xpu_runtime": "Intel XPU",
    "hip_runtime": "AMD GPU (HIP)",
    "mtia_runtime": "Meta MTIA",
}


def device_family(stats: dict[str, int]) -> str | None:
    """The device family a trace's runtime calls name (:data:`DEVICE_FAMILY_BY_RUNTIME`),
    from the reader's per-category event counts (``stats["events[<cat>]"]``); None when they
    name none (``cuda_runtime`` is shared by CUDA and ROCm, so it names no family)."""
    for cat, family in DEVICE_FAMILY_BY_RUNTIME.items():
        if stats.get(f"events[{cat}]", 0) > 0:
            return family
    return None

#: CUPTI profiler (range/counter) mode: device work appears as replayed counter ranges, not
#: timed kernels; their durations are not execution times.
PROFILER_RANGE_CATEGORIES: frozenset[str] = frozenset({"cuda_profiler_range"})

#: Runtime calls that launch one CUDA/HIP graph (BC-13): one correlation, many kernels.
GRAPH_LAUNCH_SUBSTRINGS: tuple[str, ...] = ("GraphLaunch",)

# --------------------------------------------------------------------------- event args
#
# The ``args`` keys traceroof reads, and which column of the parse frames each one feeds, in
# the style of HTA's versioned ``event_args`` mapping (``hta/configs/event_args_formats``: a
# key such as ``cpu_op::input_dims`` → the raw name, the value type, the first version that
# writes it). Here one argument lists every spelling PyTorch has used for it, with the era
# that writes each; the first spelling present on an event wins. The decoder's ``Args``
# struct (:mod:`.kineto_events`) and the column builder (:mod:`.kineto_columns`) are built
# from these tables, so a new spelling is one new :class:`Spelling` here.

#: how a value is decoded: a number (``int | float | str | null``; ids and sizes, converted
#: by the column), the raw JSON text kept verbatim (shapes, types), or any JSON value.
#: The declared type is checked by the decoder: an event whose ``args`` hold a value of
#: another type (an object for a number) is not valid and goes through the recovery path.
NUMBER, JSON_TEXT, ANY = "number", "json", "any"


@dataclass(frozen=True)
class Spelling:
    """One raw name of an argument: ``raw`` exactly as under ``args``, ``era`` who writes it."""

    raw: str
    era: str


@dataclass(frozen=True)
class Arg:
    """An argument traceroof reads from an event's ``args``.

    ``key`` is ``<group>::<name>`` (HTA's naming); ``field`` the attribute of the decoded
    struct that holds the first spelling (the others get ``field__1``, ``field__2``, ...);
    ``value`` one of :data:`NUMBER`, :data:`JSON_TEXT`, :data:`ANY`; ``spellings`` in order of
    precedence (the first present on an event is read).
    """

    key: str
    field: str
    value: str
    spellings: tuple[Spelling, ...]

    def fields(self) -> tuple[str, ...]:
        """The decoded struct's attribute per spelling, in precedence order."""
        return (self.field,) + tuple(f"{self.field}__{i}" for i in range(1, len(self.spellings)))


_ALL = "PyTorch 1.8+ (CUDA and ROCm)"

#: Every argument decoded, in the decoder's field order. ``info::*`` and ``memory::bytes`` feed
#: no column: the ``M`` events' names are read from ``info::name``; ``info::labels`` and
#: ``memory::bytes`` are decoded for their type check only (see :data:`NUMBER`).
ARGS: tuple[Arg, ...] = (
    Arg("correlation::cpu_gpu", "correlation", NUMBER, (Spelling("correlation", _ALL),)),
    Arg("index::external_id", "external_id", NUMBER, (
        Spelling("External id", "PyTorch 1.9+"),
        Spelling("external id", "PyTorch 1.8 kernel/runtime events (lower case)"),
    )),
    Arg("cuda::device", "device", NUMBER, (Spelling("device", _ALL),)),
    Arg("cuda::stream", "stream", NUMBER, (Spelling("stream", _ALL),)),
    Arg("cpu_op::input_dims", "input_dims", JSON_TEXT, (
        Spelling("Input Dims", "PyTorch 1.9+ (record_shapes)"),
        Spelling("Input dims", "PyTorch 1.8 (lower case)"),
    )),
    Arg("cpu_op::input_type", "input_type", JSON_TEXT, (
        Spelling("Input type", "PyTorch 1.8+ (record_shapes)"),
    )),
    Arg("cpu_op::concrete_inputs", "concrete", JSON_TEXT, (
        Spelling("Concrete Inputs", "PyTorch 2.0+ (record_shapes)"),
    )),
    Arg("data::bytes", "nbytes", NUMBER, (Spelling("bytes", "memcpy/memset events, PyTorch 1.8+"),)),
    Arg("nccl::collective_name", "coll_name", NUMBER, (
        Spelling("Collective name", "NCCL kernels and record_param_comms, PyTorch 2.1+"),
    )),
    Arg("nccl::in_msg_nelems", "in_nelems", NUMBER, (Spelling("In msg nelems", "PyTorch 2.1+"),)),
    Arg("nccl::out_msg_nelems", "out_nelems", NUMBER, (Spelling("Out msg nelems", "PyTorch 2.1+"),)),
    Arg("nccl::group_size", "group_size", NUMBER, (Spelling("Group size", "PyTorch 2.1+"),)),
    Arg("nccl::dtype", "dtype", NUMBER, (Spelling("dtype", "PyTorch 2.1+ (see COLL_DTYPE_BYTES)"),)),
    Arg("info::name", "name", ANY, (Spelling("name", "M events process_name / thread_name"),)),
    Arg("info::labels", "labels", ANY, (Spelling("labels", "M events process_labels"),)),
    Arg("memory::bytes", "mem_bytes", NUMBER, (Spelling("Bytes", "[memory] instant events"),)),
)

#: ``Arg.key`` → :class:`Arg`.
ARG_BY_KEY: dict[str, Arg] = {a.key: a for a in ARGS}

#: column conversions (:mod:`.kineto_columns`): integers (a number given as a float or a
#: string is converted value by value), text of a number or string, raw JSON text
#: (pretty-printing dropped; ``null`` and absent → null).
INT64, INT32, STRING, TEXT = "Int64", "Int32", "String", "Text"


@dataclass(frozen=True)
class ArgColumn:
    """A column of a parse frame filled from an argument: ``column`` ← ``arg`` (an
    :attr:`Arg.key`), converted as ``dtype`` (:data:`INT64`, :data:`INT32`, :data:`STRING`,
    :data:`TEXT`)."""

    column: str
    arg: str
    dtype: str


#: the link ids, in both frames: kernel ↔ runtime call, runtime call ↔ framework op
_LINK_COLUMNS = (
    ArgColumn("correlation", "correlation::cpu_gpu", INT64),
    ArgColumn("external_id", "index::external_id", INT64),
)


def _collective_columns(group_size: str) -> tuple[ArgColumn, ...]:
    """The collective columns (NCCL kernels, ``record_param_comms``): the same in both
    frames but for the ``coll_group_size`` dtype."""
    return (
        ArgColumn("coll_name", "nccl::collective_name", STRING),
        ArgColumn("coll_in_nelems", "nccl::in_msg_nelems", INT64),
        ArgColumn("coll_out_nelems", "nccl::out_msg_nelems", INT64),
        ArgColumn("coll_group_size", "nccl::group_size", group_size),
        ArgColumn("coll_dtype", "nccl::dtype", STRING),
    )


#: the argument columns of the device-op frame (kernels, memcpy, memset), in frame order
#: (after ``name``, ``cat``, ``pid``, ``tid``, ``ts_ns``, ``dur_ns``)
DEVICE_ARG_COLUMNS: tuple[ArgColumn, ...] = (
    ArgColumn("device_arg", "cuda::device", INT64),
    ArgColumn("stream_arg", "cuda::stream", INT64),
    *_LINK_COLUMNS,
    ArgColumn("nbytes", "data::bytes", INT64),
    *_collective_columns(INT64),
)

#: the argument columns of the host frame (cpu ops, runtime calls, annotations), in frame
#: order (after ``name``, ``cat``, ``pid``, ``thread``, ``ts_ns``, ``dur_ns``)
HOST_ARG_COLUMNS: tuple[ArgColumn, ...] = (
    *_LINK_COLUMNS,
    ArgColumn("input_dims", "cpu_op::input_dims", TEXT),
    ArgColumn("input_types", "cpu_op::input_type", TEXT),
    ArgColumn("concrete_inputs", "cpu_op::concrete_inputs", TEXT),
    *_collective_columns(INT32),
)

#: ``record_param_comms`` dtype spelling → bytes per element (the spellings and their dtypes
#: are :data:`traceroof.dtypes.SCALAR_TYPE_NAMES`, the sizes :data:`traceroof.dtypes.ITEMSIZE`).
COLL_DTYPE_BYTES: dict[str, int] = {n: int(ITEMSIZE[d]) for n, d in SCALAR_TYPE_NAMES.items()}
