"""The declarative Kineto argument vocabulary (traceroof.parsers.kineto_vocab) is what the
decoder and the column builder actually use."""

from __future__ import annotations

import msgspec
import polars as pl
from conftest import kineto

from traceroof.parsers import kineto as K
from traceroof.parsers import kineto_vocab as V
from traceroof.parsers.kineto_decode import decode
from traceroof.parsers.kineto_events import Args


def test_args_struct_is_the_table():
    info = msgspec.inspect.type_info(Args)
    want = [(f, sp.raw) for a in V.ARGS for f, sp in zip(a.fields(), a.spellings)]
    assert [(f.name, f.encode_name) for f in info.fields] == want
    kinds = {V.NUMBER: msgspec.inspect.UnionType, V.JSON_TEXT: msgspec.inspect.RawType,
             V.ANY: msgspec.inspect.AnyType}
    by_raw = {f.encode_name: f for f in info.fields}
    for a in V.ARGS:
        for sp in a.spellings:
            assert isinstance(by_raw[sp.raw].type, kinds[a.value]), sp.raw


def test_columns_name_known_args_once():
    for cols in (V.DEVICE_ARG_COLUMNS, V.HOST_ARG_COLUMNS):
        assert len({c.column for c in cols}) == len(cols)
        for c in cols:
            assert c.arg in V.ARG_BY_KEY and c.dtype in (V.INT64, V.INT32, V.STRING, V.TEXT)
    assert len(V.ARG_BY_KEY) == len(V.ARGS)
    raws = [sp.raw for a in V.ARGS for sp in a.spellings]
    assert len(set(raws)) == len(raws)
    assert not [n for n in dir(V) if n.startswith("ARG_") and n != "ARG_BY_KEY"]


def test_every_spelling_reaches_its_column():
    """Each spelling of each column's argument, alone on an event, lands in that column."""
    for table, cat, frame in ((V.DEVICE_ARG_COLUMNS, "kernel", "dev"), (V.HOST_ARG_COLUMNS, "cpu_op", "host")):
        for col in table:
            arg = V.ARG_BY_KEY[col.arg]
            for sp in arg.spellings:
                value = [[2, 3]] if arg.value == V.JSON_TEXT else (7 if col.dtype != V.STRING else "x")
                ev = {"ph": "X", "cat": cat, "name": "e", "pid": 1, "tid": 1, "ts": 0, "dur": 1,
                      "args": {sp.raw: value}}
                b = K._Builder("v.json")
                decode(kineto([ev]), b.add_chunk)
                df = pl.concat(b.dev_frames if frame == "dev" else b.host_frames)
                got = df[col.column][0]
                want = "[[2, 3]]" if arg.value == V.JSON_TEXT else value
                assert got == want, (col.column, sp.raw, got)
