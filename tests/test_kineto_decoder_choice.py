"""Which Kineto decoder reads a file (``parsers/kineto.py``, ``NATIVE_MIN_BYTES``): msgspec
under 15 MB of decompressed JSON (no ``import numpy``), the native scanner at and above it,
``TRACEROOF_DECODER`` forcing either at any size. The tables are equal either way
(``tests/test_kineto_native_equal.py``, which forces ``native``); here the choice itself."""

from __future__ import annotations

import gzip
import logging
import tarfile

import pytest
from conftest import real, require_native

from traceroof.parsers import kineto as K
from traceroof.parsers import kineto_native as N

BERT = ("TraceLens", "tests", "traces", "h100", "gaunernst_bert-small-uncased__1016001.json.gz")
NS_RES = ("HolisticTraceAnalysis", "tests", "data", "ns_resolution_trace", "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")
PLAIN = ("kineto", "tb_plugin", "test", "gpu_metrics_input.json")
DLRM_TAR = ("param", "et_replay", "tests", "inputs", "dlrm_kineto.tar.gz")



def _needs_native() -> None:
    """As tests/test_kineto_native_equal.py: fail under ``TRACEROOF_REQUIRE_NATIVE=1`` (CI),
    skip otherwise, when the extension is not built."""
    require_native()


def _said(caplog, monkeypatch, f, decoder: str | None = None) -> list[str]:
    monkeypatch.setattr(K, "_msgspec_json_bytes", 0)  # a fresh process's count (other tests read files)
    if decoder is None:
        monkeypatch.delenv(N.ENV_DECODER, raising=False)
    else:
        monkeypatch.setenv(N.ENV_DECODER, decoder)
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="traceroof.parsers"):
        f()
    return [r.getMessage() for r in caplog.records if "Kineto decoder" in r.getMessage()]


@pytest.mark.parametrize("parts", [BERT, NS_RES, PLAIN], ids=["bert", "ns-resolution", "plain-json"])
def test_the_size_read_is_the_decompressed_json(parts):
    p = real(*parts)
    want = len(gzip.decompress(p.read_bytes())) if p.name.endswith(".gz") else p.stat().st_size
    with open(p, "rb") as fh:
        assert K._json_size_bytes(fh, p.stat().st_size) == want
        assert fh.tell() == 0  # left where the reader starts


def test_a_short_or_odd_file_is_sized_by_its_bytes(tmp_path):
    f = tmp_path / "t.json.gz"
    f.write_bytes(b"\x1f\x8b\x08")  # a gzip magic and nothing else: no trailer to read
    with open(f, "rb") as fh:
        assert K._json_size_bytes(fh, 3) == 3 and fh.tell() == 0


def test_a_small_file_is_decoded_by_msgspec_a_big_one_by_the_scanner(caplog, monkeypatch):
    _needs_native()
    bert, big = real(*BERT), real(*NS_RES)
    n_bert = len(gzip.decompress(bert.read_bytes()))
    n_big = len(gzip.decompress(big.read_bytes()))
    assert n_bert < K.NATIVE_MIN_BYTES <= n_big  # the two sides of the line (1.08 MB, 15.38 MB)
    assert _said(caplog, monkeypatch, lambda: K.read(bert)) == [
        f"{bert}: Kineto decoder: msgspec ({n_bert} bytes of JSON, below {K.NATIVE_MIN_BYTES})"]
    assert _said(caplog, monkeypatch, lambda: K.read(big)) == [f"{big}: Kineto decoder: native scanner"]
    # in memory: the same line, by the decompressed length
    data = bert.read_bytes()
    assert _said(caplog, monkeypatch, lambda: K.read_bytes(data, path="b.json")) == [
        f"b.json: Kineto decoder: msgspec ({n_bert} bytes of JSON, below {K.NATIVE_MIN_BYTES})"]


def test_the_environment_forces_either_decoder_at_any_size(caplog, monkeypatch):
    _needs_native()
    bert, big = real(*BERT), real(*NS_RES)
    assert _said(caplog, monkeypatch, lambda: K.read(bert), "native") == [f"{bert}: Kineto decoder: native scanner"]
    assert _said(caplog, monkeypatch, lambda: K.read(big), "python") == [
        f"{big}: Kineto decoder: msgspec ({N.ENV_DECODER}=python)"]


def test_tar_members_are_sized_by_their_header(caplog, monkeypatch):
    from traceroof.parsers import tar

    p = real(*DLRM_TAR)
    with tarfile.open(p) as tf:
        sizes = {f"{p}!{m.name}": m.size for m in tf.getmembers() if m.isfile() and m.name.endswith(".json")}
    assert len(sizes) == 8 and max(sizes.values()) < K.NATIVE_MIN_BYTES
    said = _said(caplog, monkeypatch, lambda: tar.read(p))
    assert sorted(said) == sorted(f"{name}: Kineto decoder: msgspec ({n} bytes of JSON, below {K.NATIVE_MIN_BYTES})"
                                  for name, n in sizes.items())


def test_many_small_files_switch_to_the_scanner_once_msgspec_has_read_the_line(caplog, monkeypatch):
    """Ranks: msgspec's extra decoding is bounded by about one ``import numpy``. bert is
    1,078,563 bytes of JSON: reads 1..13 total 14.02 MB, below the 15 MB line (msgspec); the
    14th would bring the total to 15.10 MB (the scanner, and every read after it). numpy is
    hidden from ``sys.modules`` so the loaded-numpy rule does not decide first."""
    bert = real(*BERT)
    n = len(gzip.decompress(bert.read_bytes()))
    assert 13 * n < K.NATIVE_MIN_BYTES <= 14 * n
    monkeypatch.setattr(K, "sys", type("S", (), {"modules": {}})())
    monkeypatch.setattr(K, "_msgspec_json_bytes", 0)
    monkeypatch.delenv(N.ENV_DECODER, raising=False)
    assert [K._use_native(n, "b") for _ in range(15)] == [False] * 13 + [True, True]
    assert K._msgspec_json_bytes == 13 * n


def test_with_numpy_loaded_the_scanner_reads_from_2_mb(monkeypatch):
    """numpy already imported (by another reader or the caller): the scanner costs no import,
    so it reads every file of 2 MB of JSON or more; below that msgspec is as fast (bert, 1.08
    MB: 3 ms faster)."""
    monkeypatch.setattr(K, "sys", type("S", (), {"modules": {"numpy": object()}})())
    monkeypatch.setattr(K, "_msgspec_json_bytes", 0)
    monkeypatch.delenv(N.ENV_DECODER, raising=False)
    assert K._use_native(K.NATIVE_WARM_MIN_BYTES - 1, "a") is False
    assert K._use_native(K.NATIVE_WARM_MIN_BYTES, "b") is True
    assert K._use_native(8_647_357, "qwen") is True  # below the 15 MB line, but numpy is there
