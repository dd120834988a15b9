"""The import side of glm-mock: stand-in modules and the torch start-up hook.

:class:`MockFinder` sits first on ``sys.meta_path`` and

- serves stand-in modules for the scopes in ``rules/`` (:func:`migrate.mock.plan.scopes`)
  (``apex``, ``deepspeed``, ``torch._six``...) unless the real package is
  installed and not forced; their attributes come from the rule tables;
- refuses submodules no rule covers with a ModuleNotFoundError that says so;
- applies ``shim.compat.install()`` to torch right after torch is imported (on a
  machine without CUDA that maps ``torch.cuda``, ``.cuda()`` and 'cuda' devices to
  the CPU), so processes that never import torch pay nothing.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import types

from migrate.mock.plan import Plan, load_plan, resolve, scope_of, scopes

ENV_DISABLE = "GLM_MOCK_DISABLE"  # kill switch: any value but "" and "0"
ENV_FORCE = "GLM_MOCK_FORCE"  # comma-separated scopes whose stand-in beats a real install ("all")


class StandIn(types.ModuleType):
    """A mocked module. Attributes resolve on first use: a rule's shim target, a
    stand-in submodule, the module a ``module`` rule forwards to, or an
    AttributeError naming the construct as not covered. Never a placeholder."""

    def __init__(self, name: str, plan: Plan):
        redirect = plan.redirects.get(name)
        forward = redirect.target if redirect is not None and redirect.kind == "module" else None
        super().__init__(name, f"glm-mock stand-in for {name}, backed by {forward or 'shim'} (see `glm-mock --list`).")
        self._glm_mock_plan = plan
        self._glm_mock_forward = importlib.import_module(forward) if forward else None

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(f"glm-mock stand-in {self.__name__!r} has no attribute {name!r}")
        plan = self._glm_mock_plan
        full = f"{self.__name__}.{name}"
        redirect = plan.lookup(full)
        if full in plan.modules:
            value = importlib.import_module(full)
        elif redirect.kind == "symbol":
            try:
                value = resolve(redirect.target)
            except (ImportError, AttributeError) as exc:
                # ImportError, not AttributeError: `from x import y` must not swallow it.
                raise ImportError(f"glm-mock: {full} -> {redirect.target} is broken: {exc}") from exc
        elif self._glm_mock_forward is not None and hasattr(self._glm_mock_forward, name):
            # Not cached: the forwarded module may rebind its globals later.
            return getattr(self._glm_mock_forward, name)
        else:
            raise AttributeError(plan.not_covered_message(full))
        setattr(self, name, value)
        return value

    def __dir__(self):
        plan = self._glm_mock_plan
        prefix = self.__name__ + "."
        own = {n[len(prefix):].split(".")[0] for n in plan.redirects.keys() | plan.modules if n.startswith(prefix)}
        own = {n for n in own if plan.lookup(prefix + n).kind != "not covered" or prefix + n in plan.modules}
        forwarded = dir(self._glm_mock_forward) if self._glm_mock_forward is not None else ()
        return sorted(set(super().__dir__()) | own | set(forwarded))


class StandInLoader:
    def __init__(self, plan: Plan):
        self.plan = plan

    def create_module(self, spec):
        return StandIn(spec.name, self.plan)

    def exec_module(self, module):
        """Nothing to run: a stand-in's attributes resolve on first use."""


class _ThenCall:
    """Runs a module's own loader, then ``after(module)``; the module keeps its own loader."""

    def __init__(self, loader, after):
        self.loader = loader
        self.after = after

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        self.after(module)

    def __getattr__(self, name):
        return getattr(self.loader, name)


def make_torch_portable(torch) -> None:
    """Apply shim.compat to torch itself; shim.compat decides what a machine with CUDA needs
    (only ``torch._six``) and what one without needs (``torch.cuda``, 'cuda' devices, nccl...)."""
    try:
        import shim.compat

        shim.compat.install()
    except Exception as exc:
        raise ImportError(f"glm-mock: torch loaded, but shim.compat.install() failed: {exc!r}") from exc


def find_real(name: str, path=None, target=None):
    """The spec the import system would find for ``name`` without glm-mock (nothing is
    imported), or None: what "the real package is installed" means here."""
    for finder in sys.meta_path:
        if isinstance(finder, MockFinder) or not hasattr(finder, "find_spec"):
            continue
        try:
            spec = finder.find_spec(name, path, target)
        except ImportError:  # a finder that refuses the name: importing it would fail
            return None
        if spec is not None:
            return spec
    return None


def find_installed(name: str):
    """:func:`find_real` for a dotted name whose parents are not imported yet."""
    spec, path, parts = None, None, name.split(".")
    for i in range(len(parts)):
        spec = find_real(".".join(parts[: i + 1]), path)
        if spec is None:
            return None
        path = spec.submodule_search_locations
    return spec


# No scope is in the standard library, nor is site's own usercustomize (imported after the start-up hook).
_NEVER_IN_SCOPE = frozenset(sys.stdlib_module_names) | {"sitecustomize", "usercustomize"}


class MockFinder:
    def __init__(self, forced=frozenset(), installed=find_installed):
        self.forced = frozenset(scopes()) if "all" in forced else frozenset(forced)
        self._reading = False  # True while the scopes are read: the imports that takes pass through
        self._installed = installed
        self._serves: dict[str, bool] = {}

    def serves(self, scope: str) -> bool:
        """Whether the stand-in answers for ``scope``: forced, or no real package installed."""
        if scope not in self._serves:
            self._serves[scope] = scope in self.forced or self._installed(scope) is None
        return self._serves[scope]

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torch":
            return self._torch_spec(path, target)
        if fullname.partition(".")[0] in _NEVER_IN_SCOPE or self._reading:
            return None  # most imports never read the tables
        self._reading = True
        try:
            scope = scope_of(fullname)
        finally:
            self._reading = False
        if scope is None or not self.serves(scope):
            return None
        plan = load_plan()
        if fullname in plan.modules:
            return importlib.machinery.ModuleSpec(fullname, StandInLoader(plan), is_package=True)
        if plan.lookup(fullname).kind == "not covered":
            # No name= : `from apex.optimizers import X` would otherwise swallow this and
            # say only "cannot import name".
            raise ModuleNotFoundError(plan.not_covered_message(fullname))
        return None  # a mapped class or function, not a module: the usual "No module named" applies

    def _torch_spec(self, path, target):
        spec = find_real("torch", path, target)
        if spec is not None:
            spec.loader = _ThenCall(spec.loader, make_torch_portable)
        return spec


def parse_forced(value: str, source: str = ENV_FORCE) -> frozenset[str]:
    forced = frozenset(s.strip() for s in value.split(",") if s.strip())
    unknown = forced - {"all"} and forced - set(scopes()) - {"all"}
    if unknown:
        raise ValueError(f"{source}: unknown package(s) {sorted(unknown)}; choose from {sorted(scopes())} or 'all'")
    return forced


def install(environ) -> MockFinder:
    """Put the finder first on sys.meta_path (once). The kill switch is checked by the
    start-up hook (site/sitecustomize.py), before anything is imported."""
    for finder in sys.meta_path:
        if isinstance(finder, MockFinder):
            return finder
    finder = MockFinder(parse_forced(environ.get(ENV_FORCE, "")))
    sys.meta_path.insert(0, finder)
    if "torch" in sys.modules:  # imported before us (by a .pth file, say)
        make_torch_portable(sys.modules["torch"])
    return finder
