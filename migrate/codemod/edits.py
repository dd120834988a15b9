"""Edits by source offset: every untouched byte stays as it was, by construction.

``splice`` applies :class:`Edit` s (a span and how to render it, nested edits first);
:class:`Lines` turns ``ast`` positions (UTF-8 byte columns) into offsets into the text.
"""

from __future__ import annotations

import ast
import io
from dataclasses import dataclass, field
from typing import Callable


class RewriteError(Exception):
    """libcst could not take a statement or call the plan asked to rewrite."""


@dataclass(eq=False)
class Edit:
    start: int
    end: int
    render: Callable[[str], str]  # the span's text (inner edits applied) -> its replacement
    children: list["Edit"] = field(default_factory=list)

    def contains(self, other: "Edit") -> bool:
        if other.start == other.end and other.start in (self.start, self.end):
            return False  # an insertion at a boundary is beside a span, not in it
        return self.start <= other.start and other.end <= self.end


def splice(source: str, edits: list[Edit]) -> str:
    """Apply edits by offset, inner edits first; text outside every edit is copied as it is."""
    roots: list[Edit] = []
    stack: list[Edit] = []
    for edit in sorted(edits, key=lambda e: (e.start, e.start != e.end, -e.end)):
        while stack and not stack[-1].contains(edit):
            stack.pop()
        siblings = stack[-1].children if stack else roots
        if siblings and edit.start < siblings[-1].end:  # overlapping without nesting: a planning bug
            raise RewriteError(f"overlapping rewrites at offset {edit.start}")
        siblings.append(edit)
        stack.append(edit)

    def render(start: int, end: int, children: list[Edit]) -> str:
        out, position = [], start
        for child in children:
            out.append(source[position:child.start])
            out.append(child.render(render(child.start, child.end, child.children)))
            position = child.end
        out.append(source[position:end])
        return "".join(out)

    return render(0, len(source), roots)


class Lines:
    """Offsets into the source for ``ast`` positions (whose columns count UTF-8 bytes)."""

    def __init__(self, source: str):
        self.lines = io.StringIO(source, newline="").readlines()
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))
        first = self.lines[0] if self.lines else "\n"
        self.newline = "\r\n" if first.endswith("\r\n") else "\r" if first.endswith("\r") else "\n"

    def offset(self, lineno: int, col: int) -> int:
        line = self.lines[lineno - 1] if lineno <= len(self.lines) else ""
        if not line.isascii():
            col = len(line.encode("utf-8")[:col].decode("utf-8", "replace"))
        return self.starts[lineno - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset)

    def column(self, node: ast.AST) -> int:
        """Where ``node`` starts on its line, in characters."""
        return self.offset(node.lineno, node.col_offset) - self.starts[node.lineno - 1]

    def line_start(self, lineno: int) -> int:
        return self.starts[min(lineno, len(self.starts)) - 1]
