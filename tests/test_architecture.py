"""Import direction: layers import downward only (docs/architecture.md).

Every ``import`` statement of the checked packages is read with ``ast``, function-local
ones included (a lazy import is still a dependency). Three kinds of checks, all data:

- ``FORBIDDEN``: a module under one prefix must not import anything under another
  (``shim`` never imports ``glm_port``); ``allow`` carves out exceptions.
- ``LAYERS``: within a package, an ordered list of layers (module prefixes); a module
  may import its own layer and the layers before it, never a later one. Every module of
  the package must fall in a layer, so a new module is placed on purpose.
- ``CYCLE_FREE``: no import cycle among a package's modules.

To add rules for another package, add entries to these tables (and its name to
``CYCLE_FREE``); the tests below pick them up.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Forbidden:
    importer: str  # a module prefix: "shim" covers shim and everything under it
    imported: tuple[str, ...]  # prefixes it must not import
    why: str
    allow: tuple[str, ...] = ()  # prefixes exempted from `imported`


FORBIDDEN = [
    Forbidden("shim", ("glm_port", "migrate", "harness", "bench", "tests"), "shim is the bottom of the house"),
    Forbidden("glm_port", ("migrate", "harness", "bench", "tests"), "glm_port builds on shim and libraries only"),
    Forbidden(
        "shim.ops", ("shim",), "ops import torch and other ops only (the process group is an argument)",
        allow=("shim.ops",),
    ),
]

# package -> its layers, lowest first; a module belongs to the layer with its longest matching prefix.
LAYERS = {
    "shim": [
        ("shim.ops",),  # kernels: torch only
        ("shim._device", "shim._forward"),  # the active device, namespace forwarding
        # torch-shaped: torch's module of the same name plus shim's additions
        ("shim.compat", "shim.cuda", "shim.optim", "shim.nn", "shim.distributed"),
        # upstream surfaces with no torch counterpart, one module each
        ("shim.recompute", "shim.checkpointing", "shim.mpu", "shim.deepspeed", "shim.global_tensor", "shim.sbp",
         "shim.kernels", "shim.apex"),
        ("shim.__init__",),  # `import shim as torch`: reaches everything, lazily
    ],
    "glm_port": [
        ("glm_port.data", "glm_port.distributed", "glm_port.sharding", "glm_port.outputs", "glm_port.dtypes"),  # vocabularies, corpora; ranks, FSDP2; output paths; dtype names
        ("glm_port.training", "glm_port.checkpoint_io"),  # shared by every family: the loop, saving
        ("glm_port.models",),  # the families (each folder: config, model, weights, tokenizer, bindings)
        # the commands and what they share, on top of any family
        ("glm_port.generation", "glm_port.generate", "glm_port.finetune", "glm_port.convert", "glm_port.chat",
         "glm_port.pretrain_glm", "glm_port.arguments", "glm_port.serve", "glm_port.__init__"),
    ],
}

CYCLE_FREE = ["shim", "glm_port"]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules(package: str) -> dict[str, Path]:
    directory = ROOT / package.replace(".", "/")
    return {module_name(p): p for p in sorted(directory.rglob("*.py"))} if directory.is_dir() else {}


def _is_package(name: str, modules: dict[str, Path]) -> bool:
    return name in modules and modules[name].name == "__init__.py"


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules ``name`` imports, anywhere in the file; ``from pkg import mod`` counts as ``pkg.mod``."""
    found = set()
    package = name if _is_package(name, known) else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if candidate in known else base)
    return found


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def all_modules() -> dict[str, Path]:
    packages = {f.importer.split(".")[0] for f in FORBIDDEN} | set(LAYERS) | set(CYCLE_FREE)
    return {name: path for package in sorted(packages) for name, path in package_modules(package).items()}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    known = all_modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def test_the_checked_packages_exist(graph):
    assert "shim.ops.cross_entropy" in graph and "shim.distributed.layout" in graph


@pytest.mark.parametrize("rule", FORBIDDEN, ids=lambda r: r.importer)
def test_forbidden_imports(graph, rule):
    bad = sorted(
        f"{importer} imports {imported}"
        for importer, targets in graph.items()
        if _under(importer, rule.importer)
        for imported in targets
        if any(_under(imported, p) for p in rule.imported) and not any(_under(imported, a) for a in rule.allow)
    )
    assert not bad, f"{rule.why}:\n" + "\n".join(bad)


