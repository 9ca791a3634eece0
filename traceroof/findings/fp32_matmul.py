"""FP32 matmuls not on tensor cores, on a chip that has TF32 (or bf16/fp16) tensor cores.

An op qualifies when it is matrix-class (matmul, attention, conv), its dtype is ``fp32``, the
roofline put it against the fp32 (CUDA-core) peak (``peak_dtype == "fp32"``: the kernel name
names no TF32 path and its achieved rate is within the fp32 peak), its FLOPs are known, and its
kernel name is not a tensor-core kernel (``xmma``, ``hmma``, ``s1688``, ``tf32``, ``wgmma`` ...).

Recoverable per op = ``dur − max(dur · P_fp32 / P_target, memory_ns)``: the same kernel at the
same efficiency on the TF32 (else bf16) tensor-core peak, but never faster than its HBM time.
See ``docs/findings/fp32_matmul.md``.
"""

from __future__ import annotations

import polars as pl

from . import Finding, FindingContext, register
from ._common import busy_ns, by_rank, claim, fmt_ns, name_tests, short, wall_ns

#: Report a group when it gives back at least this share of the rank's device busy time.
MIN_SHARE_OF_BUSY = 0.005
#: Groups reported per rank.
MAX_FINDINGS = 10
#: Kernel names that already run on tensor cores.
TENSOR_CORE_RE = r"(?i)xmma|hmma|imma|wgmma|[sh]884|[sh]1688|[sh]16816|i8816|tf32|xf32|tensorop|mfma"


@register("fp32_matmul")
def detect(ctx: FindingContext) -> list[Finding]:
    """One finding per (rank, op) of fp32 matmul work that a tensor-core dtype would speed up."""
    p32 = ctx.chip.peak("fp32")
    target = next((d for d in ("tf32", "bf16", "fp16") if (ctx.chip.peak(d) or 0) > (p32 or 0)), None)
    if not p32 or target is None:
        return []
    pt = float(ctx.chip.peak(target))
    ratio = float(p32) / pt
    ops = ctx.ops.filter(
        pl.col("kind").is_in(["matmul", "attention", "conv"]),
        pl.col("dtype") == "fp32",
        pl.col("peak_dtype") == "fp32",
        pl.col("flops").is_not_null(),
        pl.col("dur_ns") > 0,
    )
    # the kernel-name regex runs once per distinct name of the few rows left (a null name is
    # no tensor-core kernel)
    ops = ops.filter(~name_tests(ops["name"], {"tc": TENSOR_CORE_RE})["tc"])
    if ops.height == 0:
        return []
    new = pl.max_horizontal(pl.col("dur_ns") * ratio, pl.col("memory_ns").fill_null(0.0))
    ops = ops.with_columns((pl.col("dur_ns") - new).clip(lower_bound=0.0).alias("rec"),
                           pl.coalesce("op", "name").alias("label"))
    out: list[Finding] = []
    best = _best_per_rank(ops)
    for rank, r in by_rank(ops):
        busy = busy_ns(ctx, rank)
        top = best.get(rank)
        if top is not None and top < MIN_SHARE_OF_BUSY * busy * _MARGIN:  # no group reaches the bar
            continue
        wall = wall_ns(ctx, rank)
        g = r.group_by("label").agg(
            pl.len().alias("n"), pl.col("dur_ns").sum().alias("measured"), pl.col("rec").sum(),
            pl.col("flops").sum(), pl.col("kind").cast(pl.String).first(), pl.col("name").first(),
            pl.col("step").drop_nulls().unique().alias("steps"),
        ).sort(["rec", "label"], descending=[True, False])
        for row in g.head(MAX_FINDINGS).iter_rows(named=True):
            rec = float(row["rec"])
            if rec < MIN_SHARE_OF_BUSY * busy or rec <= 0:
                continue
            achieved = row["flops"] / row["measured"] * 1e9 if row["measured"] else None
            steps = sorted(row["steps"])
            title = (
                f"{short(row['label'], 50)} ×{row['n']:,} runs in fp32 on CUDA cores: {fmt_ns(rec)} recoverable "
                f"with {target.upper()} tensor cores"
            )
            expl = (
                f"{row['n']:,} fp32 {row['kind']} ops ({short(row['label'], 60)}) took {fmt_ns(row['measured'])} at "
                f"{(achieved or 0) / 1e12:.3g} TFLOP/s, against an fp32 (non-tensor) peak of {p32 / 1e12:.4g} TFLOP/s; "
                f"{ctx.chip.name} reaches {pt / 1e12:.4g} TFLOP/s in {target}. At the same efficiency they would "
                f"take {fmt_ns(row['measured'] - rec)}. Fix: allow TF32 (torch.set_float32_matmul_precision('high'), "
                "torch.backends.cuda.matmul.allow_tf32 = True, torch.backends.cudnn.allow_tf32 = True; JAX "
                "jax_default_matmul_precision), or train in bf16 autocast."
            )
            out.append(claim(
                "fp32_matmul", title, rec, wall, expl,
                {
                    "op": row["label"], "count": row["n"], "measured_ns": float(row["measured"]),
                    "recoverable_ns": rec, "flops": float(row["flops"]), "achieved_flops_per_s": achieved,
                    "fp32_peak_flops_per_s": float(p32), "target_dtype": target,
                    "target_peak_flops_per_s": pt, "speedup_assumed": 1.0 / ratio, "steps": steps,
                    "example_kernel": short(row["name"], 120), "device_busy_ns": busy, "window_ns": wall,
                },
                rank=int(rank),
                steps=steps,
                ops=[row["label"]],
                occurrences=int(row["n"]),
            ))
    return out


#: :func:`_best_per_rank` adds in another order than the per-rank sums (float rounding: a
#: relative difference of ~1e-12 at most); a rank is left out only when its best is below the
#: bar by far more than that
_MARGIN = 0.999


def _best_per_rank(ops: pl.DataFrame) -> dict[int, float]:
    """Per rank of ``ops`` (the fp32 rows, with ``rec`` and ``label``): the largest ``rec``
    (ns) summed over one label, in one query for every rank; a rank whose sums hold a NaN is
    left out (it is checked group by group)."""
    g = (ops.lazy().group_by("rank", "label").agg(pl.col("rec").sum())
         .group_by("rank").agg(pl.col("rec").max().alias("top"), pl.col("rec").is_nan().any().alias("nan"))
         .collect())
    return {int(r): float(t) for r, t, nan in g.iter_rows() if r is not None and t is not None and not nan}
