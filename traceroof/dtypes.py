"""Dtypes in one place: the names traceroof uses, the spellings it accepts, bytes per element,
and which chip peak a dtype uses.

traceroof's dtype names are short and framework-neutral: ``fp64``, ``fp32``, ``tf32``,
``bf16``, ``fp16``, ``fp8``, ``fp4x2``, ``int8``, ``uint8``, ``int16`` ... ``int64``, ``uint64``,
``bool``, ``complex32/64/128`` (storage), plus ``int4`` and ``fp4`` (sub-byte weights).

The tables and where their spellings come from:

* :data:`PEAK_DTYPES`, :data:`PEAK_ALIASES`, :func:`canonical_dtype`: the peak keys of
  ``chips.toml`` and every spelling that names one (torch ``torch.bfloat16``, ``c10::Half``,
  numpy/jax ``float16``, XLA ``f8e4m3fn``, CUTLASS ``e4m3``).
* :data:`TORCH_TYPE_TO_DTYPE`: the C++ element type Kineto writes in ``Input type``
  (``c10::BFloat16``, ``float``, ``long int``: torch's ``c10::ScalarType`` C++ types, see
  c10/core/ScalarType.h ``AT_FORALL_SCALAR_TYPES_WITH_COMPLEX_AND_QINTS``).
* :data:`SCALAR_TYPE_CODE`: the ``c10::ScalarType`` enum values (c10/core/ScalarType.h), as
  Kineto records a ``ScalarType`` argument (``dtype=torch.bfloat16`` is the Scalar ``"15"``).
* :data:`XLA_DTYPES`, :data:`XLA_ITEMSIZE`: XLA ``PrimitiveType`` names as HLO text prints
  them (``f32``, ``bf16``, ``s8``, ``f8e4m3fn``; xla/xla_data.proto ``enum PrimitiveType``).
* :data:`KERNEL_TEMPLATE_DTYPES`, :data:`WIDTH_DTYPE`: element types spelled in CUDA kernel
  template arguments (``c10::BFloat16``, ``__half``, ``OpaqueType<2u>``).
* :data:`ITEMSIZE`: bytes per element of every traceroof dtype name.

Units: bytes per element (``int4``/``fp4``: 0.5, block scales not counted).
"""

from __future__ import annotations

from collections.abc import Mapping

from .errors import UsageError

__all__ = [
    "PEAK_DTYPES",
    "PEAK_ALIASES",
    "canonical_dtype",
    "dtype_name",
    "ITEMSIZE",
    "itemsize",
    "WEIGHT_DTYPES",
    "weight_bytes_per_element",
    "TORCH_TYPE_TO_DTYPE",
    "SCALAR_TYPE_CODE",
    "PROMOTION_RANK",
    "FLOATING",
    "XLA_DTYPES",
    "XLA_ITEMSIZE",
    "KERNEL_TEMPLATE_DTYPES",
    "WIDTH_DTYPE",
    "CHIP_TABLE_DTYPES",
    "LOW_PRECISION_FIRST",
    "SCALAR_TYPE_NAMES",
]

# --------------------------------------------------------------------------- peaks

#: Peak keys of ``chips.toml``, in display order. fp64/fp32 = vector (non-tensor) rates;
#: tf32 = TF32 tensor core; bf16/fp16 = tensor rate with FP32 accumulate; fp8, int8 (OP/s),
#: fp4 = tensor rates.
PEAK_DTYPES: tuple[str, ...] = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp4")

#: Peak keys low precision first: the order roofs are drawn and listed in (highest roof first).
LOW_PRECISION_FIRST: tuple[str, ...] = ("fp8", "int8", "bf16", "fp16", "tf32", "fp32", "fp64")

#: The peak columns ``traceroof chips`` shows (int8 and fp64 left out for width).
CHIP_TABLE_DTYPES: tuple[str, ...] = tuple(d for d in LOW_PRECISION_FIRST if d not in ("int8", "fp64"))

_PEAK_SPELLINGS: dict[str, tuple[str, ...]] = {
    "fp64": ("fp64", "float64", "f64", "double", "doubletensor"),
    "fp32": ("fp32", "float32", "f32", "float", "single", "floattensor"),
    "tf32": ("tf32", "tensorfloat32", "tensorfloat-32"),
    "bf16": ("bf16", "bfloat16", "bfloat"),
    "fp16": ("fp16", "float16", "f16", "half", "halftensor"),
    "fp8": (
        "fp8", "float8", "f8", "e4m3", "e5m2", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
        "float8_e5m2fnuz", "f8e4m3fn", "f8e5m2", "f8e4m3fnuz", "f8e5m2fnuz", "f8e4m3", "f8e4m3b11fnuz",
        "fp8_e4m3", "fp8_e5m2",
    ),
    "int8": ("int8", "i8", "s8", "uint8", "u8", "signed char", "unsigned char", "char", "qint8", "quint8"),
    "fp4": ("fp4", "float4", "nvfp4", "mxfp4", "f4e2m1fn", "float4_e2m1fn_x2", "e2m1"),
}

