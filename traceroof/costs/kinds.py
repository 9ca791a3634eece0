"""Op kind from a name alone: the ``name`` level of DESIGN §4 (a kind, no numbers).

Every name -> kind rule of traceroof lives here: CUDA/HIP kernel names
(:func:`kind_of_kernel`), framework op names (:func:`kind_of_op`), and XLA's HLO opcodes,
xprof categories, custom-call targets and left-over XLA kernel names (:func:`kind_of_hlo`).

Kernel names: two ordered rule tables, first match wins. Order matters: a FlashAttention kernel name
contains ``cutlass`` (so attention is tested before matmul), an implicit-GEMM convolution
contains ``gemm`` (conv before matmul), and vLLM's norm kernel names contain
``_typeConvert`` (``conv`` must not match ``convert``).
"""

from __future__ import annotations

import re

from .registry import registered_kind

_COLLECTIVE = (
    r"nccl|rccl|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|sendrecv"
    r"|multimem|c10d::|record_param_comms"
    # DeepEP's expert-parallel all-to-all: deep_ep::intranode::dispatch / notify_dispatch /
    # cached_notify_combine / combine, internode(_ll)::... kernels and deep_ep::dispatch ops
    r"|deep_?ep::(\w+::)*\w*(dispatch|combine)"
)

#: (pattern, kind) tested on the whole kernel name, first.
_FULL_NAME_RULES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p, re.IGNORECASE), k)
    for p, k in (
        (_COLLECTIVE, "collective"),
        (r"^\s*memcpy", "memcpy"),
        (r"^\s*memset", "memset"),
    )
)

#: Lowercase words one of which every match of ``_COLLECTIVE`` contains (``all_?reduce`` holds
#: ``all``, ``reduce_?scatter`` ``reduce``, the DeepEP rule ``deep``): on an ASCII name without
#: any of them the pattern cannot match (case-insensitive on ASCII text is ``str.lower``), so
#: it is not run. A search for it over a templated kernel name (hundreds of characters) cost
#: ~23 µs, the words ~1 µs (:func:`_may_match`).
_COLLECTIVE_WORDS = ("nccl", "rccl", "all", "reduce", "sendrecv", "multimem", "c10d::", "record_param_comms",
                     "deep")


def _may_match(low: str | None, words: tuple[str, ...]) -> bool:
    """Whether a pattern whose every match holds one of ``words`` (lowercase) may match a name
    whose lowercase is ``low`` (None: a name not all ASCII, where case folding is more than
    ``str.lower``: always tested)."""
    return low is None or any(w in low for w in words)


#: (pattern, kind) tested on the kernel's function name plus its first template argument
#: (see :func:`kernel_key`), so that types in the signature (``cutlass::bfloat16_t``,
#: ``cublasGemvParams``, ``fbgemm_gpu::...`` lambdas) do not decide; first match wins.
_KERNEL_RULES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p, re.IGNORECASE), k)
    for p, k in (
        # Inductor kernels: pointwise / reduction / persistent reduction (BC-26)
        (r"^triton_poi_", "elementwise"),
        (r"^triton_(red|per)_", "reduction"),
        (r"^triton_tem_.*(mm|addmm|bmm)", "matmul"),
        (r"^triton_tem_.*conv", "conv"),
        # layout transforms, MIOpen tensor ops, KV-cache writes
        (r"SubTensorOp|batched_transpose|nchwToNhwc|nhwcToNchw|transpose_kernel|"
         r"reshape_and_cache|kv_indices|store_kvcache", "elementwise"),
        (r"flash|fmha|attention|attn_fwd|attn_bwd|\bmha_|sdpa|paged_attention|_attn_", "attention"),
        (r"norm(?!al)|\bbn_(fw|bw)|GammaBeta|RowwiseMoments|ComputeFusedParams|"
         r"ComputeInternalGradients|BackwardFusedParams", "norm"),
        (r"conv(?!ert)|winograd|scudnn|fprop|dgrad|wgrad|igemm_(fwd|bwd|wrw)|im2col|"
         r"implicit_gemm|ImplicitGemm|fft2d_|cudnn", "conv"),
        (r"(?<!fb)gemm|gemv|cutlass|cublas|nvjet|xmma|wgmma|^Cijk_|matmul|^bmm_|splitKreduce|fused_moe_kernel|"
         r"tensorop|hipblaslt|rocblas", "matmul"),
        (r"softmax", "reduction"),
        (r"reduce|reduction|argmax|argmin|DeviceScan|cumsum|scan_|_sum_|topk|pool", "reduction"),
        (r"elementwise|vectorized|unrolled|copy|fill|CatArray|cat_|index|gather|scatter|"
         r"dropout|distribution|embedding|Functor|rotary|quant|act_and_mul|where|"
         r"multi_tensor_apply", "elementwise"),
    )
)


