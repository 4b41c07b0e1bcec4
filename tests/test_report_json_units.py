"""The report JSON validator's small types, one by one, against hand-written expectations: each value either fits
(``None``) or gives the exact ``(field path, problem)`` pair that ends up in the one-line error."""

from __future__ import annotations

import math

import pytest

from hf_tdiag.diagnostics.report_json import (
    ANY,
    BOOL,
    INT,
    NUM,
    NUMBERS,
    STR,
    Choice,
    ListOf,
    MapOf,
    Nullable,
    Obj,
    ReportFormatError,
    check_report,
    report_error,
    stamp,
)

LONG = "x" * 70

# (id, spec (built in the test, not at import), value, expected problem or None)
CASES = [
    ("any: anything", lambda: ANY, object(), None),
    ("num: int", lambda: NUM, 3, None),
    ("num: float", lambda: NUM, 2.5, None),
    ("num: nan", lambda: NUM, math.nan, None),
    ("num: bool", lambda: NUM, True, ("f", "expected a number, got True")),
    ("num: str", lambda: NUM, "1", ("f", "expected a number, got '1'")),
    ("num: None", lambda: NUM, None, ("f", "expected a number, got None")),
    ("int: int", lambda: INT, 3, None),
    ("int: 3.0", lambda: INT, 3.0, None),
    ("int: 2.5", lambda: INT, 2.5, ("f", "expected an integer, got 2.5")),
    ("int: inf", lambda: INT, math.inf, ("f", "expected an integer, got inf")),
    ("int: bool", lambda: INT, False, ("f", "expected an integer, got False")),
    ("int: str", lambda: INT, "3", ("f", "expected an integer, got '3'")),
    ("str: str", lambda: STR, "a", None),
    ("str: int", lambda: STR, 1, ("f", "expected a string, got 1")),
    ("bool: bool", lambda: BOOL, False, None),
    ("bool: 0", lambda: BOOL, 0, ("f", "expected true or false, got 0")),
    ("a long value is cut", lambda: STR, [LONG], ("f", f"expected a string, got {repr([LONG])[:57]}...")),
    ("a value of 60 characters is whole", lambda: STR, ["y" * 56], ("f", f"expected a string, got {['y' * 56]!r}")),
    ("a value of 61 characters is cut", lambda: STR, ["y" * 57], ("f", f"expected a string, got {repr(['y' * 57])[:57]}...")),
    ("choice: in", lambda: Choice("a", "b"), "b", None),
    ("choice: out", lambda: Choice("a", "b"), "c", ("f", "expected one of ['a', 'b'], got 'c'")),
    ("nullable: None", lambda: Nullable(NUM), None, None),
    ("nullable: fits", lambda: Nullable(NUM), 1.5, None),
    ("nullable: wrong", lambda: Nullable(NUM), "x", ("f", "expected a number or null, got 'x'")),
    ("nullable list: inner path kept", lambda: Nullable(ListOf(NUM)), [1, "x"], ("f[1]", "expected a number, got 'x'")),
    ("nullable list: not a list", lambda: Nullable(ListOf(NUM)), 3, ("f", "expected a list of numbers or null, got 3")),
    ("list: fits", lambda: ListOf(INT), [1, 2], None),
    ("list: empty", lambda: ListOf(INT), [], None),
    ("list: not a list", lambda: ListOf(INT), (1, 2), ("f", "expected a list of integers, got (1, 2)")),
    ("list: bad item", lambda: ListOf(INT), [1, "2"], ("f[1]", "expected an integer, got '2'")),
    ("list: first bad item named", lambda: ListOf(INT), ["a", "b"], ("f[0]", "expected an integer, got 'a'")),
    ("list: length", lambda: ListOf(INT, length=2), [1, 2, 3], ("f", "expected 2 entries, got 3")),
    ("list: length fits", lambda: ListOf(INT, length=2), [1, 2], None),
    ("list of lists", lambda: ListOf(ListOf(NUM)), [[1], [2, "z"]], ("f[1][1]", "expected a number, got 'z'")),
    ("numbers: nested", lambda: NUMBERS, [[1, None], [True, 2.5]], None),
    ("numbers: not a list", lambda: NUMBERS, 3, ("f", "expected a list of numbers, got 3")),
    ("numbers: a string deep", lambda: NUMBERS, [[1], [2, "q"]], ("f[1][1]", "expected a number, got 'q'")),
    ("numbers: a dict", lambda: NUMBERS, [{}], ("f[0]", "expected a number, got {}")),
    ("numbers: flat string", lambda: NUMBERS, ["s", 1], ("f[0]", "expected a number, got 's'")),
    ("map: fits", lambda: MapOf(NUM), {"a": 1}, None),
    ("map: not a dict", lambda: MapOf(NUM), [1], ("f", "expected an object, got [1]")),
    ("map: bad value", lambda: MapOf(NUM), {"a": 1, "b": "x"}, ("f.b", "expected a number, got 'x'")),
    ("map: required key", lambda: MapOf(NUM, keys=("a", "b")), {"a": 1}, ("f.b", "missing")),
    ("map: keys present", lambda: MapOf(NUM, keys=("a",)), {"a": 1, "c": 2}, None),
    ("obj: fits", lambda: Obj({"a": INT}), {"a": 1, "extra": "kept"}, None),
    ("obj: missing", lambda: Obj({"a": INT, "b": INT}), {"a": 1}, ("f.b", "missing")),
    ("obj: wrong", lambda: Obj({"a": INT}), {"a": "1"}, ("f.a", "expected an integer, got '1'")),
    ("obj: optional absent", lambda: Obj({}, optional={"o": INT}), {}, None),
    ("obj: optional wrong", lambda: Obj({}, optional={"o": INT}), {"o": "x"}, ("f.o", "expected an integer, got 'x'")),
    ("obj: required before optional", lambda: Obj({"a": INT}, optional={"o": INT}), {"a": "x", "o": "y"}, ("f.a", "expected an integer, got 'x'")),
    ("obj: not a dict", lambda: Obj({}), [], ("f", "expected an object, got []")),
]  # fmt: skip


