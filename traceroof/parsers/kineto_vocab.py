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
"""

from __future__ import annotations

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
    "user_annotation": "annotation",
    "gpu_user_annotation": "gpu_annotation",
    "cuda_sync": "sync",
}

#: categories that are counted but not kept (they can be millions of rows, BC-02).
COUNTED_ONLY: frozenset[str] = frozenset(
    {"python_function", "Trace", "overhead", "cpu_instant_event", "fwdbwd", "ac2g",
     "async", "async_gpu", "async_cpu_to_gpu", "gpu_mem_ops", "Memory"}
)

#: CUPTI profiler (range/counter) mode: device work appears as replayed counter ranges, not
#: timed kernels; their durations are not execution times.
PROFILER_RANGE_CATEGORIES: frozenset[str] = frozenset({"cuda_profiler_range"})

#: Runtime calls that launch one CUDA/HIP graph (BC-13): one correlation, many kernels.
GRAPH_LAUNCH_SUBSTRINGS: tuple[str, ...] = ("GraphLaunch",)

#: Collective argument names carried by NCCL kernels and ``record_param_comms`` (PyTorch ≥2.1).
ARG_COLL_NAME = "Collective name"
ARG_IN_NELEMS = "In msg nelems"
ARG_OUT_NELEMS = "Out msg nelems"
ARG_GROUP_SIZE = "Group size"
ARG_DTYPE = "dtype"

#: ``record_param_comms`` dtype spelling → bytes per element.
COLL_DTYPE_BYTES: dict[str, int] = {
    "Float": 4, "float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Int": 4, "Long": 8,
    "Char": 1, "Byte": 1, "Bool": 1, "Short": 2, "Float8_e4m3fn": 1, "Float8_e5m2": 1,
    "Int8": 1, "UInt8": 1,
}