def kernel_key(kernel_name: str) -> str:
    """The kernel's function name and its first template argument, signature dropped.

    ``"void at::native::reduce_kernel<512, 1, at::native::ReduceOp<...NormTwoOps...>>(...)"``
    → ``"at::native::reduce_kernel 512"``; ``"void cutlass::Kernel2<cutlass_80_..._gemm_...>
    (...)"`` → ``"cutlass::Kernel2 cutlass_80_..._gemm_..."``.
    """
    s = kernel_name.replace("(anonymous namespace)", "anon")
    depth = 0
    base: list[str] = []
    first: list[str] = []
    state = 0  # 0: before the first template, 1: in its first argument, 2: done
    parens = 0  # parentheses inside a template: "<(((8)>(0)))&&...>" compares, not brackets
    for ch in s:
        if depth and ch in "()":
            parens = max(0, parens + (1 if ch == "(" else -1))
        elif parens and ch in "<>":
            pass
        elif ch == "<":
            depth += 1
            if depth == 1 and state == 0:
                state = 1
            continue
        elif ch == ">":
            depth = max(0, depth - 1)
            if depth == 0 and state == 1:
                state = 2
            continue
        if depth == 0:
            if ch == "(" and state == 2:
                # the signature: what follows is cut off below (``split("(")``) and the first
                # template argument is complete, so the rest cannot change the key
                break
            base.append(ch)
        elif depth == 1 and state == 1:
            if ch == ",":
                state = 2
            else:
                first.append(ch)
    head = "".join(base).split("(", 1)[0].split()
    name = head[-1] if head else kernel_name
    return f"{name} {''.join(first).strip()}".strip()


#: (pattern, kind) for framework op names that have no registered formula.
_OP_RULES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p, re.IGNORECASE), k)
    for p, k in (
        (_COLLECTIVE, "collective"),
        (r"^triton_poi_", "elementwise"),
        (r"^triton_(red|per)_", "reduction"),
        (r"^triton_tem_.*(mm|bmm)", "matmul"),
        (r"memcpy", "memcpy"),
        (r"memset", "memset"),
        (r"scaled_dot_product|flash_attention|efficient_attention|flex_attention|attention|"
         r"attn|fmha|\bmha\b", "attention"),
        (r"conv(?!ert)", "conv"),
        (r"norm(?!al)", "norm"),
        (r"::(mm|bmm|addmm|baddbmm|addbmm|matmul|linear|_scaled_mm|_int_mm|mv|dot)\b|(?<!fb)gemm|"
         r"matmul|linear", "matmul"),
        (r"softmax|::(sum|mean|amax|amin|max|min|argmax|argmin|prod|norm|var|std|all|any|"
         r"logsumexp)\b|cumsum|reduce|pool", "reduction"),
        (r"::(copy_|_to_copy|to|clone|contiguous|fill_|zero_|cat|index|gather|scatter|"
         r"embedding)\b|::_foreach_|::_fused_(adam|sgd)|quant|rotary", "elementwise"),
    )
)


