"""Why an op has no cost model: the reasons the coverage gives, in a few words."""

from __future__ import annotations

import re

from . import costs

#: framework-op names of a torch.compile'd region (AOTAutograd's autograd.Function and the
#: dynamo region marker): its kernels are launched without per-op events
COMPILED_REGION = re.compile(r"^(?:CompiledFunction(?:Backward)?|Torch-Compiled Region\b)")
#: the host op a graph launch is recorded inside (``CUDAGraph::replay``, the name of torch's
#: C++ replay method, as fixtures/tracegen.py models it; ``HIPGraph::replay`` alike): a
#: replayed kernel linked to it has no framework op of its own
GRAPH_REPLAY_OP = re.compile(r"(?i)^(?:CUDA|HIP)Graph::replay$")


def why(op: str | None, kind: str, has_dims: bool, tensorlist: bool, graph: bool = False,
         launched: bool = True) -> str:
    """Why an op (or kernel) label has no cost model, in a few words (the ``why`` of
    ``Coverage.uncosted_why`` and of ``coverage.uncosted_families``; docs/costs.md#coverage).

    Args:
        op: the framework op's name (None: no op linked); kind: the op's kind; has_dims:
            its arguments' shapes were recorded; tensorlist: an argument is a ``Tensor[]``;
            graph: replayed by a CUDA/HIP graph; launched: its launch is in the trace.

    A replayed kernel with no op, or linked only to the graph launch's host op
    (:data:`GRAPH_REPLAY_OP`), is said to be replayed before any op-based reason; one
    :mod:`traceroof.graph_replay` lent a framework op gets that op's reasons.
    """
    if kind in ("memcpy", "memset"):
        return "no byte count in the trace"
    if graph and (op is None or GRAPH_REPLAY_OP.search(op)):
        return "replayed by a CUDA/HIP graph, no framework op"
    if op is None and not launched:
        return "no launch in the trace, so no framework op"
    if op is None:
        return "no framework op linked"
    if kind == "collective":
        return "no message size recorded"
    if op is not None and COMPILED_REGION.search(op):
        return "a torch.compile region: the ops inside it are not recorded"
    reason = costs.uncosted_reason(op)
    if reason is not None and has_dims and not tensorlist:
        return reason
    if costs.formula_for(op) is None:
        return "no cost formula for this op"
    if not has_dims:
        return "no shapes recorded"
    if tensorlist:
        return "its Tensor[] sizes are not recorded"
    return "its recorded shapes do not fit its formula"
