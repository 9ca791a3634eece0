"""The cost registry: one decorator, one table, keyed by canonical op name (DESIGN §4).

Every formula module registers its functions here with :func:`register_cost`; nothing
else holds a list of op names (no parallel dict literal). :func:`cost_of` is the one entry
point the analysis uses.

A formula is a pure function ``(OpArgs) -> OpCost``. Its docstring states the shape
convention and the source of the formula.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import DuplicateFormulaError, UsageError
from ..schema import KINDS
from .args import OpArgs

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OpCost:
    """What one framework op costs: FLOPs, HBM bytes, kind and compute dtype.

    Attributes:
        flops: floating-point operations performed; ``None`` = unknown (never 0 for
            unknown; 0 only when the op does no arithmetic, e.g. a copy).
        bytes_read: bytes read from HBM (compulsory traffic: each operand once).
        bytes_written: bytes written to HBM (each result once).
        kind: one of :data:`traceroof.schema.KINDS`.
        dtype: compute dtype (``fp32``, ``tf32``, ``bf16``, ``fp16``, ``fp8``, ``int8``, ...).
        note: what the formula assumed (``"causal: 2080 of 4096 (q, k) pairs"``).
    """

    flops: float | None
    bytes_read: float | None
    bytes_written: float | None
    kind: str
    dtype: str | None
    note: str = ""

    @property
    def bytes(self) -> float | None:
        """``bytes_read + bytes_written``; ``None`` if either is unknown."""
        if self.bytes_read is None or self.bytes_written is None:
            return None
        return self.bytes_read + self.bytes_written


Formula = Callable[[OpArgs], "OpCost | None"]


@dataclass(frozen=True)
class _Entry:
    name: str
    fn: Formula
    kind: str | None


_EXACT: dict[str, _Entry] = {}
_PREFIX: dict[str, _Entry] = {}


def register_cost(*op_names: str, kind: str | None = None) -> Callable[[Formula], Formula]:
    """Register a cost formula for ``op_names``.

    A name ending in ``*`` registers a prefix family (``"triton_poi_*"`` matches every
    Inductor pointwise kernel). ``kind`` (one of :data:`~traceroof.schema.KINDS`) is what
    :func:`kind_of_op` answers for these names without shapes.

    Example::

        @register_cost("aten::mm", kind="matmul")
        def mm(a: OpArgs) -> OpCost: ...

    Raises:
        DuplicateFormulaError: a name is already registered (by this call or an earlier one).
        UsageError: no name given, or ``kind`` is not one of ``KINDS``.
    """
    if not op_names:
        raise UsageError("register_cost() needs at least one op name")
    if kind is not None and kind not in KINDS:
        raise UsageError(f"kind {kind!r} is not one of {list(KINDS)}")

    def decorate(fn: Formula) -> Formula:
        keys = [(_PREFIX, n[:-1]) if n.endswith("*") else (_EXACT, n) for n in op_names]
        for name, (table, key) in zip(op_names, keys):  # check all before adding any
            if key in table or op_names.count(name) > 1:
                prev = table.get(key)
                where = f"{prev.fn.__module__}.{prev.fn.__qualname__}" if prev else fn.__qualname__
                raise DuplicateFormulaError(
                    f"a cost formula for {name!r} is already registered ({where}); "
                    f"each op name has exactly one formula"
                )
        for name, (table, key) in zip(op_names, keys):
            table[key] = _Entry(name, fn, kind)
        _cost_of_text.cache_clear()  # a cached "no formula" may now have one
        return fn

    return decorate


def _lookup(op: str) -> _Entry | None:
    entry = _EXACT.get(op)
    if entry is not None:
        return entry
    # "aten::add.Tensor" (an overload name) -> "aten::add"
    ns, sep, rest = op.rpartition("::")
    if "." in rest:
        entry = _EXACT.get(f"{ns}{sep}{rest.split('.', 1)[0]}")
        if entry is not None:
            return entry
    best: _Entry | None = None
    best_len = -1
    for prefix, e in _PREFIX.items():
        if op.startswith(prefix) and len(prefix) > best_len:
            best, best_len = e, len(prefix)
    return best


_WHY: dict[str, str] = {}


def register_uncosted(*op_names: str, why: str) -> None:
    """Record why ops ``op_names`` cannot be costed from what the trace records (``why``, a
    few words: ``"no expert weights recorded"``), for ops whose schema never carries the
    numbers a formula needs. The coverage's ``uncosted_why`` says it instead of "no cost
    formula". A name may have a formula too: the reason is then given when the formula
    does not fit (``vllm::unified_attention_with_output`` records no KV lengths).

    Raises:
        UsageError: no name or an empty reason.
        DuplicateFormulaError: a name already has a reason.
    """
    if not op_names or not why:
        raise UsageError("register_uncosted() needs op names and a reason")
    for n in op_names:
        if n in _WHY:
            raise DuplicateFormulaError(f"{n!r} already has an uncosted reason ({_WHY[n]!r})")
    for n in op_names:
        _WHY[n] = why


def uncosted_reason(op: str | None) -> str | None:
    """The reason registered with :func:`register_uncosted` for ``op`` (an overload
    ``name.default`` resolves to ``name``), ``None`` if none."""
    if not op:
        return None
    op = op.strip()
    if op in _WHY:
        return _WHY[op]
    ns, sep, rest = op.rpartition("::")
    return _WHY.get(f"{ns}{sep}{rest.split('.', 1)[0]}") if "." in rest else None


def registered_uncosted() -> dict[str, str]:
    """Every op name with a registered uncosted reason -> the reason."""
    return dict(sorted(_WHY.items()))


def registered_ops() -> list[str]:
    """Every registered op name (prefix families end in ``*``), sorted."""
    return sorted(e.name for e in (*_EXACT.values(), *_PREFIX.values()))


def formula_for(op: str) -> Formula | None:
    """The formula registered for ``op`` (exact, overload-stripped, or prefix family)."""
    entry = _lookup(op.strip())
    return None if entry is None else entry.fn


def registered_kind(op: str) -> str | None:
    """The kind registered with ``op``'s formula, ``None`` when ``op`` has none."""
    entry = _lookup(op.strip())
    return None if entry is None else entry.kind