#: Kernels that only move or fill data inside a compute op: cuDNN layout transposes
#: (``nchwToNhwcKernel``, ``nhwcToNchwKernel``), MIOpen ``batched_transpose_*`` and
#: ``SubTensorOp*`` (set/cast a tensor), memsets, fills, copies and casts.
_DATA_MOVEMENT = re.compile(
    r"transpose|nchwtonhwc|nhwctonchw|subtensorop|memset|fill|copy|cast(?!le)|convert", re.I)
#: the words one of which every match of :data:`_DATA_MOVEMENT` holds (see :func:`_may_match`)
_DATA_MOVEMENT_WORDS = ("transpose", "nchwtonhwc", "nhwctonchw", "subtensorop", "memset", "fill", "copy", "cast",
                        "convert")


def is_data_movement_kernel(kernel_name: str) -> bool:
    """Whether a kernel only moves, lays out or fills data (no arithmetic of its op):
    :data:`_DATA_MOVEMENT` on the name. Such a kernel of a convolution or GEMM gets bytes of
    its op's cost but none of its FLOPs (:func:`traceroof.costing.split_shares`)."""
    low = kernel_name.lower() if kernel_name.isascii() else None
    return _may_match(low, _DATA_MOVEMENT_WORDS) and bool(_DATA_MOVEMENT.search(kernel_name))


def kind_of_kernel(kernel_name: str) -> str:
    """Kind of a device kernel from its name alone (a heuristic; ``"other"`` when unsure).

    cutlass/cublas/gemm/nvjet/xmma/wgmma/``Cijk_`` (rocBLAS/hipBLASLt) → ``matmul``;
    flash/fmha/attention → ``attention``; conv/implicit-GEMM conv/winograd/MIOpen ``igemm``
    → ``conv``; NCCL/RCCL (any case, incl. ``ncclDevKernel_*``) → ``collective``;
    elementwise/vectorized/unrolled/copy/fill → ``elementwise``; reduce/softmax/pool →
    ``reduction``; norm → ``norm``; ``Memcpy``/``Memset`` → ``memcpy``/``memset``;
    ``triton_poi_`` → ``elementwise``, ``triton_red_``/``triton_per_`` → ``reduction``.
    """
    name = kernel_name or ""
    low = name.lower() if name.isascii() else None
    for i, (pattern, kind) in enumerate(_FULL_NAME_RULES):
        # the first rule (collectives) is the slow one: run where it may match
        if (i or _may_match(low, _COLLECTIVE_WORDS)) and pattern.search(name):
            return kind
    key = kernel_key(name)
    for pattern, kind in _KERNEL_RULES:
        if pattern.search(key):
            return kind
    return "other"


def kind_of_op(op: str) -> str | None:
    """Kind of a framework op from its name alone; ``None`` when nothing matches.

    The kind registered with the op's cost formula wins; otherwise name rules
    (``*scaled_dot_product*``, ``*flash_attention*`` → ``attention``; ``*conv*`` → ``conv``;
    ``*norm*`` → ``norm``; collectives; copies/fills/indexing/foreach → ``elementwise``).
    """
    if not op:
        return None
    kind = registered_kind(op)
    if kind is not None:
        return kind
    for pattern, k in _OP_RULES:
        if pattern.search(op):
            return k
    return None


# --------------------------------------------------------------------------- XLA / HLO
# HLO opcodes as printed in HLO text (xla/hlo/ir/hlo_opcode.h), xprof ``hlo_category`` names,
# and custom-call targets.

