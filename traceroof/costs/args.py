"""Reading a framework op's recorded arguments: shapes, dtypes and scalar values.

Kineto records, for every ``cpu_op`` (``record_shapes=True``), three parallel lists with one
entry per schema argument:

* ``Input Dims``: a tensor's shape (``[16, 1024]``; ``[]`` for a 0-dim tensor, a scalar or a
  ``None``), or for a ``Tensor[]`` argument a list of shapes (``[[1024], [1024, 4]]``);
* ``Input type``: the tensor's C++ element type (``c10::BFloat16``, ``float``, ``long int``),
  or ``Scalar``, ``ScalarList``, ``TensorList``, ``GenericList`` or ``""`` (``None``/strings);
* ``Concrete Inputs`` (PyTorch 2.4+): the value of scalar arguments as text
  (``"1"``, ``"0."``, ``"False"``, ``"[1, 1]"``), ``""`` for tensors and unrecorded values.

:class:`OpArgs` wraps the three lists so the formulas read ``a.shape(1)``, ``a.flag(8)`` or
``a.int_list(3)`` by schema position and never index raw JSON. Nothing here raises on odd
input: a missing or malformed entry reads as ``None`` (the formula then decides, and
``cost_of`` turns any failure into "unknown").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from ..dtypes import ITEMSIZE, PROMOTION_RANK, SCALAR_TYPE_CODE, TORCH_TYPE_TO_DTYPE


def dtype_of(torch_type: str | None) -> str | None:
    """Map a Kineto ``Input type`` entry to a dtype name, ``None`` if it is not a tensor type.

    ``"c10::BFloat16"`` → ``"bf16"``, ``"c10::Half"`` → ``"fp16"``, ``"float"`` → ``"fp32"``,
    ``"double"`` → ``"fp64"``, ``"c10::Float8_e4m3fn"`` → ``"fp8"``, ``"signed char"`` /
    ``"c10::qint8"`` → ``"int8"``, ``"long int"`` → ``"int64"``, ``"int"`` → ``"int32"``,
    ``"bool"`` → ``"bool"``, ``"unsigned char"`` → ``"uint8"``. ``"Scalar"``,
    ``"TensorList"``, ``""`` and unknown spellings → ``None``.
    """
    if not torch_type:
        return None
    return TORCH_TYPE_TO_DTYPE.get(torch_type.strip())


def dtype_of_scalar_type(code: Any) -> str | None:
    """Map a recorded ``ScalarType`` argument (``"15"`` or ``15``) to a dtype name."""
    try:
        return SCALAR_TYPE_CODE.get(int(code))
    except (TypeError, ValueError):
        return None


def promote(dtypes: Sequence[str | None]) -> str | None:
    """The widest of ``dtypes`` (bool < ints < floats; bf16 with fp16 gives fp32)."""
    known = [d for d in dtypes if d in PROMOTION_RANK]
    if not known:
        return None
    best = max(known, key=lambda d: PROMOTION_RANK[d])
    if best in ("bf16", "fp16") and {"bf16", "fp16"} <= set(known):
        return "fp32"
    return best


def numel(shape: Sequence[int]) -> int:
    """Number of elements of ``shape`` (1 for a 0-dim tensor)."""
    return math.prod(shape)


def nbytes(shape: Sequence[int], dtype: str | None) -> float | None:
    """Bytes of a dense tensor of ``shape`` and ``dtype``; ``None`` when the dtype is unknown."""
    if dtype is None or dtype not in ITEMSIZE:
        return None
    return float(numel(shape) * ITEMSIZE[dtype])


def broadcast(*shapes: Sequence[int]) -> tuple[int, ...]:
    """Broadcast ``shapes`` with NumPy/PyTorch rules.

    Raises:
        ValueError: the shapes do not broadcast.
    """
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(ndim):
        size = 1
        for s in shapes:
            j = len(s) - ndim + i
            if j < 0:
                continue
            d = s[j]
            if d == 1:
                continue
            if size not in (1, d):
                raise ValueError(f"shapes {list(shapes)} do not broadcast")
            size = d
        out.append(size)
    return tuple(out)


@dataclass(frozen=True)
class Tensor:
    """One recorded tensor argument: its shape and dtype (``None`` when not recorded)."""

    shape: tuple[int, ...]
    dtype: str | None

    @property
    def numel(self) -> int:
        return numel(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> float | None:
        return nbytes(self.shape, self.dtype)


_JSON = msgspec.json.Decoder()


def _decode_list(value: Any) -> list | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes)):
        try:
            value = _JSON.decode(value)
        except msgspec.DecodeError:
            return None
    return list(value) if isinstance(value, (list, tuple)) else None


def _is_shape(x: Any) -> bool:
    return isinstance(x, (list, tuple)) and all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in x
    )


def parse_scalar(text: Any) -> Any:
    """Parse one ``Concrete Inputs`` entry: ``"1"`` → 1, ``"0."`` → 0.0, ``"False"`` → False,
    ``"[1, 1]"`` → [1, 1], ``""`` / ``"None"`` → None; anything else is returned as text."""
    if text is None:
        return None
    if not isinstance(text, str):
        return text
    s = text.strip()
    if s == "" or s == "None":
        return None
    if s == "True":
        return True
    if s == "False":
        return False
    if s[0] == "[":
        inner = s[1:-1].strip()
        if not inner:
            return []
        parts = [parse_scalar(p) for p in inner.split(",")]
        return parts
    try:
        return int(s)
    except ValueError:
        pass
    try:
        return float(s)
    except ValueError:
        return s


class OpArgs:
    """A framework op's recorded arguments, read by schema position.

    Args:
        op: the op name (``aten::addmm``), for messages.
        dims: ``Input Dims`` (list or its JSON text).
        types: ``Input type`` (list or its JSON text).
        concrete: ``Concrete Inputs`` (list or its JSON text), or ``None`` in older traces.
        tensorlist_dtype: dtype to assume for ``Tensor[]`` elements, whose dtypes Kineto does
            not record; ``None`` leaves their bytes unknown.
    """

    __slots__ = ("op", "dims", "types", "concrete", "tensorlist_dtype", "notes")

    def __init__(
        self,
        op: str,
        dims: Any,
        types: Any,
        concrete: Any = None,
        tensorlist_dtype: str | None = None,
    ) -> None:
        self.op = op
        self.dims: list = _decode_list(dims) or []
        self.types: list = _decode_list(types) or []
        self.concrete: list = _decode_list(concrete) or []
        self.tensorlist_dtype = tensorlist_dtype
        self.notes: list[str] = []

    def __len__(self) -> int:
        return max(len(self.dims), len(self.types))

    @property
    def has_concrete(self) -> bool:
        """True when the trace recorded ``Concrete Inputs`` for this op."""
        return bool(self.concrete)

    def type(self, i: int) -> str:
        return str(self.types[i]) if 0 <= i < len(self.types) and self.types[i] is not None else ""

    def is_tensor(self, i: int) -> bool:
        """Argument ``i`` is a (non-``None``) tensor with a recorded shape and dtype."""
        return self.tensor(i) is not None

    def tensor(self, i: int) -> Tensor | None:
        """Argument ``i`` as a :class:`Tensor`, or ``None`` if it is not a recorded tensor."""
        if not 0 <= i < len(self.dims):
            return None
        shape = self.dims[i]
        if not _is_shape(shape):
            return None
        dtype = dtype_of(self.type(i))
        if dtype is None:
            # no "Input type" recorded at all: a non-empty shape is still a tensor (FLOPs can be
            # counted, bytes cannot); "[]" stays ambiguous (scalar, None or 0-dim tensor)
            if self.types or not shape:
                return None
        return Tensor(tuple(shape), dtype)

    def shape(self, i: int) -> tuple[int, ...] | None:
        t = self.tensor(i)
        return None if t is None else t.shape

    def dtype(self, i: int) -> str | None:
        t = self.tensor(i)
        return None if t is None else t.dtype

    def tensorlist(self, i: int) -> list[Tensor] | None:
        """Argument ``i`` as a list of tensors (a ``Tensor[]``), ``None`` if not recorded.

        Element dtypes are ``tensorlist_dtype`` (Kineto records only ``"TensorList"``).
        """
        if not 0 <= i < len(self.dims) or self.type(i) != "TensorList":
            return None
        shapes = self.dims[i]
        if not isinstance(shapes, list) or not shapes or not all(_is_shape(s) for s in shapes):
            return None
        return [Tensor(tuple(s), self.tensorlist_dtype) for s in shapes]

    def tensors(self, start: int = 0, stop: int | None = None) -> list[tuple[int, Tensor]]:
        """All recorded tensor arguments in ``[start, stop)`` with their positions."""
        stop = len(self) if stop is None else min(stop, len(self))
        out = []
        for i in range(start, stop):
            t = self.tensor(i)
            if t is not None:
                out.append((i, t))
        return out

    def value(self, i: int) -> Any:
        """The concrete value of scalar argument ``i`` (parsed), ``None`` if not recorded."""
        if not 0 <= i < len(self.concrete):
            return None
        return parse_scalar(self.concrete[i])

    def integer(self, i: int, default: int | None = None) -> int | None:
        v = self.value(i)
        if isinstance(v, bool) or v is None:
            return default
        if isinstance(v, float) and v.is_integer():
            return int(v)
        return v if isinstance(v, int) else default

    def number(self, i: int, default: float | None = None) -> float | None:
        v = self.value(i)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return default
        return float(v)

    def flag(self, i: int, default: bool | None = None) -> bool | None:
        v = self.value(i)
        if isinstance(v, bool):
            return v
        if isinstance(v, int):
            return bool(v)
        return default

    def int_list(self, i: int, default: list[int] | None = None) -> list[int] | None:
        v = self.value(i)
        if isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            return list(v)
        if isinstance(v, int) and not isinstance(v, bool):
            return [v]
        return default

    def bool_list(self, i: int, default: list[bool] | None = None) -> list[bool] | None:
        v = self.value(i)
        if isinstance(v, list) and all(isinstance(x, bool) for x in v):
            return list(v)
        return default

    def scalar_type(self, i: int) -> str | None:
        """A ``ScalarType`` argument (recorded as its enum value) as a dtype name."""
        v = self.value(i)
        if isinstance(v, int) and not isinstance(v, bool):
            return dtype_of_scalar_type(v)
        return None


def total_bytes(tensors: Sequence[Tensor | None]) -> float | None:
    """Sum of the tensors' bytes (``None`` entries skipped); ``None`` if any dtype is unknown."""
    total = 0.0
    for t in tensors:
        if t is None:
            continue
        b = t.nbytes
        if b is None:
            return None
        total += b
    return total