#: Every accepted spelling (lower case, framework prefix stripped) -> the peak key it uses.
#: uint8 and the quantized types use the int8 tensor path.
PEAK_ALIASES: Mapping[str, str] = {n: canon for canon, names in _PEAK_SPELLINGS.items() for n in names}

_PREFIXES = ("torch.", "c10::", "jnp.", "np.", "numpy.", "jax.numpy.")


def _plain(name: str) -> str:
    s = str(name).strip().lower()
    for prefix in _PREFIXES:
        if s.startswith(prefix):
            s = s[len(prefix):]
    return s


def canonical_dtype(name: str) -> str | None:
    """The peak key (:data:`PEAK_DTYPES`) a dtype spelling uses, ``None`` if unknown.

    ``"torch.bfloat16"``, ``"c10::BFloat16"`` -> ``"bf16"``; ``"half"`` -> ``"fp16"``; XLA
    ``"f8e4m3fn"`` -> ``"fp8"``; ``"uint8"`` -> ``"int8"`` (the int8 tensor path).
    """
    return PEAK_ALIASES.get(_plain(name))


def dtype_name(name: str) -> str:
    """A dtype spelling as a traceroof name: the peak key when it names one
    (``"bfloat16"`` -> ``"bf16"``), else the spelling lower-cased (``"int4"``)."""
    s = _plain(name)
    return PEAK_ALIASES.get(s, s)


# --------------------------------------------------------------------------- bytes

#: Bytes per element of each traceroof dtype name. ``fp4x2`` packs two fp4 values in one
#: element (torch ``Float4_e2m1fn_x2``); ``int4``/``fp4`` are half a byte (weights).
ITEMSIZE: Mapping[str, float] = {
    "fp64": 8, "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "fp4x2": 1,
    "int8": 1, "uint8": 1, "bool": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4,
    "int64": 8, "uint64": 8, "complex32": 4, "complex64": 8, "complex128": 16,
    "int4": 0.5, "fp4": 0.5,
}

#: Weight / KV-cache dtypes ``traceroof estimate`` accepts (model.py), in this order.
WEIGHT_DTYPES: tuple[str, ...] = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8", "int4", "fp4")


def itemsize(dtype: str) -> float:
    """Bytes per element of a traceroof dtype name (``"bf16"`` -> 2).

    Raises:
        UsageError: ``dtype`` is not a known dtype name; the message lists the known ones.
    """
    try:
        return ITEMSIZE[dtype]
    except KeyError:
        raise UsageError(
            f"unknown dtype {dtype!r}; known dtypes: {', '.join(sorted(ITEMSIZE))}"
        ) from None


def weight_bytes_per_element(dtype: str) -> float:
    """Bytes per weight of a :data:`WEIGHT_DTYPES` dtype, any spelling (``bfloat16`` -> 2.0).

    Raises:
        UsageError: not one of :data:`WEIGHT_DTYPES` (the message lists them).
    """
    d = dtype_name(dtype)
    if d not in WEIGHT_DTYPES:
        raise UsageError(f"unknown dtype {dtype!r}; expected one of {', '.join(WEIGHT_DTYPES)}")
    return float(ITEMSIZE[d])


# --------------------------------------------------------------------------- torch

#: Kineto ``Input type`` spelling (the C++ element type) -> traceroof dtype name.
TORCH_TYPE_TO_DTYPE: Mapping[str, str] = {
    "c10::BFloat16": "bf16",
    "c10::Half": "fp16",
    "float": "fp32",
    "double": "fp64",
    "c10::Float8_e4m3fn": "fp8",
    "c10::Float8_e5m2": "fp8",
    "c10::Float8_e4m3fnuz": "fp8",
    "c10::Float8_e5m2fnuz": "fp8",
    "c10::Float8_e8m0fnu": "fp8",
    "c10::Float4_e2m1fn_x2": "fp4x2",
    "signed char": "int8",
    "c10::qint8": "int8",
    "unsigned char": "uint8",
    "c10::quint8": "uint8",
    "short int": "int16",
    "short": "int16",
    "int": "int32",
    "c10::qint32": "int32",
    "long int": "int64",
    "long": "int64",
    "long long": "int64",
    "unsigned short": "uint16",
    "short unsigned int": "uint16",
    "unsigned int": "uint32",
    "unsigned long": "uint64",
    "long unsigned int": "uint64",
    "bool": "bool",
    "c10::complex<c10::Half>": "complex32",
    "c10::complex<float>": "complex64",
    "c10::complex<double>": "complex128",
}

