"""The app's one JSON policy (task_app/core/json_codec.py, docs/decisions/json.md): orjson, the standard
library for what orjson refuses, a strict read for request bodies."""

from __future__ import annotations

import dataclasses
import json
import math
import tracemalloc
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest

from task_app.core.json_codec import JSONDecodeError, dumps, dumps_bytes, loads, raw_decode


def test_writes_compact_utf8_in_insertion_order() -> None:
    value = {"b": [1, 2.5, None, True, "é😀\n\u2028"], "a": {"c": -0.0}}
    assert dumps(value) == '{"b":[1,2.5,null,true,"é😀\\n\u2028"],"a":{"c":-0.0}}'
    assert dumps_bytes(value) == dumps(value).encode("utf-8")
    assert loads(dumps(value)) == value


@pytest.mark.parametrize(
    ("value", "read_back"),
    [
        ({"big": 10**30}, {"big": 10**30}),  # beyond 64 bits
        ({1: "int key"}, {"1": "int key"}),
        ("\ud800", "\ud800"),  # a lone surrogate
        ({"é": 2**64, "ok": 1e-05}, {"é": 2**64, "ok": 1e-05}),
    ],
    ids=["big-int", "int-key", "lone-surrogate", "non-ascii-beside"],
)
def test_what_orjson_refuses_is_written_by_the_stdlib(value: Any, read_back: Any) -> None:
    text = dumps(value)
    assert text.isascii()  # non-ASCII escaped: the only valid UTF-8 form of a lone surrogate
    assert dumps_bytes(value) == text.encode("ascii")
    assert json.loads(text) == read_back


def test_nan_and_infinity_are_written_as_null() -> None:
    text = dumps({"nan": math.nan, "inf": [math.inf, -math.inf]})
    assert text == '{"nan":null,"inf":[null,null]}'
    assert loads(text, strict=True) == {"nan": None, "inf": [None, None]}


def test_numpy_values_are_written_as_numbers_and_lists() -> None:
    value = {"grid": np.arange(4, dtype=np.uint8).reshape(2, 2), "x": np.float32(1.5), "n": np.int64(7)}
    assert dumps(value) == '{"grid":[[0,1],[2,3]],"x":1.5,"n":7}'


@dataclasses.dataclass
class _Point:
    x: int


def test_datetimes_and_dataclasses_go_through_default_as_with_the_stdlib() -> None:
    moment = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert dumps({"at": moment, "p": _Point(1)}, default=repr) == json.dumps(
        {"at": moment, "p": _Point(1)}, default=repr, separators=(",", ":")
    )
    with pytest.raises(TypeError):
        dumps({"at": moment})
    with pytest.raises(TypeError):
        dumps_bytes(_Point(1))


def test_pretty_is_indented_by_two() -> None:
    assert dumps({"a": [1]}, pretty=True) == '{\n  "a": [\n    1\n  ]\n}'
    assert dumps({1: [1]}, pretty=True) == '{\n  "1": [\n    1\n  ]\n}'  # the stdlib's path, the same layout


@pytest.mark.parametrize(
    "text",
    [
        '{"actions": ["move_left", "do"], "n": -0, "x": -0.0, "f": 2.5e-7}',
        '{"logprob": -0.00012345678901234567, "big": 12345678901234567890.5}',
        '{"id": "call_12345678901234567890"}',
        "-Infinity",  # a model server's logprob: read, for the token checks to refuse precisely
        "NaN",
        "1e400",
        '"\\ud800"',
        b'\xef\xbb\xbf{"a": 1}',
    ],
)
@pytest.mark.parametrize("as_bytes", [False, True], ids=["text", "bytes"])
def test_reads_what_the_stdlib_reads(text: str | bytes, as_bytes: bool) -> None:
    data = text.encode() if as_bytes and isinstance(text, str) else text
    assert repr(loads(data)) == repr(json.loads(data))


def test_integers_beyond_64_bits_are_read_as_floats() -> None:
    """orjson's rule, documented: nothing the app reads carries one (seeds stay below 2**63)."""
    assert loads(str(2**64 - 1)) == 2**64 - 1
    assert isinstance(loads(str(2**64)), float)


@pytest.mark.parametrize("text", ["[1,]", '{"a": }', "", '"\x01"', "\ufeff{}"])
def test_invalid_json_raises_the_stdlibs_error(text: str) -> None:
    with pytest.raises(json.JSONDecodeError) as expected:
        json.loads(text)
    with pytest.raises(JSONDecodeError) as refused:
        loads(text)
    assert str(refused.value) == str(expected.value)


@pytest.mark.parametrize(
    "text", ["NaN", '{"x": Infinity}', "1e400", '"\\ud800"', "[" * 1100 + "]" * 1100, "[1,]", b"\xff"]
)
def test_strict_reads_only_i_json(text: str | bytes) -> None:
    with pytest.raises(json.JSONDecodeError):
        loads(text, strict=True)


def test_raw_decode_finds_a_value_inside_text() -> None:
    text = 'I will call {"actions": ["do"]} now'
    assert raw_decode(text, text.index("{")) == ({"actions": ["do"]}, text.index(" now"))
    with pytest.raises(JSONDecodeError):
        raw_decode(text, 0)


def test_the_bytes_hold_no_more_memory_than_their_content() -> None:
    """orjson's own bytes keep a buffer of at least 4 KB; a store holding thousands of small values
    (an env's log entries) held 4 KB for each."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [dumps_bytes({"op": "step", "a": ["noop"], "t": 1.5}) for _ in range(1000)]
        held = (tracemalloc.get_traced_memory()[0] - before) / len(kept)
    finally:
        tracemalloc.stop()
    assert held < 256, held