def _layer_of(name: str, layers, is_package_root: bool) -> int | None:
    key = f"{name}.__init__" if is_package_root else name
    best = None
    for index, prefixes in enumerate(layers):
        for prefix in prefixes:
            if _under(key, prefix) and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    return None if best is None else best[0]


@pytest.mark.parametrize("package", list(LAYERS))
def test_layers_import_downward(graph, package):
    layers = LAYERS[package]
    known = all_modules()
    unplaced, upward = [], []
    for importer, targets in graph.items():
        if not _under(importer, package):
            continue
        own = _layer_of(importer, layers, importer == package)
        if own is None:
            unplaced.append(importer)
            continue
        for imported in targets:
            if not _under(imported, package) or imported not in known:
                continue
            theirs = _layer_of(imported, layers, imported == package)
            if theirs is not None and theirs > own:
                upward.append(f"{importer} (layer {own}) imports {imported} (layer {theirs})")
    assert not unplaced, f"modules in no layer of LAYERS[{package!r}]: {unplaced}"
    assert not upward, "upward imports:\n" + "\n".join(sorted(upward))


def find_cycle(graph: dict[str, set[str]], nodes: set[str]) -> list[str] | None:
    """One import cycle among ``nodes`` (as a path that ends where it starts), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ()) & nodes):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(nodes):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


@pytest.mark.parametrize("package", CYCLE_FREE)
def test_no_import_cycles(graph, package):
    nodes = {name for name in graph if _under(name, package)}
    cycle = find_cycle(graph, nodes)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


# ---- no private name across packages ---------------------------------------------------------------------

# Top-level packages whose modules may use their own ``_private`` names but none of another's: what another
# package needs is public in its owner (in the owner's ``__all__``). Dunders (``__version__``) are public.
PUBLIC_ONLY_ACROSS = ("shim", "glm_port", "migrate", "harness", "bench")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(name: str, path: Path, known: dict[str, Path]) -> list[str]:
    """Where module ``name`` reaches a ``_private`` name of another package of ``PUBLIC_ONLY_ACROSS``: importing
    it (``from shim.x import _y``, ``import shim._x``) or reading it as an attribute of something imported from
    that package (``run._y``, ``shim.nn._y.z``, ``torch._y`` after ``import shim as torch``)."""
    own = name.split(".")[0]
    package = name if _is_package(name, known) else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))

    def foreign(dotted: str) -> bool:
        top = dotted.split(".")[0]
        return top in PUBLIC_ONLY_ACROSS and top != own

    found, bound = [], {}  # bound: local names of things imported from another package
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if foreign(alias.name):
                    found += [f"line {node.lineno}: import {alias.name}"
                              for part in alias.name.split(".")[1:] if _private(part)][:1]
                    bound[alias.asname or alias.name.split(".")[0]] = alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            if not foreign(base):
                continue
            if any(_private(part) for part in base.split(".")[1:]):
                found.append(f"line {node.lineno}: from {base} import ...")
            for alias in node.names:
                if _private(alias.name):
                    found.append(f"line {node.lineno}: from {base} import {alias.name}")
                bound[alias.asname or alias.name] = f"{base}.{alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            root, chain = node, [node.attr]
            while isinstance(root.value, ast.Attribute):
                root = root.value
                chain.append(root.attr)
            if isinstance(root.value, ast.Name) and root.value.id in bound:
                found.append(f"line {node.lineno}: {root.value.id}.{'.'.join(reversed(chain))} "
                             f"({bound[root.value.id]})")
    return found


def test_no_private_name_is_used_across_packages():
    known = {name: path for package in PUBLIC_ONLY_ACROSS for name, path in package_modules(package).items()}
    assert "bench.finetune" in known and "glm_port.finetune.lora" in known
    bad = [f"{path.relative_to(ROOT)} {use}" for name, path in known.items()
           for use in private_uses(name, path, known)]
    assert not bad, "private names of another package (make them public in their owner):\n" + "\n".join(bad)


def test_the_private_name_checker_sees_imports_and_attributes(tmp_path, monkeypatch):
    for package in ("shim", "bench"):
        (tmp_path / package / "nn").mkdir(parents=True)
        (tmp_path / package / "__init__.py").write_text("")
        (tmp_path / package / "nn" / "__init__.py").write_text("")
    (tmp_path / "shim" / "nn" / "tp.py").write_text("_x = 1\n__version__ = 2\n")
    (tmp_path / "shim" / "own.py").write_text("from shim.nn.tp import _x\nfrom .nn import tp\ntp._x\n")  # its own
    (tmp_path / "bench" / "a.py").write_text(
        "import shim as torch\nfrom shim.nn.tp import _x, __version__\nimport shim.nn.tp as tp\n"
        "def f():\n    from shim.nn import tp as t\n    return torch.nn.tp._x, tp._x, t.__version__, t.public\n"
        "import shim._device\nobj = object()\nobj._anything\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    known = {**package_modules("shim"), **package_modules("bench")}
    assert private_uses("shim.own", known["shim.own"], known) == []
    assert private_uses("bench.a", known["bench.a"], known) == [
        "line 2: from shim.nn.tp import _x", "line 7: import shim._device",
        "line 6: torch.nn.tp._x (shim)", "line 6: tp._x (shim.nn.tp)"]


def test_the_checker_sees_function_local_and_relative_imports(tmp_path, monkeypatch):
    """The parser itself: a hidden (function-local) import and a relative one are both edges."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text("from .. import a\nfrom . import c\n")
    (package / "sub" / "c.py").write_text("")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    known = package_modules("pkg")
    edges = {name: imports_of(name, path, known) for name, path in known.items()}
    assert edges["pkg.a"] == {"pkg.sub.b"}
    assert edges["pkg.sub.b"] == {"pkg.a", "pkg.sub.c"}
    assert find_cycle(edges, set(edges)) == ["pkg.a", "pkg.sub.b", "pkg.a"]


