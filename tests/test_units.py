"""traceroof.units: the one set of number formatters (exact strings, units included)."""

from __future__ import annotations

import pytest

from traceroof import units


@pytest.mark.parametrize("n", [48, 60, 70])
def test_short_cuts_to_n_characters_with_an_ellipsis(n):
    name = "x" * (n + 5)
    out = units.short(name, n)
    assert len(out) == n and out.endswith("…") and out[:-1] == "x" * (n - 1)
    assert units.short("x" * n, n) == "x" * n  # exactly n: kept whole


def test_short_placeholder_for_none():
    assert units.short(None) == "—"
    assert units.short(None, 48, none="") == ""


@pytest.mark.parametrize(("v", "text"), [
    (150, "150 ns"), (20_000, "20 µs"), (21_300_000, "21.3 ms"), (1.234e9, "1.23 s"),
    (-2_500, "-2.5 µs"), (999.6, "1000 ns"),
])
def test_ns(v, text):
    assert units.ns(v) == text


def test_ns_placeholders():
    assert units.ns(None) == "—"
    assert units.ns(None, none="?") == "?"


def test_rates_and_counts():
    assert units.flops_per_s(989.4e12) == "989.4 TFLOP/s"
    assert units.flops_per_s(12.0) == "12 FLOP/s"
    assert units.bytes_per_s(3.35e12) == "3.35 TB/s"
    assert units.bytes_per_s(None) == "—"
    assert units.count(1.23e9, "FLOP") == "1.23 GFLOP"
    assert units.count(12) == "12"
    assert units.tflops(989.4e12) == "989" and units.tflops(67e12) == "67.0"
    assert units.tflops(1.234e12) == "1.23"


def test_shares_and_ratios():
    assert units.pct(0.4234) == "42.3 %"
    assert units.pct(0.4234, 2) == "42.34 %"
    assert units.pct(None) == "—"
    assert units.ratio(156.25, "FLOP/B") == "156 FLOP/B"


def test_sizes_and_times():
    assert units.bytes_binary(1.5 * 2**30) == "1.5 GiB"
    assert units.bytes_binary(512) == "512 B"
    assert units.bytes_binary(None) == "? B"
    assert units.bytes_exact(524_288) == "512 KiB (524,288 B)"
    assert units.gigabytes(13_476_831_232) == "13.48 GB (12.55 GiB)"
    assert units.count_exact(6_738_149_376) == "6,738,149,376 (6.74 B)"
    assert units.flop(13.48e9, "/token") == "13.48 GFLOP/token"
    assert units.flop(1024) == "1,024 FLOP"
    assert units.seconds(1.5) == "1.500 s"
    assert units.seconds(0.0125) == "12.50 ms"
    assert units.seconds(80e-6) == "80.0 µs"
    assert units.ms(12_345_678) == "12.35 ms"
