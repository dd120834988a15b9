"""The rewrites themselves, as libcst transformations of one statement or one call.

The planner (``migrate.codemod``) decides *what* changes; these functions
take the exact source text of an import statement or a call, parse it with
libcst, change it, and give the code back. Whitespace, comments and
parentheses inside the statement or call survive as libcst keeps them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

_EMPTY = cst.Module([])
_NO_SPACE = cst.SimpleWhitespace("")
_SPACE = cst.SimpleWhitespace(" ")


def code(node: cst.CSTNode) -> str:
    return _EMPTY.code_for_node(node)


def _dotted(name: str) -> cst.Name | cst.Attribute:
    return cst.parse_expression(name)


def _as_name(name: str) -> cst.AsName:
    return cst.AsName(name=cst.Name(name), whitespace_before_as=_SPACE, whitespace_after_as=_SPACE)


def _small_statement(text: str):
    line = cst.parse_statement(text)
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
        raise ValueError(f"not a single simple statement: {text!r}")
    return line.body[0]


# -- imports -----------------------------------------------------------------


@dataclass
class NewAlias:
    """What one alias of an import statement becomes: its name, its ``as`` name, or removed."""

    name: str
    asname: str | None
    removed: bool = False
    position: int = 0  # the alias's place in the original statement


def rewrite_import(text: str, aliases: list[NewAlias], extra: list[str] = ()) -> str:
    """``import a as b, c`` with each alias replaced as given; ``extra`` module names appended."""
    node = _small_statement(text)
    assert isinstance(node, cst.Import)
    names = []
    for old, new in zip(node.names, aliases):
        if new.removed:
            continue
        asname = old.asname if new.asname and old.asname else (_as_name(new.asname) if new.asname else None)
        names.append(old.with_changes(name=_dotted(new.name), asname=asname))
    names += [cst.ImportAlias(name=_dotted(module)) for module in extra]
    return code(node.with_changes(names=_fix_commas(names)))


def rewrite_import_from(text: str, groups: list[tuple[str | None, list[NewAlias]]], joiner: str) -> str:
    """``from m import a, b`` split into one statement per new module.

    ``groups`` is ``[(module, aliases)]`` in order, module None for the original one; the first
    reuses the original statement and its aliases (parentheses, commas, comments), the others
    are new statements joined by ``joiner``.
    """
    node = _small_statement(text)
    assert isinstance(node, cst.ImportFrom)
    statements = []
    for i, (module, aliases) in enumerate(groups):
        where = {"module": node.module, "relative": node.relative} if module is None else \
            {"module": _dotted(module), "relative": ()}
        if isinstance(node.names, cst.ImportStar):
            statements.append(node.with_changes(**where))
            continue
        names = []
        for new in aliases:
            if new.removed:
                continue
            asname = _as_name(new.asname) if new.asname else None
            if i == 0:
                old = node.names[new.position]
                if old.asname is not None and new.asname == old.evaluated_alias:
                    asname = old.asname
                names.append(old.with_changes(name=cst.Name(new.name), asname=asname))
            else:
                names.append(cst.ImportAlias(name=cst.Name(new.name), asname=asname))
        if i == 0:
            statements.append(node.with_changes(names=_fix_commas(names, node.names[-1]), **where))
        else:
            statements.append(node.with_changes(names=_fix_commas(names), lpar=None, rpar=None, **where))
    return joiner.join(code(s) for s in statements)


def _fix_commas(names: list[cst.ImportAlias], original_last: cst.ImportAlias | None = None) -> list[cst.ImportAlias]:
    """Commas between aliases; a trailing comma only in the one-per-line style, where the closing
    parenthesis keeps the original last alias's indentation."""
    fixed = []
    for i, name in enumerate(names):
        last = i == len(names) - 1
        if last and isinstance(name.comma, cst.Comma) and not _has_newline(name.comma):
            name = name.with_changes(comma=cst.MaybeSentinel.DEFAULT)
        elif last and isinstance(name.comma, cst.Comma) and original_last is not None \
                and name is not original_last and isinstance(original_last.comma, cst.Comma) \
                and _has_newline(original_last.comma):
            closing = original_last.comma.whitespace_after.last_line
            name = name.with_changes(comma=name.comma.with_changes(
                whitespace_after=name.comma.whitespace_after.with_changes(last_line=closing)))
        elif not last and not isinstance(name.comma, cst.Comma):
            name = name.with_changes(comma=cst.Comma(whitespace_after=_SPACE))
        fixed.append(name)
    return fixed


def _has_newline(comma: cst.Comma) -> bool:
    return isinstance(comma.whitespace_after, cst.ParenthesizedWhitespace)


# -- calls -------------------------------------------------------------------


@dataclass
class ArgEdits:
    """Argument edits from a rule's ``args`` table."""

    signature: tuple[str, ...] = ()
    rename: dict[str, str] = field(default_factory=dict)
    drop: frozenset[str] = frozenset()
    strip_methods: frozenset[str] = frozenset()
    add: dict[str, str] = field(default_factory=dict)  # keyword -> expression, already spelled
    keywords: frozenset[str] = frozenset()  # parameters passed by keyword: a positional one is named

    @classmethod
    def from_rule(cls, args: dict, add: dict[str, str] | None = None) -> "ArgEdits":
        return cls(
            signature=tuple(args.get("signature", ())),
            rename=dict(args.get("rename", {})),
            drop=frozenset(args.get("drop", ())),
            strip_methods=frozenset(args.get("strip_methods", ())),
            add=add or {},
            keywords=frozenset(args.get("keywords", ())),
        )


