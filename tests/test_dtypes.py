"""traceroof.dtypes: one table per vocabulary, consistent with each other."""

from __future__ import annotations

import pytest

from traceroof import chips, dtypes
from traceroof.costs.args import dtype_of, dtype_of_scalar_type, nbytes
from traceroof.errors import UsageError


@pytest.mark.parametrize(("spelling", "peak"), [
    ("torch.bfloat16", "bf16"), ("c10::Half", "fp16"), ("float", "fp32"), ("f8e4m3fn", "fp8"),
    ("uint8", "int8"), ("TF32", "tf32"), ("jnp.float64", "fp64"), ("nvfp4", "fp4"),
    ("int64", None), ("no-such", None),
])
def test_canonical_dtype_is_the_peak_key(spelling, peak):
    assert dtypes.canonical_dtype(spelling) == peak
    assert chips.canonical_dtype is dtypes.canonical_dtype  # one function, two doors


def test_every_peak_spelling_names_a_peak_key():
    assert set(dtypes.PEAK_ALIASES.values()) == set(dtypes.PEAK_DTYPES)
    assert all(dtypes.PEAK_ALIASES[d] == d for d in dtypes.PEAK_DTYPES)


def test_weight_bytes_accept_any_spelling_of_a_weight_dtype():
    assert dtypes.weight_bytes_per_element("bfloat16") == 2.0
    assert dtypes.weight_bytes_per_element("fp8_e4m3") == 1.0
    assert dtypes.weight_bytes_per_element("int4") == 0.5
    with pytest.raises(UsageError, match="expected one of fp64, fp32, tf32, bf16, fp16, fp8, int8, int4, fp4"):
        dtypes.weight_bytes_per_element("int64")


def test_torch_tables_agree_with_the_item_sizes():
    for dt in set(dtypes.TORCH_TYPE_TO_DTYPE.values()) | set(dtypes.SCALAR_TYPE_CODE.values()):
        assert dt in dtypes.ITEMSIZE and dt in dtypes.PROMOTION_RANK, dt
    assert dtype_of("c10::BFloat16") == "bf16" and dtype_of_scalar_type("15") == "bf16"
    assert nbytes((16, 1024), "bf16") == 32768.0
    assert dtypes.itemsize("complex128") == 16
    with pytest.raises(UsageError, match="unknown dtype 'q4'"):
        dtypes.itemsize("q4")


def test_xla_names_have_sizes_that_match_their_traceroof_dtype():
    for xla, dt in dtypes.XLA_DTYPES.items():
        if dt in dtypes.ITEMSIZE:
            assert dtypes.XLA_ITEMSIZE[xla] == dtypes.ITEMSIZE[dt], xla


def test_collective_dtype_bytes_of_every_spelling_record_param_comms_writes():
    from traceroof.parsers.kineto_vocab import COLL_DTYPE_BYTES

    # c10::ScalarType element sizes (c10/core/ScalarType.h), by the names toString() gives
    assert COLL_DTYPE_BYTES == {
        "Float": 4, "float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Int": 4, "Long": 8,
        "Char": 1, "Byte": 1, "Bool": 1, "Short": 2, "Float8_e4m3fn": 1, "Float8_e5m2": 1,
        "Int8": 1, "UInt8": 1,
    }


def test_chip_table_columns_are_peak_keys_low_precision_first():
    assert dtypes.CHIP_TABLE_DTYPES == ("fp8", "bf16", "fp16", "tf32", "fp32")
    assert set(dtypes.LOW_PRECISION_FIRST) <= set(dtypes.PEAK_DTYPES)