def test_the_server_imports_no_family_module(graph):
    """glm-serve reaches the families through the registry only (``glm_port.models``), so that the family
    contract can replace what it uses without touching it."""
    families = [name for name in graph if name.startswith("glm_port.models.") and name.count(".") >= 3]
    assert families, "no family modules found: the check would be empty"
    serve = {name: deps for name, deps in graph.items() if _under(name, "glm_port.serve")}
    assert serve, "glm_port.serve not found"
    bad = {name: sorted(d for d in deps if d.startswith("glm_port.models.")) for name, deps in serve.items()}
    assert not {name: deps for name, deps in bad.items() if deps}


# ---- the family contract -----------------------------------------------------------------------------------

# glm_port's modules outside glm_port/models/ reach a family only through the registry and its contract
# (``glm_port.models``, ``glm_port.models.contract``): the declaration's classes (``family.config_class``),
# ``family.binding(kind)`` for its bindings. The exceptions, by name: module -> the family modules it may name.
CONTRACT = ("glm_port.models", "glm_port.models.contract")
FAMILY_IMPORTS_ALLOWED = {
    # the package's public re-export of GLM's classes (``from glm_port import GLMConfig, GLMModel``) and its
    # lazy names (GLMForConditionalGeneration, GLMTokenizer): docs/architecture.md, "The family contract"
    "glm_port": ("glm_port.models.glm",),
}


def family_references(name: str, path: Path, known: dict[str, Path]) -> list[str]:
    """The ``glm_port.models.<family>`` modules module ``name`` imports, or names as a string that is a module
    path (``importlib.import_module("glm_port.models.glm.hf")``, a duck-typed binding), outside the contract."""
    def is_family(dotted: str) -> bool:
        return dotted.startswith("glm_port.models.") and dotted not in CONTRACT

    found = sorted(f"imports {m}" for m in imports_of(name, path, known) if is_family(m))
    module_path = re.compile(r"glm_port\.models\.\w+(\.\w+)*")
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and module_path.fullmatch(node.value) \
                and is_family(node.value):
            found.append(f"line {node.lineno}: names {node.value!r}")
    allowed = FAMILY_IMPORTS_ALLOWED.get(name, ())
    return [f for f in found if not any(_under(f.split()[-1].strip("'"), a) for a in allowed)]


def test_the_commands_reach_families_only_through_the_contract():
    known = package_modules("glm_port")
    outside = {name: path for name, path in known.items() if not _under(name, "glm_port.models")}
    assert "glm_port.chat" in outside and "glm_port.convert.merge" in outside and "glm_port.pretrain_glm" in outside
    bad = [f"{path.relative_to(ROOT)} {ref}" for name, path in outside.items()
           for ref in family_references(name, path, known)]
    assert not bad, ("reach a family through glm_port.models (family_at, family_for, FAMILIES, "
                     "family.binding(kind)), not its modules:\n" + "\n".join(bad))


