"""Call sites: ``call`` rules (callee and arguments), ``argument`` rules (a call passed as a keyword
value) and ``method`` rules (``x.cuda()``), each rewritten as one libcst transformation of the call.

Which rule kinds apply at a call site is the kind table's (``migrate.kinds``): kinds matched on the
callee's resolved name are tried in table order, then kinds matched on the method name.
"""

from __future__ import annotations

import ast
import re

from migrate.codemod.context import FileContext
from migrate.kinds import Kind, Site
from migrate.rewrite import ArgEdits, receiver_as_argument, rewrite_call
from migrate.rules import Rule, mapped_name
from migrate.scopes import Chain, Scope, dotted_parts

_TEMPLATE = re.compile(r"\{([A-Za-z_][\w.]*)\}")


class CallRewrites:
    def __init__(self, ctx: FileContext):
        self.ctx = ctx
        # kind -> (does the rule apply to this call?, its planner); one entry per kind whose site is a call
        self.planners = {
            Kind.CALL: (self._call_applies, self._call),
            Kind.ARGUMENT: (self._argument_applies, self._argument),
            Kind.METHOD: (None, self._method),
        }

    def plan(self) -> None:
        ctx = self.ctx
        by_callee, by_method = ctx.rules.kinds_at(Site.CALLEE), ctx.rules.kinds_at(Site.METHOD)
        for call, scope in ctx.scopes.calls:
            found = dotted_parts(call.func)
            if found is not None:
                chain = Chain(call.func, found[0], found[1], scope)
                resolved = ctx.resolve(chain)
                if resolved is not None:
                    canonical = ctx.index.canonical(resolved[1])[0]
                    if canonical == "importlib.import_module":
                        self._import_module_call(call)
                        continue
                    if self._plan_callee(call, chain, canonical, by_callee):
                        continue
            if isinstance(call.func, ast.Attribute):
                found = next(((kind, ctx.rules.by_kind[kind][call.func.attr]) for kind in by_method
                              if call.func.attr in ctx.rules.by_kind[kind]), None)  # fmt: skip
                if found is not None and not self._is_library_name(call.func.value, scope):
                    self.planners[found[0]][1](call, scope, found[1])

    def _plan_callee(self, call: ast.Call, chain: Chain, canonical: str, kinds: list[Kind]) -> bool:
        """Apply the first callee-matched rule for ``canonical`` that applies here; whether one did."""
        for kind in kinds:
            rule = self.ctx.rules.by_kind[kind].get(canonical)
            applies, planner = self.planners[kind]
            if rule is not None and applies(call, canonical, rule):
                planner(call, chain, rule)
                return True
        return False

    def _is_library_name(self, node: ast.expr, scope: Scope) -> bool:
        """Whether ``node`` names a library's module or class (``torch.nn.Module.cuda(self)`` is no method call)."""
        found = dotted_parts(node)
        binding = found and scope.import_of(found[0].id)
        return bool(binding) and not self.ctx.index.is_tree_name(binding.source)

    def _unmappable(self, call: ast.Call, rule: Rule) -> bool:
        """``f(*args, **kwargs)``: which parameter each argument is cannot be known, so it is reported."""
        if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
            self.ctx.leave(call.lineno, rule, f"called with *args/**kwargs: not rewritten; {rule.note}")
            return True
        return False

    # -- call: the callee and its arguments -------------------------------------
    def _call_applies(self, call: ast.Call, canonical: str, rule: Rule) -> bool:
        return not self.ctx.defines(canonical, rule)

    def _call(self, call: ast.Call, chain: Chain, rule: Rule) -> None:
        ctx = self.ctx
        ctx.handled.add(id(call.func))
        if self._unmappable(call, rule):
            return
        func = ctx.spell(rule.target, chain.scope, call.lineno)
        add = {
            keyword: _TEMPLATE.sub(lambda m: ctx.spell(m[1], chain.scope, call.lineno), template)
            for keyword, template in rule.args.get("add", {}).items()
        }
        edits = ArgEdits.from_rule(rule.args, add)
        column = ctx.text.column(call)
        render = ctx.checked(call, rule, lambda text: rewrite_call(text, edits, func=func, column=column))
        if render is None or render(ctx.segment(call)) == ctx.segment(call):
            return  # unrewritable (reported), or already as the rule wants it (allow_no_cuda=True given)
        ctx.consume(chain.root.id, rule.code)
        entry = ctx.change(call.lineno, rule, ctx.segment(call), "", rule.target)
        ctx.edit(call, render, [entry])

    # -- argument: a call passed as one keyword's value -------------------------
    def _argument_applies(self, call: ast.Call, canonical: str, rule: Rule) -> bool:
        passed = self.ctx.scopes.keyword_of.get(id(call)) == rule.args["keyword"]
        assigned = self.ctx.scopes.assigned_to.get(id(call)) in rule.args.get("assigned", ())
        return (passed or assigned) and not call.args and not call.keywords

    def _argument(self, call: ast.Call, chain: Chain, rule: Rule) -> None:
        ctx = self.ctx
        ctx.handled.add(id(call.func))
        value = ctx.spell(rule.target, chain.scope, call.lineno) + "()"
        ctx.consume(chain.root.id, rule.code)
        ctx.change(call.lineno, rule, ctx.segment(call), value, rule.target + "()")
        ctx.edit(call, lambda _text: value)

    # -- method: x.<match>(...) on any receiver ---------------------------------
    def _method(self, call: ast.Call, scope: Scope, rule: Rule) -> None:
        ctx = self.ctx
        if self._unmappable(call, rule):
            return
        if rule.args.get("receiver") == "argument":  # x.type(...) -> target(x, ...)
            func = ctx.spell(rule.target, scope, call.lineno)
            render = ctx.checked(call, rule, lambda text: receiver_as_argument(text, func))
            if render is not None:
                ctx.edit(call, render, [ctx.change(call.lineno, rule, ctx.segment(call), "", rule.target)])
            return
        if rule.target.rpartition(".")[2] == rule.match:  # x.state_dict(d, p, k): the arguments only
            self._method_arguments(call, rule)
            return
        first = ctx.spell(rule.target, scope, call.lineno) + "()"
        edits = ArgEdits.from_rule(rule.args)
        method = rule.args.get("method", rule.match)
        render = ctx.checked(call, rule, lambda text: rewrite_call(text, edits, method=method, first=first))
        if render is None:
            return
        entry = ctx.change(call.lineno, rule, ctx.segment(call), "", rule.target + "()")
        ctx.edit(call, render, [entry])

    def _method_arguments(self, call: ast.Call, rule: Rule) -> None:
        """A method rule whose target is the method itself (``shim.nn.Module.state_dict`` for ``state_dict``):
        the call keeps its receiver and name, its arguments are edited (positional ones named). Left alone
        and reported where the edit could be wrong: more positional arguments than ``signature`` has, or
        a method of that name defined in the file with other positional parameters (the receiver may be
        one of its instances)."""
        ctx = self.ctx
        signature = tuple(rule.args.get("signature", ()))
        if len(call.args) > len(signature):
            ctx.leave(call.lineno, rule, f"{len(call.args)} positional arguments, {rule.match} takes "
                                         f"{len(signature)} ({', '.join(signature)}): not rewritten; {rule.note}")
            return
        other = self._other_definition(rule.match, signature[:len(call.args)])
        if other is not None:
            ctx.leave(call.lineno, rule, f"line {other.lineno} defines {rule.match} with other positional "
                                         f"parameters, which this call may reach: not rewritten; {rule.note}")
            return
        edits = ArgEdits.from_rule(rule.args)
        render = ctx.checked(call, rule, lambda text: rewrite_call(text, edits))
        if render is None or render(ctx.segment(call)) == ctx.segment(call):
            return  # unrewritable (reported), or already keywords
        ctx.edit(call, render, [ctx.change(call.lineno, rule, ctx.segment(call), "", rule.target)])

    def _other_definition(self, name: str, params: tuple[str, ...]) -> ast.FunctionDef | None:
        """A method ``name`` defined in a class of this file whose positional parameters after ``self``
        are not ``params`` in that order (positional-only ones never are); None if every one is."""
        for node in ast.walk(self.ctx.tree):
            if not isinstance(node, ast.ClassDef):
                continue
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == name:
                    own = [a.arg for a in (*item.args.posonlyargs, *item.args.args)][1:]
                    if item.args.posonlyargs[1:] or any(a != b for a, b in zip(own, params)):
                        return item
        return None

    # -- importlib.import_module("name"): a literal name mapped as an import ----
    def _import_module_call(self, call: ast.Call) -> None:
        """``importlib.import_module("name")`` with a literal absolute name: the name is mapped as an
        ``import name`` would be (Megatron loads ``fused_mix_prec_layer_norm_cuda`` this way)."""
        ctx = self.ctx
        if not call.args or call.keywords or len(call.args) > 1:
            return
        literal = call.args[0]
        if not (isinstance(literal, ast.Constant) and isinstance(literal.value, str)) or literal.value.startswith("."):
            return
        name = literal.value
        if ctx.index.is_tree_name(name):
            return
        rule = ctx.rules.best(name)  # a name-site rule: module, symbol, unsupported or report
        if rule is None:
            return
        wanted = mapped_name(rule, name)
        if wanted is None:
            ctx.leave(call.lineno, rule)
            return
        if wanted == name:
            return
        quote = ctx.segment(literal)[:1]
        after = f"{quote}{wanted}{quote}" if quote in ("'", '"') else repr(wanted)
        ctx.change(call.lineno, rule, ctx.segment(literal), after, wanted)
        ctx.edit(literal, lambda _text: after)