def _parse_expression(text: str) -> cst.BaseExpression:
    """An expression as it stands in its context: a call spanning lines outside any bracket of its own
    (``f(\n)\n    .cuda()`` inside the caller's parentheses) parses when parenthesised, and is
    given back without those parentheses."""
    try:
        return cst.parse_expression(text)
    except cst.ParserSyntaxError:
        if "\n" not in text and "\r" not in text:
            raise
    node = cst.parse_expression("(" + text + ")")
    return node.with_changes(lpar=node.lpar[1:], rpar=node.rpar[:-1])


def rewrite_call(text: str, edits: ArgEdits, *, func: str | None = None, method: str | None = None,
                 first: str | None = None, column: int = 0) -> str:
    """Rewrite the call ``text``: a new callee (``func``) or method name (``method``),
    ``first`` inserted as the first positional argument, then ``edits`` applied.

    ``column`` is where the call starts on its line: arguments aligned under the opening
    parenthesis stay aligned when the callee's length changes.
    """
    call = _parse_expression(text)
    if not isinstance(call, cst.Call):
        raise ValueError(f"not a call: {text!r}")
    callee = call.func
    if func is not None:
        callee = _dotted(func).with_changes(lpar=callee.lpar, rpar=callee.rpar)
    if method is not None:
        callee = callee.with_changes(attr=cst.Name(method))
    args = _edit_args(list(call.args), edits, shifted=first is not None)
    if first is not None:
        args.insert(0, cst.Arg(cst.parse_expression(first)))
    present = {a.keyword.value for a in args if a.keyword is not None}
    args += [_keyword(k, v) for k, v in edits.add.items() if k not in present]
    args = _arg_commas(args, call.args)
    old_column, new_column = (column + len(code(f)) + 1 for f in (call.func, callee))
    if old_column != new_column:
        args = [_realign(a, old_column, new_column) for a in args]
    return code(call.with_changes(func=callee, args=args))


def _realign(arg: cst.Arg, old_column: int, new_column: int) -> cst.Arg:
    """Move the argument after ``arg``'s comma from ``old_column`` to ``new_column`` if it was aligned there."""
    comma = arg.comma
    if not (isinstance(comma, cst.Comma) and isinstance(comma.whitespace_after, cst.ParenthesizedWhitespace)):
        return arg
    space = comma.whitespace_after.last_line.value
    if space != " " * old_column:
        return arg
    last_line = cst.SimpleWhitespace(" " * new_column)
    return arg.with_changes(comma=comma.with_changes(
        whitespace_after=comma.whitespace_after.with_changes(last_line=last_line)))


def _edit_args(args: list[cst.Arg], edits: ArgEdits, shifted: bool) -> list[cst.Arg]:
    kept: list[cst.Arg] = []
    position, positional_ok = 0, not shifted
    for arg in args:
        if arg.star:  # *args/**kwargs: positions after it are unknown
            kept.append(arg)
            positional_ok, position = False, len(edits.signature)
            continue
        if arg.keyword is None:
            param = edits.signature[position] if position < len(edits.signature) else None
            if position == 0 and edits.strip_methods:
                arg = arg.with_changes(value=_strip(arg.value, edits.strip_methods))
            position += 1
        else:
            param = arg.keyword.value
        if param in edits.drop:
            positional_ok = False
            continue
        new = edits.rename.get(param, param) if param else None
        if arg.keyword is not None:
            if new != param:
                arg = arg.with_changes(keyword=cst.Name(new))
        elif new is not None and (not positional_ok or new != param or new in edits.keywords):
            # an earlier argument left, so positions no longer line up: name it
            arg = _keyword(new, arg.value).with_changes(comma=arg.comma)
            positional_ok = False
        kept.append(arg)
    return kept


def _strip(value: cst.BaseExpression, methods: frozenset[str]) -> cst.BaseExpression:
    """``x.contiguous().float()`` -> ``x`` for methods in ``methods`` called without arguments."""
    while (isinstance(value, cst.Call) and not value.args and isinstance(value.func, cst.Attribute)
           and value.func.attr.value in methods):
        value = value.func.value
    return value


def _keyword(name: str, value: str | cst.BaseExpression) -> cst.Arg:
    if isinstance(value, str):
        value = cst.parse_expression(value)
    return cst.Arg(value=value, keyword=cst.Name(name),
                   equal=cst.AssignEqual(whitespace_before=_NO_SPACE, whitespace_after=_NO_SPACE))


def _arg_commas(args: list[cst.Arg], original: list[cst.Arg]) -> list[cst.Arg]:
    """Commas between arguments in the call's own style: new separators copy the one between its
    last two arguments (a line break and indent if it had one); the last argument keeps the
    original last argument's trailing comma, or none."""
    last_comma = original[-1].comma if original else cst.MaybeSentinel.DEFAULT
    separator = original[-2].comma if len(original) >= 2 and isinstance(original[-2].comma, cst.Comma) \
        else cst.Comma(whitespace_after=_SPACE)
    fixed = []
    for i, arg in enumerate(args):
        if i == len(args) - 1:
            arg = arg.with_changes(comma=last_comma)
        elif not isinstance(arg.comma, cst.Comma) or arg.comma is last_comma:
            arg = arg.with_changes(comma=separator)
        fixed.append(arg)
    return fixed


def receiver_as_argument(text: str, func: str) -> str:
    """``x.m(a, ...)`` becomes ``func(x, a, ...)``: the method's receiver is passed to a function instead."""
    call = _parse_expression(text)
    if not isinstance(call, cst.Call) or not isinstance(call.func, cst.Attribute):
        raise ValueError(f"not a method call: {text!r}")
    receiver = call.func.value
    first = cst.Arg(receiver, comma=cst.Comma(whitespace_after=_SPACE)) if call.args else cst.Arg(receiver)
    return code(call.with_changes(func=_dotted(func), args=[first, *call.args]))