def cost_of(
    op: str,
    input_dims: list | str | None,
    input_types: list | str | None,
    concrete_inputs: list | str | None = None,
    *,
    tensorlist_dtype: str | None = None,
) -> OpCost | None:
    """FLOPs and HBM bytes of framework op ``op`` from its recorded arguments.

    Args:
        op: the framework op name as in the trace (``aten::addmm``, ``triton_poi_fused_add_0``).
        input_dims: Kineto ``Input Dims`` (list, or its JSON text).
        input_types: Kineto ``Input type`` (list, or its JSON text); without it FLOPs are
            still counted from the shapes but bytes are unknown.
        concrete_inputs: Kineto ``Concrete Inputs`` (PyTorch 2.4+), or ``None``.
        tensorlist_dtype: dtype to assume for ``Tensor[]`` elements (Kineto does not record
            them); ``None`` leaves those ops' bytes unknown.

    Returns:
        The :class:`OpCost`, or ``None`` when there is no formula for ``op`` or the recorded
        arguments do not fit it (no shapes recorded, odd shapes). Never raises on odd input;
        the reason is logged at DEBUG.
    """
    if not op:
        return None
    texts = (input_dims, input_types, concrete_inputs)
    if all(t is None or isinstance(t, str) for t in texts):
        # the host table stores these as JSON text: identical records repeat every step
        return _cost_of_text(op, input_dims, input_types, concrete_inputs, tensorlist_dtype)
    return _cost_of(op, input_dims, input_types, concrete_inputs, tensorlist_dtype)


def _cost_of(op: str, input_dims: Any, input_types: Any, concrete_inputs: Any,
             tensorlist_dtype: str | None) -> OpCost | None:
    op = op.strip()
    entry = _lookup(op)
    if entry is None:
        return None
    if input_dims is None:
        logger.debug("%s: no Input Dims recorded", op)
        return None
    args = OpArgs(op, input_dims, input_types, concrete_inputs, tensorlist_dtype)
    if not len(args):
        logger.debug("%s: empty Input Dims", op)
        return None
    try:
        cost = entry.fn(args)
    except Exception as exc:  # a formula must never take the analysis down
        logger.debug("%s: formula %s failed on dims=%r types=%r: %r", op,
                     entry.fn.__qualname__, args.dims, args.types, exc)
        return None
    if cost is None:
        logger.debug("%s: formula %s does not fit dims=%r types=%r", op,
                     entry.fn.__qualname__, args.dims, args.types)
        return None
    if any(v is not None and (v < 0 or v != v) for v in (cost.flops, cost.bytes_read,
                                                           cost.bytes_written)):
        logger.debug("%s: formula gave a negative or NaN cost %r", op, cost)
        return None
    return cost


_cost_of_text = functools.lru_cache(maxsize=1 << 16)(_cost_of)

