"""Edits are applied by offset: inner edits first, insertions beside spans, overlaps refused."""

import pytest

from migrate.codemod import Edit as _Edit
from migrate.codemod import RewriteError, splice


def test_nested_edits_render_inside_out_and_insertions_stay_beside():
    edits = [_Edit(1, 3, lambda text: f"[{text}]"), _Edit(2, 3, lambda _: "X"), _Edit(3, 3, lambda _: "+")]
    assert splice("abcdef", edits) == "a[bX]+def"


def test_untouched_text_is_copied():
    assert splice("a\r\nb\tc", []) == "a\r\nb\tc"


def test_overlapping_edits_are_refused():
    with pytest.raises(RewriteError, match="overlapping"):
        splice("abcdef", [_Edit(1, 3, str), _Edit(2, 5, str)])
