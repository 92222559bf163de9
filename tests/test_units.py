"""The sentence helpers every layer shares: an error's line, a percentage, a duration, what a
throughput counts."""

import pytest

from stepbench.errors import first_line
from stepbench.units import common_unit, duration, percent, unit_of


def test_first_line_is_the_first_or_last_non_empty_line_stripped_and_cut():
    text = "\n  RuntimeError: boom  \ntraceback line\n  last words \n\n"
    assert first_line(text) == "RuntimeError: boom"
    assert first_line(text, last=True) == "last words"
    assert first_line("x" * 30, limit=10) == "xxxxxxx..."
    assert len(first_line("x" * 300)) == 200
    assert first_line(None) == first_line("") == first_line(" \n \n") == ""


@pytest.mark.parametrize("fraction, text", [(0.0212, "2.1%"), (0.00019, "0.019%"),
                                            (0.05, "5%"), (0.999, "100%"), (1.05, "105%"),
                                            (12.0, "1,200%"), (None, "?")])
def test_percent_has_two_significant_digits_and_no_exponent(fraction, text):
    assert percent(fraction) == text


@pytest.mark.parametrize("seconds, rough, exact", [(71, "71 s", "1 min 11 s"),
                                                   (1092, "18 min", "18 min 12 s"),
                                                   (11160, "3.1 h", "186 min 0 s"),
                                                   (45, "45 s", "45 s")])
def test_duration_rounds_as_a_reader_does_or_to_the_second(seconds, rough, exact):
    assert duration(seconds) == rough and duration(seconds, exact=True) == exact


def test_one_workloads_unit_is_the_first_named_and_rows_share_one_or_none():
    # A transformers model's records name no unit: tokens.
    assert unit_of(None) == unit_of() == "tokens"
    assert unit_of(None, "images", "samples") == "images"
    assert common_unit([]) == common_unit([None, "tokens"]) == "tokens"
    assert common_unit(["images", "images"]) == "images"
    assert common_unit([None, "images"]) is None and common_unit(["samples", "images"]) is None


def test_the_headers_name_a_shared_unit_keep_tokens_and_say_units_for_several():
    from stepbench.report.columns import unit_columns

    columns = ["Setup", "Tokens/s", "M tokens per $", "Tokens/s per GPU"]
    assert unit_columns(columns, "images") == ["Setup", "Images/s", "M images per $",
                                               "Images/s per GPU"]
    assert unit_columns(columns, "tokens") == columns
    assert unit_columns(columns, None) == ["Setup", "Units/s", "M units per $", "Units/s per GPU"]
