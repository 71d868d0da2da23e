"""The listings a notebook shows: the source as it is, or a clear error once it no longer matches."""

import inspect

import pytest

from qwenvl_lab.course.listing import excerpt, show_source
from qwenvl_lab.fake_ids import make_fake_prompt_ids


def test_show_source_prints_the_whole_function_or_the_lines_between_two_markers(capsys):
    show_source(make_fake_prompt_ids)
    whole = capsys.readouterr().out
    assert whole.startswith("def make_fake_prompt_ids(") and "return torch.arange" in whole
    show_source(make_fake_prompt_ids, "return torch.arange")
    assert capsys.readouterr().out.lstrip().startswith("return torch.arange")
    show_source(make_fake_prompt_ids, "def make_fake_prompt_ids(", '"""')
    first_lines = capsys.readouterr().out.splitlines()
    assert first_lines[0].startswith("def make_fake_prompt_ids(") and len(first_lines) < len(whole.splitlines())


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: show_source(make_fake_prompt_ids, "no such line"), "holds 'no such line'"),
        (lambda: show_source(make_fake_prompt_ids, "def make_fake_prompt_ids(", "no such end"), "holds 'no such end'"),
        (lambda: excerpt(make_fake_prompt_ids, "return torch.zeros\n"), "no longer matches"),
    ],
)
def test_a_listing_that_no_longer_matches_the_source_is_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_excerpt_prints_parts_found_in_the_source(capsys):
    lines = inspect.getsource(make_fake_prompt_ids).splitlines(keepends=True)
    text = lines[0] + "…\n" + lines[-1]  # the first and the last line, what lies between left out
    excerpt(make_fake_prompt_ids, text)
    assert capsys.readouterr().out == text