#: ``c10::ScalarType`` enum value -> traceroof dtype name (c10/core/ScalarType.h order:
#: Byte, Char, Short, Int, Long, Half, Float, Double, ComplexHalf, ComplexFloat,
#: ComplexDouble, Bool, QInt8, QUInt8, QInt32, BFloat16, ..., Float8_*, UInt16..64).
SCALAR_TYPE_CODE: Mapping[int, str] = {
    0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "fp16", 6: "fp32",
    7: "fp64", 8: "complex32", 9: "complex64", 10: "complex128", 11: "bool", 12: "int8",
    13: "uint8", 14: "int32", 15: "bf16", 23: "fp8", 24: "fp8", 25: "fp8", 26: "fp8",
    27: "uint16", 28: "uint32", 29: "uint64", 44: "fp8", 45: "fp4x2",
}

#: ``c10::ScalarType`` names as ``toString`` spells them (what ``record_param_comms`` writes in its
#: ``dtype`` argument), plus the ``Int8``/``UInt8`` spellings seen in traces -> traceroof dtype.
SCALAR_TYPE_NAMES: Mapping[str, str] = {
    "Float": "fp32", "float": "fp32", "Double": "fp64", "Half": "fp16", "BFloat16": "bf16",
    "Int": "int32", "Long": "int64", "Char": "int8", "Byte": "uint8", "Bool": "bool",
    "Short": "int16", "Float8_e4m3fn": "fp8", "Float8_e5m2": "fp8", "Int8": "int8", "UInt8": "uint8",
}

#: Promotion order used to pick an elementwise result dtype (a simplification of torch's type
#: promotion, c10/core/ScalarType.cpp ``promoteTypes``: bool < integer < floating, wider wins).
PROMOTION_RANK: Mapping[str, int] = {
    "bool": 0, "uint8": 1, "int8": 1, "int16": 2, "uint16": 2, "int32": 3, "uint32": 3,
    "int64": 4, "uint64": 4, "fp4x2": 5, "fp8": 6, "fp16": 7, "bf16": 7, "fp32": 8,
    "tf32": 8, "fp64": 9, "complex32": 10, "complex64": 11, "complex128": 12,
}

#: Floating-point (and complex) traceroof dtype names.
FLOATING: frozenset[str] = frozenset(
    {"fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "fp4x2", "complex32", "complex64", "complex128"}
)

# --------------------------------------------------------------------------- XLA

#: XLA ``PrimitiveType`` name (HLO text) -> traceroof dtype name. fp8/fp4/fp6 names are
#: handled by prefix (:func:`traceroof.costs.hlo_text.xla_dtype`).
XLA_DTYPES: Mapping[str, str] = {
    "f32": "fp32", "bf16": "bf16", "f16": "fp16", "f64": "fp64", "s8": "int8", "u8": "uint8",
    "s16": "int16", "u16": "uint16", "s32": "int32", "u32": "uint32", "s64": "int64",
    "u64": "uint64", "pred": "bool", "s4": "int4", "u4": "uint4", "c64": "complex64",
    "c128": "complex128",
}

#: Bytes per element of XLA ``PrimitiveType`` names (``s4``/``u4`` pack two per byte,
#: ``s2``/``u2`` four; ``token`` has no data).
XLA_ITEMSIZE: Mapping[str, float] = {
    "pred": 1, "s2": 0.25, "u2": 0.25, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2,
    "u16": 2, "s32": 4, "u32": 4, "s64": 8, "u64": 8, "f16": 2, "bf16": 2, "f32": 4, "f64": 8,
    "c64": 8, "c128": 16, "f8e5m2": 1, "f8e4m3": 1, "f8e4m3fn": 1, "f8e4m3b11fnuz": 1,
    "f8e5m2fnuz": 1, "f8e4m3fnuz": 1, "f8e3m4": 1, "f8e8m0fnu": 1, "f4e2m1fn": 0.5,
    "token": 0,
}

# --------------------------------------------------------------------------- kernel names

#: Element-type spellings in CUDA kernel template arguments -> dtype, tested in order
#: (``c10::BFloat16`` before the bare ``<float``).
KERNEL_TEMPLATE_DTYPES: tuple[tuple[str, str], ...] = (
    ("c10::BFloat16", "bf16"), ("c10::Half", "fp16"), ("__nv_bfloat16", "bf16"), ("__half", "fp16"),
    ("<float", "fp32"), ("<double", "fp64"), ("<long", "int64"), ("<int", "int32"),
)

#: A bare element width (``OpaqueType<2u>``: ATen's type-erased copies) -> a representative
#: dtype of that width (only the width matters for bytes).
WIDTH_DTYPE: Mapping[int, str] = {1: "uint8", 2: "fp16", 4: "fp32", 8: "fp64"}