COLLECTIVE_OPCODES = frozenset({
    "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "ragged-all-to-all",
    "collective-permute", "collective-broadcast", "send", "recv",
})
ELEMENTWISE_OPCODES = frozenset({
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "exponential", "log",
    "tanh", "rsqrt", "sqrt", "cbrt", "negate", "abs", "compare", "select", "convert", "power",
    "logistic", "and", "or", "not", "xor", "clamp", "sine", "cosine", "tan", "erf",
    "exponential-minus-one", "log-plus-one", "floor", "ceil", "round-nearest-even",
    "round-nearest-afz", "sign", "remainder", "atan2", "is-finite", "real", "imag", "popcnt",
    "shift-left", "shift-right-logical", "shift-right-arithmetic", "broadcast", "iota",
    "reduce-precision", "bitcast-convert", "stochastic-convert", "transpose", "concatenate",
    "pad", "slice", "reverse", "reshape", "map", "clz",
})
REDUCTION_OPCODES = frozenset({"reduce", "reduce-window", "select-and-scatter"})
MEMCPY_OPCODES = frozenset({"copy", "copy-start", "copy-done"})
#: xprof ``hlo_category`` -> kind, used when the opcode alone does not decide.
CATEGORY_KIND = {
    "convolution": "matmul", "convolution fusion": "matmul", "output fusion": "matmul",
    "loop fusion": "elementwise", "non-fusion elementwise": "elementwise",
    "broadcast": "elementwise", "data formatting": "elementwise", "input fusion": "reduction",
    "reduce": "reduction", "all-reduce": "collective", "all-gather": "collective",
    "reduce-scatter": "collective", "all-to-all": "collective",
    "collective-permute": "collective", "send": "collective", "recv": "collective",
    "copy-start": "memcpy", "copy-done": "memcpy", "copy": "memcpy",
}
#: custom-call targets (``__cudnn$fmha``, ``__cublas$gemm``, ``__cudnn$convForward``...).
ATTENTION_TARGET = re.compile(r"attn|attention|fmha|flash|mha|sdpa", re.I)
GEMM_TARGET = re.compile(r"gemm|matmul|cublas|hipblas|rocblas", re.I)
CONV_TARGET = re.compile(r"conv", re.I)
#: XLA profiles: kernel-name heuristics for kernels without an HLO instruction (TF ops,
#: copies, fills). Narrower than :data:`_KERNEL_RULES` on purpose (an XLA kernel that
#: has an instruction is kinded by it; these only catch what is left), first match wins.
XLA_KERNEL_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^Memcpy|copyBuffer|memcpy", re.I), "memcpy"),
    (re.compile(r"^Memset|fillBuffer|memset", re.I), "memset"),
    (re.compile(r"nccl|rccl", re.I), "collective"),
    (re.compile(r"gemm|Cijk_|cutlass|cublas|sm\d+_xmma|_mma_|matmul", re.I), "matmul"),
)


def kind_of_hlo(opcode: str | None, category: str | None = None,
                fused: frozenset = frozenset(), targets: frozenset = frozenset(),
                kernel_name: str | None = None) -> str:
    """The op-table ``kind`` of an XLA op from its opcode, xprof category, the opcodes inside
    a fusion, custom-call targets, or (last) its kernel name. See docs/xplane.md."""
    base = (opcode or "").removesuffix("-start").removesuffix("-done")
    for t in targets:
        if ATTENTION_TARGET.search(t):
            return "attention"
    if base in COLLECTIVE_OPCODES:
        return "collective"
    if opcode in MEMCPY_OPCODES:
        return "memcpy"
    if opcode == "dot":
        return "matmul"
    if opcode == "convolution":
        return "conv"
    if opcode == "custom-call":
        t = " ".join(targets)
        if GEMM_TARGET.search(t):
            return "matmul"
        if CONV_TARGET.search(t):
            return "conv"
        return "other"
    if opcode == "fusion":
        if fused:
            if "dot" in fused or any(GEMM_TARGET.search(t) for t in targets):
                return "matmul"
            if "convolution" in fused:
                return "conv"
            if fused & COLLECTIVE_OPCODES:
                return "collective"
            if "reduce" in fused:
                return "norm" if "rsqrt" in fused else "reduction"
            return "elementwise"
        if category and category in CATEGORY_KIND:
            return CATEGORY_KIND[category]
        return "other"
    if opcode in REDUCTION_OPCODES:
        return "reduction"
    if opcode in ELEMENTWISE_OPCODES:
        return "elementwise"
    if category and category in CATEGORY_KIND:
        return CATEGORY_KIND[category]
    if kernel_name:
        for pattern, kind in XLA_KERNEL_RULES:
            if pattern.search(kernel_name):
                return kind
    return "other"