def test_the_contract_checker_sees_imports_and_module_path_strings(tmp_path, monkeypatch):
    for folder in ("glm_port", "glm_port/models", "glm_port/models/fam"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "glm_port" / "models" / "contract.py").write_text("")
    (tmp_path / "glm_port" / "models" / "fam" / "weights.py").write_text("")
    (tmp_path / "glm_port" / "good.py").write_text(
        "from glm_port.models import FAMILIES, contract\nimport glm_port.models.contract\n"
        "'''see glm_port.models.fam.weights'''\n")
    (tmp_path / "glm_port" / "bad.py").write_text(
        "def f():\n    from glm_port.models.fam import weights\n"
        "import importlib\nimportlib.import_module('glm_port.models.fam')\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    known = package_modules("glm_port")
    assert family_references("glm_port.good", known["glm_port.good"], known) == []
    assert family_references("glm_port.bad", known["glm_port.bad"], known) == [
        "imports glm_port.models.fam.weights", "line 4: names 'glm_port.models.fam'"]


def test_every_family_binding_provides_its_protocol():
    """Each registered family's declared bindings import and have every name their kind's protocol lists
    (``glm_port.models.contract``); its package has the config and model classes it names."""
    from glm_port.models import FAMILIES, Family
    from glm_port.models.contract import PROTOCOLS, members, missing

    fields = set(Family.__dataclass_fields__)
    assert set(PROTOCOLS) <= fields, f"binding kinds with no Family field: {sorted(set(PROTOCOLS) - fields)}"
    assert "stream_chat" in members(PROTOCOLS["conversation"]) and "PromptTooLong" in members(PROTOCOLS["conversation"])
    checked, bad = 0, []
    for family in FAMILIES.values():
        for attribute in (family.config_class, family.model_class):
            if not isinstance(family.load(attribute), type):
                bad.append(f"{family.name}: {attribute!r} is not a class")
        for kind in PROTOCOLS:
            if getattr(family, kind) is None:
                continue
            lacking = missing(kind, family.binding(kind))
            checked += 1
            if lacking:
                bad.append(f"{family.name}'s {kind} binding ({getattr(family, kind)}) lacks {', '.join(lacking)}")
    assert checked >= 9, "no bindings were checked"
    assert not bad, "\n".join(bad)


def test_each_family_is_one_declaration_of_code_in_its_own_folder():
    """Each registered family is the ``FAMILY`` of its own folder's ``spec.py`` (one registry line), and that
    declaration holds code, never names: its classes are classes, its hooks callables, each binding the object
    providing its kind's protocol (``isinstance`` of the runtime-checkable protocol), its chat formats the ones its
    ``conversation`` binding speaks, its split plan a ``SplitPlan`` for its default config, its state-dict adapter a
    ``weights_io.Adapter``."""
    import types

    from glm_port.models import FAMILIES
    from glm_port.models.contract import PROTOCOLS, missing
    from glm_port.models.weights_io import Adapter
    from shim.nn.split_plan import SplitPlan

    assert list(FAMILIES) == ["glm", "chatglm2", "glm4"]
    bad = []
    for name in FAMILIES:
        declared_in = getattr(FAMILIES, "declared_in", lambda name: None)(name)
        if declared_in != f"glm_port.models.{name}.spec":
            bad.append(f"{name}: declared in {declared_in}, not its folder's spec.py")
        family = FAMILIES[name]
        code = {field: getattr(family, field, None) for field in
                ("config_class", "model_class", "tokenizer_class", "split_plan", "adapter", "detect", *PROTOCOLS)}
        named = [f"{field}={value!r}" for field, value in code.items() if isinstance(value, str)]
        if named:
            bad.append(f"{name}: holds names, not code: {', '.join(named)}")
            continue
        for field in ("config_class", "model_class", "tokenizer_class"):
            if not isinstance(code[field], type):
                bad.append(f"{name}: {field} {code[field]!r} is not a class")
        for field in ("split_plan", "detect"):
            if code[field] is not None and not callable(code[field]):
                bad.append(f"{name}: {field} {code[field]!r} is not callable")
        if not isinstance(family.split_plan(family.config_class(), 2), SplitPlan):
            bad.append(f"{name}: split_plan(config, 2) is not a SplitPlan")
        if not isinstance(code["adapter"], Adapter):
            bad.append(f"{name}: adapter {code['adapter']!r} is not a weights_io.Adapter")
        for kind, protocol in PROTOCOLS.items():
            binding = code[kind]
            if binding is None:
                continue
            if not isinstance(binding, types.ModuleType) or not isinstance(binding, protocol) or missing(kind, binding):
                bad.append(f"{name}'s {kind} binding {binding!r} is not a module providing {protocol.__name__}")
            if family.binding(kind) is not binding:
                bad.append(f"{name}: binding({kind!r}) is not the object declared")
        if family.conversation is not None and tuple(family.chat_formats) != tuple(family.conversation.CHAT_FORMATS):
            bad.append(f"{name}: chat_formats {family.chat_formats} are not its conversation binding's")
        if family.chat is not None and not family.chat_formats:
            bad.append(f"{name}: a chat binding and no chat format")
    assert not bad, "\n".join(bad)
    assert FAMILIES["glm4"].detect is not None and FAMILIES["glm4"].tokenizer_class.__name__ == "GLM4Tokenizer"


def test_a_declaration_that_names_instead_of_holding_code_is_refused():
    from glm_port.models import FAMILIES, Family

    glm = FAMILIES["glm"]
    with pytest.raises(TypeError, match=r"declare the object itself, not its name: config_class='GLMConfig'"):
        Family("x", "GLMConfig", glm.model_class, ("x",))
    with pytest.raises(TypeError, match=r"generation='glm_port.models.glm.generation'"):
        Family("x", glm.config_class, glm.model_class, ("x",), generation="glm_port.models.glm.generation")


def test_the_registry_loads_a_declaration_on_its_first_lookup(monkeypatch):
    """``Registry.declare`` records the module; nothing is imported until the family is looked up, and a module
    whose ``FAMILY`` is not the family of that name is refused."""
    import sys
    import types

    from glm_port.models import FAMILIES, Family, Registry

    registry = Registry()
    registry.declare("fake", "fake_family_spec")
    registry.declare("wrong", "fake_family_spec")
    assert list(registry) == ["fake", "wrong"] and "fake" in registry
    assert registry.declared_in("fake") == "fake_family_spec"
    assert "fake_family_spec" not in sys.modules  # declared, not imported
    module = types.ModuleType("fake_family_spec")
    module.FAMILY = Family("fake", FAMILIES["glm"].config_class, FAMILIES["glm"].model_class, ("fake",))
    monkeypatch.setitem(sys.modules, "fake_family_spec", module)
    assert registry["fake"] is module.FAMILY and registry.declared_in("fake") == "fake_family_spec"
    with pytest.raises(TypeError, match="fake_family_spec.FAMILY must be the Family named 'wrong'"):
        registry["wrong"]
    with pytest.raises(TypeError):
        registry["other"] = module.FAMILY


def test_importing_the_registry_imports_no_family_declaration():
    """``import glm_port.models`` (what every command's module imports, so its ``--help``) imports no family
    module, declaration or binding, nor torch or transformers: a family's code is imported on its first lookup."""
    import os
    import subprocess
    import sys

    code = ("import sys, glm_port.models as m; print(sorted(n for n in sys.modules if n.startswith('glm_port.models.')"
            " or n in ('torch', 'transformers')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    assert ast.literal_eval(out) == ["glm_port.models.contract"]


def test_a_binding_that_lacks_a_name_is_named(monkeypatch):
    import types

    from glm_port.models.contract import missing

    module = types.SimpleNamespace(load=lambda path: None)
    assert missing("generation", module) == ["generate"]
    assert missing("tiny", types.SimpleNamespace(build_tiny=None)) == ["NAME"]


def test_an_unknown_binding_kind_is_refused():
    from glm_port.models import FAMILIES

    with pytest.raises(KeyError, match="unknown binding kind 'name'"):
        FAMILIES["glm"].binding("name")
    with pytest.raises(ValueError, match="the glm family has no convert binding"):
        FAMILIES["glm"].binding("convert")


def test_every_family_raises_the_one_weights_error():
    """One ``WeightsError`` (``glm_port.models``): every family's loaders raise it, every command catches it."""
    from glm_port import models
    from glm_port.models.chatglm2 import weights as chatglm2_weights
    from glm_port.models.glm import weights as glm_weights

    assert glm_weights.WeightsError is models.WeightsError is chatglm2_weights.WeightsError
    for path in sorted((ROOT / "glm_port").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        defined = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "WeightsError"]
        assert path == ROOT / "glm_port" / "models" / "__init__.py" or not defined, f"{path}: a second WeightsError"
