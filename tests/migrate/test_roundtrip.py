"""Untouched bytes stay untouched: comment and blank lines added anywhere between logical lines
come out verbatim and in place, and the rewrites around them are the same as without them."""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

GOLDEN = sorted((Path(__file__).parent / "fixtures" / "golden").glob("*.in.py"))


def _boundaries(source: str) -> list[int]:
    """Line numbers after which a whole comment line may go (not inside a string or brackets)."""
    ends = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.NEWLINE, tokenize.NL, tokenize.COMMENT) and token.start[0] == token.end[0]:
            ends.add(token.start[0])
    lines = source.splitlines(keepends=True)
    # a comment line must not split a bracketed expression: keep ends whose next line is not a continuation
    depth, safe = 0, []
    for number, line in enumerate(lines, start=1):
        depth += sum(line.count(c) for c in "([{") - sum(line.count(c) for c in ")]}")
        if number in ends and depth == 0:
            safe.append(number)
    return safe


comment_text = st.text(st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), max_size=30)
MARK = "# inserted "


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=st.sampled_from(GOLDEN), data=st.data())
def test_inserted_lines_survive_verbatim(case, data, migrate):
    source = case.read_text(encoding="utf-8")
    positions = data.draw(st.lists(st.sampled_from(_boundaries(source)), max_size=5, unique=True))
    inserts = {p: f"{' ' * data.draw(st.integers(0, 8))}{MARK}{i}: {data.draw(comment_text)}\n"
               for i, p in enumerate(positions)}
    lines = source.splitlines(keepends=True)
    padded = "".join(line + inserts.get(number, "") for number, line in enumerate(lines, start=1))
    name = case.name.replace(".in.py", ".py")
    expected, _ = migrate(source, name)
    migrated, report = migrate(padded, name)
    assert report.error is None
    ours = [line for line in migrated.splitlines(keepends=True) if MARK in line]
    assert ours == [line for line in padded.splitlines(keepends=True) if MARK in line]
    # without the inserted lines, the result is exactly the migration of the original
    assert "".join(line for line in migrated.splitlines(keepends=True) if MARK not in line) == expected