@pytest.mark.parametrize("case, spec, value, expected", CASES, ids=[c[0] for c in CASES])
def test_spec(case, spec, value, expected):
    assert spec().problem(value, "f") == expected


def test_paths_at_the_top_level_have_no_leading_dot():
    assert Obj({"a": INT}).problem({}, "") == ("a", "missing")
    assert Obj({}).problem(3, "") == ("(top level)", "expected an object, got 3")
    assert MapOf(INT).problem({"k": "v"}, "") == ("k", "expected an integer, got 'v'")
    assert MapOf(INT, keys=("k",)).problem({}, "") == ("k", "missing")
    assert Obj({}, optional={"o": INT}).problem({"o": None}, "") == ("o", "expected an integer, got None")


SCHEMA = Obj({"x": NUM})


def test_check_report_versions_and_kinds():
    assert stamp("R", 3) == {"kind": "R", "format_version": 3}
    assert check_report({"x": 1}, "R", SCHEMA, 2) == 1  # no version: format 1
    assert check_report({"x": 1, "format_version": 2, "kind": "R"}, "R", SCHEMA, 2) == 2
    cases = [
        ({"x": 1, "format_version": 3}, "R JSON: field 'format_version': 3 is newer than this hf-tdiag reads (2); "
                                        "upgrade hf-tdiag"),
        ({"x": 1, "format_version": 0}, "R JSON: field 'format_version': expected a positive integer, got 0"),
        ({"x": 1, "format_version": True}, "R JSON: field 'format_version': expected a positive integer, got True"),
        ({"x": 1, "format_version": 1.0}, "R JSON: field 'format_version': expected a positive integer, got 1.0"),
        ({"x": 1, "kind": "S"}, "R JSON: field 'kind': this is the JSON of 'S', not of R; read it with that class"),
        ({"x": "a"}, "R JSON: field 'x': expected a number, got 'a'"),
        ({}, "R JSON: field 'x': missing"),
        ({"x": 1, "m": "other"}, "R JSON: field 'm': expected 'mine', got 'other'"),
    ]  # fmt: skip
    for data, message in cases:
        with pytest.raises(ReportFormatError) as info:
            check_report(data, "R", SCHEMA, 2, measure=("m", "mine"))
        assert str(info.value) == message
    assert check_report({"x": 1, "m": "mine"}, "R", SCHEMA, 2, measure=("m", "mine")) == 1
    with pytest.raises(ReportFormatError, match=r"^R JSON: expected a JSON object, got list$"):
        check_report([1], "R", SCHEMA, 2)
    assert str(report_error("K", "a.b", "missing")) == "K JSON: field 'a.b': missing"
    assert issubclass(ReportFormatError, ValueError)
