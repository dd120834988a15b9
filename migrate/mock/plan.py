"""What glm-mock redirects, read from the rule tables (one mapping, two consumers).

The codemod rewrites ``apex.optimizers.FusedAdam`` to ``shim.optim.FusedAdam``; the
mock serves the same rule at import time. Only rules inside :data:`SCOPES` matter
here: the rest of torch (``torch.cuda``, ``.cuda()``...) is made portable by
``shim.compat.install()``, not by stand-in modules.
"""

from __future__ import annotations

import importlib
from functools import lru_cache
from typing import NamedTuple

# Module trees the mock can stand in for -> what to install to get the real thing.
SCOPES = {
    "apex": "NVIDIA apex",
    "amp_C": "NVIDIA apex",
    "deepspeed": "DeepSpeed (pip install deepspeed)",
    "torch._six": "torch < 2.0",
    # Megatron-LM's CUDA extensions, built by its fused_kernels.load(args) (rules/megatron.toml)
    "scaled_masked_softmax_cuda": "Megatron-LM's fused kernels (built with nvcc on a GPU machine)",
    "scaled_upper_triang_masked_softmax_cuda": "Megatron-LM's fused kernels (built with nvcc on a GPU machine)",
    "scaled_softmax_cuda": "Megatron-LM's fused kernels (built with nvcc on a GPU machine)",
    "fused_mix_prec_layer_norm_cuda": "Megatron-LM's fused kernels (built with nvcc on a GPU machine)",
    "fused_layer_norm_cuda": "NVIDIA apex",
}

# DeepSpeed's init_distributed: the codemod rewrites its call to init_process_group (an
# argument edit the mock cannot make), so the mock serves shim.deepspeed's, same signature.
MOCK_DEFINED = {
    "deepspeed.init_distributed": "shim.deepspeed.init_distributed",
}


class Redirect(NamedTuple):
    """One name under a scope: what backs it, or why nothing does."""

    name: str
    kind: str  # "module" (a stand-in forwarding to target), "symbol", or "not covered"
    target: str | None = None
    code: str = ""  # the rule code, "" for MOCK_DEFINED
    note: str = ""


def scope_of(name: str) -> str | None:
    """The scope ``name`` lies in (``"apex"`` for ``apex.amp``), or None."""
    for scope in SCOPES:
        if name == scope or name.startswith(scope + "."):
            return scope
    return None


class Plan:
    """The redirections, indexed for the import finder and for ``glm-mock --list``."""

    def __init__(self, redirects: list[Redirect]):
        self.redirects = {r.name: r for r in redirects}
        served = [r.name for r in redirects if r.kind != "not covered"]
        # Every package above a served name is a stand-in module too (apex.optimizers for
        # apex.optimizers.FusedAdam), but never above its scope (no stand-in "torch").
        self.modules = {r.name for r in redirects if r.kind == "module"}
        for name in served:
            scope = scope_of(name)
            parts = name.split(".")
            for i in range(scope.count(".") + 1, len(parts)):
                self.modules.add(".".join(parts[:i]))

    def lookup(self, name: str) -> Redirect:
        """What backs ``name``; an uncovered name gets the note of its nearest enclosing rule."""
        found = self.redirects.get(name)
        if found is not None and found.kind != "not covered":
            return found
        prefix = name
        while prefix:
            rule = self.redirects.get(prefix)
            if rule is not None and rule.kind == "not covered":
                return Redirect(name, "not covered", code=rule.code, note=rule.note)
            prefix = prefix.rpartition(".")[0]
        return Redirect(name, "not covered", note="no rule maps it")

    def not_covered_message(self, name: str) -> str:
        redirect = self.lookup(name)
        code = f"[{redirect.code}] " if redirect.code else ""
        return (
            f"{name} is not covered by glm-mock: {code}{redirect.note} "
            f"(install {SCOPES[scope_of(name)]} to use it)"
        )


def _redirect(rule) -> Redirect:
    if rule.kind in ("module", "symbol") or (rule.kind == "call" and not rule.args):
        return Redirect(rule.match, "module" if rule.kind == "module" else "symbol", rule.target, rule.code, rule.note)
    if rule.kind == "call":
        note = f"{rule.note} (its argument edits need glm-migrate; the mock cannot apply them)"
        return Redirect(rule.match, "not covered", code=rule.code, note=note)
    return Redirect(rule.match, "not covered", code=rule.code, note=rule.note)


@lru_cache(maxsize=None)
def load_plan() -> Plan:
    from migrate.rules import load_rules  # only when a mocked name is imported: start-up stays cheap

    redirects = {r.match: _redirect(r) for r in load_rules() if scope_of(r.match) and r.kind != "method"}
    for name, target in MOCK_DEFINED.items():
        redirects[name] = Redirect(name, "symbol", target, note="shim.deepspeed's, on shim.distributed")
    return Plan(list(redirects.values()))


def resolve(dotted: str):
    """The object a dotted target names: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        try:
            obj = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:  # a real failure inside the module, not "no such module"
                raise
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(f"glm-mock: cannot import any module of {dotted!r}")
