"""Spelling: every dotted name rooted at an import (``torch.cuda.synchronize``, ``amp_C``) is
respelled where its rule maps it elsewhere than the rewritten import already does, or reported
where its rule says it stays (``unsupported``, ``report``)."""

from __future__ import annotations

from migrate.codemod.context import FileContext
from migrate.kinds import Kind
from migrate.rules import mapped_name


class ReferenceRewrites:
    def __init__(self, ctx: FileContext):
        self.ctx = ctx

    def plan(self) -> None:
        ctx = self.ctx
        calls = ctx.rules.by_kind[Kind.CALL]
        for chain in ctx.scopes.chains:
            if id(chain.node) in ctx.handled:
                continue
            resolved = ctx.resolve(chain)
            if resolved is None:
                continue
            binding, name = resolved
            canonical, re_exported = ctx.index.canonical(name)
            line = chain.node.lineno
            if ctx.index.is_tree_name(canonical):
                call_rule = calls.get(canonical)
                if call_rule is not None and not ctx.defines(canonical, call_rule):
                    ctx.leave(line, call_rule, f"used as a value, not called: not rewritten; {call_rule.note}")
                continue
            if re_exported:
                continue  # the tree module re-exporting it is migrated itself
            rule = ctx.rules.best(canonical)
            if rule is None:
                continue
            if rule.spec.reported:
                ctx.leave(line, rule)
                continue
            wanted = mapped_name(rule, canonical)
            current = ctx.new_source[binding] + name[len(binding.source):]
            before = chain.dotted
            if wanted == current:
                if rule is not ctx.rules.best(binding.source):
                    ctx.change(line, rule, before, before, wanted)
                continue
            if chain.in_fstring:
                ctx.leave(line, rule, f"inside an f-string: not rewritten; {rule.note}")
                continue
            spelled = ctx.spell(wanted, chain.scope, line, prefer=chain.parts[0])
            ctx.consume(chain.root.id, rule.code)
            ctx.change(line, rule, before, spelled, wanted)
            ctx.edit(chain.node, lambda _text, spelled=spelled: spelled)
