"""XPlane parser on real traces (../shared/fixtures/real) and generated edge cases."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import polars as pl
import pytest

from traceroof.errors import InputNotFoundError, TraceFormatError
from traceroof.parsers import xplane
from traceroof.parsers import xplane_proto as xp

REAL = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "real"
TPU = REAL / "xprof/xprof/convert/test_xplanes/tpu_inference_2.xplane.pb"
MANGLED = REAL / "xprof/xprof/convert/test_xplanes/tpu_inference_2.xplane.pb.HEAD-bfd424c-utf8-mangled"
MI300_GEMM = REAL / "TraceLens/tests/traces/mi300/jax08_gemm/tw003.xplane.pb"
MI300_ATTN = REAL / "TraceLens/tests/traces/mi300/jax08_attention/tw003.xplane.pb"
MI355_TE = REAL / "TraceLens/tests/test_data_jax_te_fused_attn_categorization/934987a2fc2f.xplane.pb"
TF_V100 = REAL / "profiler/demo/plugins/profile/GPU-multi-worker/34.83.195.179_6003.xplane.pb"
CPU = Path(__file__).resolve().parents[1] / "fixtures" / "jax_cpu" / "train_step.xplane.pb"

ALL_XPLANE_FILES = sorted(p for p in REAL.rglob("*") if ".xplane.pb" in p.name and p.is_file())


def _need(path: Path) -> Path:
    assert path.exists(), f"fixture missing: {path}"
    return path


@pytest.fixture(scope="module")
def tpu():
    return xplane.read(_need(TPU))


# --- every real file: a Trace or a clear error ----------------------------------------------


def test_all_real_xplanes_found():
    assert len(ALL_XPLANE_FILES) == 7, ALL_XPLANE_FILES


@pytest.mark.parametrize("path", ALL_XPLANE_FILES, ids=lambda p: "/".join(p.parts[-3:]))
def test_every_real_xplane_parses_or_raises(path):
    if path == MANGLED:
        with pytest.raises(TraceFormatError) as exc:
            xplane.read(path)
        msg = str(exc.value)
        assert str(path) in msg
        assert "byte 1:" in msg  # the plane length varint right after the first tag
        assert "258174 U+FFFD" in msg
        assert exc.value.exit_code == 4
        return
    trace = xplane.read(path)
    assert trace.meta.format == "xplane"
    assert trace.ops.height > 0
    assert trace.meta.devices
    assert (trace.ops["dur_ns"] >= 0).all()
    assert trace.ops["start_ns"].min() >= 0
    # an op is never silently costed as zero when unknown
    unknown = trace.ops.filter(pl.col("cost_source") == "unknown")
    assert unknown["bytes"].null_count() == unknown.height


# --- TPU v6e ---------------------------------------------------------------------------------


def test_tpu_devices(tpu):
    assert [d.name for d in tpu.meta.devices] == ["TPU v6 Lite"] * 4
    assert [d.index for d in tpu.meta.devices] == [0, 1, 2, 3]
    d = tpu.meta.devices[0]
    assert d.peak_flops_per_s == pytest.approx(918e12)
    assert d.peak_hbm_bytes_per_s == pytest.approx(1637.993152512e9)
    assert d.extra["device_type"] == "TPU"


def test_tpu_ops_from_xla_ops_line(tpu):
    # XLA Ops: 1504 + 3 * 1503 events; Async XLA Ops (600 on TPU:0) are not ops
    assert tpu.ops.height == 1504 + 3 * 1503
    assert tpu.meta.stats["xplane.async_ops_skipped"] == 600
    assert set(tpu.ops["cost_source"].unique()) == {"trace"}
    assert tpu.ops["flops"].null_count() == 0 and tpu.ops["bytes"].null_count() == 0
    fus = tpu.ops.filter(pl.col("name") == "broadcast_add_fusion.1")
    assert fus.height == 400
    assert set(fus["flops"].unique()) == {1342177280.0}
    assert set(fus["bytes"].unique()) == {10737418240.0}
    assert set(fus["op"].unique()) == {"fusion"}
    assert set(fus["kind"].cast(pl.String).unique()) == {"elementwise"}  # loop fusion
    assert set(fus["hlo_category"].unique()) == {"loop fusion"}
    assert set(fus["dtype"].unique()) == {"fp32"}


def test_tpu_collectives(tpu):
    ar = tpu.ops.filter(pl.col("op") == "all-reduce")
    assert ar.height == 12
    assert set(ar["kind"].cast(pl.String).unique()) == {"collective"}
    # f32[5,1024,1024,256]: 5 * 2**28 * 4 bytes; replica_groups=[4,2]<=[2,4]T(1,0): groups of 2
    assert set(ar["comm_bytes"].unique()) == {5 * 2**28 * 4.0}
    assert set(ar["group_size"].unique()) == {2}
    copies = tpu.ops.filter(pl.col("op").is_in(["copy-start", "copy-done"]))
    assert copies.height == 4800
    assert set(copies["kind"].cast(pl.String).unique()) == {"memcpy"}


def test_tpu_times_are_exact_integer_arithmetic(tpu):
    """start/dur recomputed from the raw proto fields with plain integer arithmetic: the
    device_offset_ps / device_duration_ps stats of each XLA Ops event."""
    space = xp.XSpace()
    space.ParseFromString(TPU.read_bytes())
    expected = []
    for plane in space.planes:
        if not plane.name.startswith("/device:TPU:"):
            continue
        dev = int(plane.name.rsplit(":", 1)[1])
        names = {k: v.name for k, v in plane.stat_metadata.items()}
        for line in plane.lines:
            if line.name != "XLA Ops":
                continue
            for e in line.events:
                st = {names[s.metadata_id]: (s.int64_value or s.uint64_value) for s in e.stats}
                off, dur = st["device_offset_ps"], st["device_duration_ps"]
                expected.append((dev, line.timestamp_ns + off // 1000,
                                 (off + dur) // 1000 - off // 1000))
    got = tpu.ops.select("device", pl.col("start_ns") + tpu.meta.origin_ns, "dur_ns").rows()
    assert sorted(got) == sorted(expected)
    assert tpu.meta.base_time_ns == 1741722099081044120  # Task Environment profile_start_time


def test_cpu_times_are_exact_integer_arithmetic():
    trace = xplane.read(_need(CPU))
    space = xp.XSpace()
    space.ParseFromString(CPU.read_bytes())
    expected = []
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        names = {k: v.name for k, v in plane.stat_metadata.items()}
        for line in plane.lines:
            for e in line.events:
                if any(names[s.metadata_id] == "hlo_op" for s in e.stats):
                    expected.append((line.timestamp_ns + e.offset_ps // 1000,
                                     (e.offset_ps + e.duration_ps) // 1000 - e.offset_ps // 1000))
    got = trace.ops.select(pl.col("start_ns") + trace.meta.origin_ns, "dur_ns").rows()
    assert len(expected) == 477
    assert sorted(got) == sorted(expected)


# --- GPU (jax on MI300X / MI355X, TensorFlow on V100) -------------------------------------


def test_mi300_stream_kernels_and_launches():
    trace = xplane.read(_need(MI300_GEMM))
    assert trace.ops.height == 54  # 42 + 12 kernels on the two stream lines
    assert trace.meta.stats["xplane.empty_device_planes"] == 7  # GPU:1..7 unused
    assert len(trace.meta.devices) == 1
    d = trace.meta.devices[0]
    assert (d.compute_major, d.compute_minor, d.num_sms, d.memory_bytes) == (9, 4, 304, 206141652992)
    assert d.extra["device_vendor"] == "AMD"
    assert d.peak_flops_per_s is None  # the trace states no peak
    linked = trace.ops.filter(pl.col("launch_start_ns").is_not_null())
    assert linked.height == 54
    assert (linked["launch_start_ns"] <= linked["start_ns"]).all()


def test_mi300_gemm_cost_from_hlo():
    trace = xplane.read(_need(MI300_GEMM))
    mm = trace.ops.filter(pl.col("kind") == "matmul")
    assert mm.height == 18
    assert set(mm["cost_source"].unique()) == {"shapes"}
    per_prog = mm.group_by("program_id").agg(pl.len(), pl.col("flops").sum()).sort("program_id")
    for n, flops in per_prog.select("len", "flops").rows():
        assert n == 3  # three executions, one kernel each
        assert flops > 0
    # jit_dot(34): __cublas$gemm bf16[4096,4096] @ bf16[4096,4096]: 2*M*N*K FLOPs, and the
    # two operands plus the result (not the s8 workspace) as bytes
    one = trace.ops.filter((pl.col("program_id") == 34) & (pl.col("hlo_op") == "custom-call.1"))
    assert set(one["flops"].unique()) == {2.0 * 4096**3}
    assert set(one["bytes"].unique()) == {3 * 4096 * 4096 * 2.0}
    assert set(one["dtype"].unique()) == {"bf16"}


def test_multi_kernel_hlo_op_cost_is_spread():
    trace = xplane.read(_need(MI355_TE))
    assert trace.ops.height == 150
    bwd = trace.ops.filter(pl.col("hlo_op") == "te_fused_attn_backward_ffi.12")
    assert bwd.height == 25
    assert set(bwd["kind"].cast(pl.String).unique()) == {"attention"}
    # TE fused attention from its backend_config: b=2, h=16, s=2048 causal (mask_type 2:
    # 2048*2049/2 pairs), d=128; backward 2*b*h*P*(3d + 2d_v); 5 executions of 5 kernels
    per_exec = 2 * 2 * 16 * (2048 * 2049 // 2) * (3 * 128 + 2 * 128)
    assert bwd["flops"].null_count() == 0
    assert bwd["flops"].sum() == pytest.approx(5 * per_exec, rel=1e-12)
    dot = trace.ops.filter(pl.col("hlo_op") == "gemm_fusion_dot")
    assert dot.height == 5 and dot["flops"].n_unique() == 1  # one kernel per execution


def test_tf_v100_stream_lines_only_and_steps():
    trace = xplane.read(_need(TF_V100))
    # kernels + memcpys on Stream lines of GPU:1, :4, :6; TensorFlow Ops lines are derived
    assert trace.ops.height == 19 + (2 + 80 + 665 + 12) + (99 + 2 + 665 + 12)
    assert trace.meta.stats["xplane.derived_op_lines_skipped"] == 2
    assert sorted(d.index for d in trace.meta.devices) == [1, 4, 6]
    assert {d.num_sms for d in trace.meta.devices} == {80}
    gpu4 = trace.ops.filter(pl.col("device") == 4)
    assert gpu4["step"].drop_nulls().unique().to_list() == [0]  # the Steps line
    copies = trace.ops.filter(pl.col("kind") == "memcpy")
    assert copies.height == 19 + 2 + 80 + 12 + 99 + 2 + 12
    assert copies.filter(pl.col("bytes") == 6144.0).height >= 1  # memcpy_details size
    hr = trace.ops.filter(pl.col("op") == "_HostRecv")
    assert hr.height >= 1


def test_cpu_profile_ops_steps_and_kinds():
    trace = xplane.read(_need(CPU))
    assert trace.ops.height == 477  # 159 XLA CPU thunks x 3 steps
    assert trace.ops["step"].unique().sort().to_list() == [0, 1, 2]
    assert [d.name for d in trace.meta.devices] == ["CPU"]
    assert set(trace.ops["hlo_module"].unique()) == {"jit_train_step"}
    assert trace.meta.versions.get("jax")
    marks = trace.host.filter(pl.col("cat") == "annotation")
    assert marks["name"].to_list() == ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"]
    assert marks["annotation"].to_list() == ["train"] * 3


# --- bad and damaged input ------------------------------------------------------------------


def test_empty_and_non_xspace_files(tmp_path):
    empty = tmp_path / "empty.xplane.pb"
    empty.write_bytes(b"")
    with pytest.raises(TraceFormatError, match=r"empty\.xplane\.pb: byte 0: empty file"):
        xplane.read(empty)
    js = tmp_path / "trace.json"
    js.write_text('{"traceEvents": []}')
    with pytest.raises(TraceFormatError, match=r"trace\.json: byte 0: .*invalid wire type 3"):
        xplane.read(js)
    text = tmp_path / "notes.txt"
    text.write_text("hello world\n")  # parses as protobuf unknown fields: no XPlane in it
    with pytest.raises(TraceFormatError, match="byte"):
        xplane.read(text)
    with pytest.raises(InputNotFoundError):
        xplane.read(tmp_path / "missing.xplane.pb")


def test_truncated_file_keeps_complete_planes(tmp_path):
    data = TPU.read_bytes()
    cut = tmp_path / "cut.xplane.pb"
    cut.write_bytes(data[: int(len(data) * 0.8)])  # cut inside the /host:CPU plane
    trace = xplane.read(cut)
    assert trace.ops.height == 1504 + 3 * 1503  # all TPU planes came before the cut
    # the warning says where the file ends, in which plane, what of it was kept and lost
    assert any(f"trace is truncated at byte {int(len(data) * 0.8):,}: the file ends inside plane '/host:CPU'" in w
               and "lost the rest of the plane" in w for w in trace.meta.warnings)


def test_gzip_and_bytes_input(tmp_path):
    gz = tmp_path / "cpu.xplane.pb.gz"
    gz.write_bytes(gzip.compress(CPU.read_bytes()))
    assert xplane.read(gz).ops.height == 477
    assert xplane.read_bytes(CPU.read_bytes()).ops.height == 477


def test_invalid_utf8_name_survives():
    space = xp.XSpace(hostnames=["h"])
    plane = space.planes.add(id=1, name="/device:GPU:0")
    plane.event_metadata[1].CopyFrom(xp.XEventMetadata(id=1, name="kernX_gemm"))
    line = plane.lines.add(id=7, name="Stream #7", timestamp_ns=100)
    line.events.add(metadata_id=1, offset_ps=1500, duration_ps=2500)
    data = space.SerializeToString().replace(b"kernX_gemm", b"kern\xff_gemm")
    trace = xplane.read_bytes(data)
    assert trace.ops["name"].to_list() == ["kern\ufffd_gemm"]
    assert trace.ops["kind"].cast(pl.String).to_list() == ["matmul"]  # name heuristic
    assert trace.ops["dur_ns"].to_list() == [(1500 + 2500) // 1000 - 1]


# --- profile directories (BC-21) ------------------------------------------------------------


def _tiny_space(host: str, n_ops: int, t0_unix_ns: int) -> bytes:
    space = xp.XSpace(hostnames=[host])
    plane = space.planes.add(id=1, name="/device:TPU:0")
    sid = {"flops": 1, "bytes_accessed": 2, "hlo_category": 3, "device_type_string": 4}
    for name, k in sid.items():
        plane.stat_metadata[k].CopyFrom(xp.XStatMetadata(id=k, name=name))
    plane.stats.add(metadata_id=4, str_value="TPU v5 lite")
    md = plane.event_metadata[1]
    md.CopyFrom(xp.XEventMetadata(id=1, name="%fusion.1 = bf16[128,256]{1,0} fusion(bf16[128,64]{1,0} %p)",
                                  display_name="fusion.1"))
    md.stats.add(metadata_id=1, uint64_value=2 * 128 * 256 * 64)
    md.stats.add(metadata_id=2, uint64_value=4096)
    md.stats.add(metadata_id=3, str_value="convolution fusion")
    line = plane.lines.add(id=3, name="XLA Ops", timestamp_ns=1000)
    for i in range(n_ops):
        line.events.add(metadata_id=1, offset_ps=i * 10_000, duration_ps=5_000)
    env = space.planes.add(id=2, name="Task Environment")
    env.stat_metadata[1].CopyFrom(xp.XStatMetadata(id=1, name="profile_start_time"))
    env.stats.add(metadata_id=1, uint64_value=t0_unix_ns)
    return space.SerializeToString()


def test_read_dir_two_hosts_no_double_counting(tmp_path):
    run = tmp_path / "logs" / "plugins" / "profile" / "2026_01_02_03_04_05"
    run.mkdir(parents=True)
    (run / "hostA.xplane.pb").write_bytes(_tiny_space("hostA", 3, 1_700_000_000_000_000_000))
    (run / "hostB.xplane.pb").write_bytes(_tiny_space("hostB", 5, 1_700_000_000_000_002_000))
    # jax writes a trace.json.gz beside the xplane: it must not be read as well
    (run / "hostA.trace.json.gz").write_bytes(gzip.compress(b'{"traceEvents": []}'))
    older = tmp_path / "logs" / "plugins" / "profile" / "2025_12_31_00_00_00"
    older.mkdir()
    (older / "hostA.xplane.pb").write_bytes(_tiny_space("hostA", 7, 1))
    trace = xplane.read_dir(tmp_path / "logs")
    assert trace.ops.height == 3 + 5
    by_host = trace.ops.group_by("host", "rank").len().sort("rank").rows()
    assert by_host == [("hostA", 0, 3), ("hostB", 1, 5)]
    assert trace.meta.ranks == [0, 1] and trace.meta.world_size == 2
    assert trace.meta.stats["xplane.hosts"] == 2
    assert trace.meta.stats["xplane.files_ignored"] == 2  # the .trace.json.gz, the older run
    assert any("other runs ignored" in w for w in trace.meta.warnings)
    # clocks aligned through profile_start_time: hostB started 2000 ns later
    b0 = trace.ops.filter(pl.col("host") == "hostB")["start_ns"].min()
    a0 = trace.ops.filter(pl.col("host") == "hostA")["start_ns"].min()
    assert b0 - a0 == 2000
    assert set(trace.ops["flops"].unique()) == {2.0 * 128 * 256 * 64}
    assert set(trace.ops["kind"].cast(pl.String).unique()) == {"matmul"}
    assert set(trace.ops["dtype"].unique()) == {"bf16"}
    assert [d.extra["host"] for d in trace.meta.devices] == ["hostA", "hostB"]
    # one host on request; read() on a directory does the same as read_dir()
    assert xplane.read_dir(tmp_path / "logs", host="hostB").ops.height == 5
    assert xplane.read(run).ops.height == 8


def test_read_dir_errors(tmp_path):
    with pytest.raises(InputNotFoundError):
        xplane.read_dir(tmp_path)
    (tmp_path / "a.xplane.pb").write_bytes(b"")
    with pytest.raises(TraceFormatError):
        xplane.read_dir(tmp_path)
    shutil.copy(CPU, tmp_path / "b.xplane.pb")
    trace = xplane.read_dir(tmp_path)  # the unreadable host is skipped, loudly
    assert trace.ops.height == 477
    assert any("a.xplane.pb" in w for w in trace.meta.warnings)


def test_name_matches_equals_a_per_event_regex_over_the_names():
    """``Plane.name_matches`` (the regex once per distinct metadata id, cached) against polars'
    ``str.contains`` over every event's name, on every host line of the TPU inference trace;
    it must find the trace's jax dispatches (``PjitFunction(...)``, kept as ``cpu_op`` rows)."""
    from traceroof.parsers.xplane_host import _HOST_OP
    from traceroof.parsers.xplane_planes import Plane

    space = xp.scan_space(_need(TPU).read_bytes())
    hits = lines = 0
    for plane in (Plane(p) for p in space.planes):
        if not plane.name.startswith("/host:"):
            continue
        for i in range(len(plane.scan.line_ranges)):
            cols = plane.scan.line(i).events
            if cols is None or not len(cols):
                continue
            want = plane.names(cols).str.contains(_HOST_OP.pattern).to_list()
            got = plane.name_matches(cols, _HOST_OP).tolist()
            assert got == want
            assert plane.name_matches(cols, _HOST_OP).tolist() == want  # the cached answer too
            hits += sum(want)
            lines += 1
    assert lines > 100 and hits > 0, (lines, hits)
