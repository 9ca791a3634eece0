"""Launch → framework-op links by time nesting, and the check every link must pass (rule 8).

Two Kineto eras link a runtime call (``cudaLaunchKernel``…) to its ``cpu_op`` differently:

* **id era** (PyTorch ≥ ~1.13): the runtime call's ``External id`` is the id of the
  framework op that issued it; ``correlation`` is a separate counter.
* **nesting era** (PyTorch 1.x, e.g. HTA's ``trace_diff`` and ``critical_path/alexnet``,
  param's DLRM set): the runtime call's ``External id`` *equals* its ``correlation`` and names
  no ``cpu_op``; the op is the innermost ``cpu_op`` running on the launching thread that
  encloses the call (HTA builds the same link from its per-``(pid, tid)`` call stacks).

Either way a link is accepted only when the op's host interval encloses the launch on the same
``(pid, thread)`` (docs/accounting.md, "Links (rule 8)"); :func:`consistent_links` checks it.
"""

from __future__ import annotations

import polars as pl


def is_nesting_era(host: pl.DataFrame) -> bool:
    """True when every runtime call carrying both ids has ``External id == correlation``
    (and at least one does): the PyTorch 1.x rule, where ids do not name the ``cpu_op``.

    Args:
        host: a host table (:data:`traceroof.schema.HOST_SCHEMA`; ``cat``, ``correlation`` and
            ``external_id`` are read).
    """
    rt = host.filter(
        pl.col("cat") == "runtime", pl.col("correlation").is_not_null(), pl.col("external_id").is_not_null()
    )
    return bool(rt.height) and bool((rt["correlation"] == rt["external_id"]).all())


def enclosing_cpu_ops(host: pl.DataFrame, launches: pl.DataFrame) -> pl.Series:
    """Row (into ``host``) of the innermost ``cpu_op`` enclosing each launch on its thread.

    Innermost: of the ``cpu_op`` events on the same ``(pid, thread)`` with
    ``start_ns <= launch_start_ns`` and ``start_ns + dur_ns >= launch_start_ns + launch_dur_ns``,
    the one that started last (of equal starts, the shorter; then the later in table order).

    Args:
        host: a host table (``cat``, ``pid``, ``thread``, ``start_ns``, ``dur_ns`` are read).
        launches: one row per launch, columns ``launch_pid``, ``launch_thread`` (String),
            ``launch_start_ns``, ``launch_dur_ns`` (Int64, ns); nulls never match.

    Returns:
        A ``UInt32`` series, one per launch row in order; null where no ``cpu_op`` encloses it.
    """
    ops = (
        host.select(pl.int_range(pl.len(), dtype=pl.UInt32).alias("_h"), "cat", "pid", "thread", "start_ns", "dur_ns")
        .filter(pl.col("cat") == "cpu_op", pl.col("start_ns").is_not_null())
        .select("_h", pl.concat_str("pid", pl.lit("\x00"), "thread").alias("_t"), "start_ns",
                (pl.col("start_ns") + pl.col("dur_ns").fill_null(0)).alias("_end"))
    )
    q = launches.select(
        pl.int_range(pl.len(), dtype=pl.UInt32).alias("_q"),
        pl.concat_str("launch_pid", pl.lit("\x00"), "launch_thread").alias("_t"),
        pl.col("launch_start_ns").alias("start_ns"),
        (pl.col("launch_start_ns") + pl.col("launch_dur_ns").fill_null(0)).alias("_end"),
    ).filter(pl.col("_t").is_not_null(), pl.col("start_ns").is_not_null())
    out = [-1] * launches.height  # plain Python: the sweep indexes it one launch at a time
    if ops.height and q.height:
        threads = set(q["_t"].unique().to_list())
        for t, o in ops.filter(pl.col("_t").is_in(list(threads))).group_by("_t"):
            qt = q.filter(pl.col("_t") == t[0])
            _sweep(o.sort(["start_ns", "_end", "_h"], descending=[False, True, False]), qt.sort("start_ns"), out)
    s = pl.Series("_h", out, dtype=pl.Int64)
    return pl.select(pl.when(s >= 0).then(s).cast(pl.UInt32)).to_series().alias("_h")


def _sweep(ops: pl.DataFrame, q: pl.DataFrame, out: list[int]) -> None:
    """One thread: walk ops and launches in start order with a stack of open ops (an op that
    starts at the launch's ns is opened first); each launch takes the topmost open op whose end
    reaches its own end. Writes host rows into ``out[q._q]``."""
    o_start, o_end, o_row = (ops[c].to_list() for c in ("start_ns", "_end", "_h"))
    q_start, q_end, q_row = (q[c].to_list() for c in ("start_ns", "_end", "_q"))
    stack: list[int] = []
    i, n = 0, len(o_start)
    for k in range(len(q_start)):
        a, b = q_start[k], q_end[k]
        while i < n and o_start[i] <= a:
            while stack and o_end[stack[-1]] < o_start[i]:
                stack.pop()
            stack.append(i)
            i += 1
        while stack and o_end[stack[-1]] < a:
            stack.pop()
        for j in reversed(stack):
            if o_end[j] >= b:
                out[q_row[k]] = o_row[j]
                break


def consistent_links(host: pl.DataFrame, ops: pl.DataFrame) -> pl.Series:
    """Rule 8 on each kernel's proposed link: does the op (``_op_row`` into ``host``) run on
    the launch's ``(pid, thread)`` and enclose ``[launch_start_ns, launch_start_ns + launch_dur_ns]``?

    Args:
        host: the host table the rows index.
        ops: with ``_op_row`` (UInt32, null: no link proposed), ``launch_pid``,
            ``launch_thread``, ``launch_start_ns``, ``launch_dur_ns``.

    Returns:
        A Boolean series per op row: null where no link is proposed, False where the link is
        inconsistent (including a link with no recorded launch to check it against).
    """
    h = host.select("pid", "thread", "start_ns", "dur_ns")
    rows = ops["_op_row"]
    got = h[rows.fill_null(0)] if h.height else pl.DataFrame(
        {c: pl.Series([None] * ops.height, dtype=h.schema[c]) for c in h.columns})
    la, lb = ops["launch_start_ns"], ops["launch_start_ns"] + ops["launch_dur_ns"].fill_null(0)
    ok = (
        (got["pid"] == ops["launch_pid"]).fill_null(False)
        & (got["thread"] == ops["launch_thread"]).fill_null(False)
        & (got["start_ns"] <= la).fill_null(False)
        & ((got["start_ns"] + got["dur_ns"].fill_null(0)) >= lb).fill_null(False)
    )
    return pl.select(pl.when(rows.is_not_null()).then(ok)).to_series().alias("_link_ok")
