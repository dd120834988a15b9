"""The import finder in this process: stand-ins come from the rule tables, errors name what is not covered."""

import importlib
import sys

import pytest

from migrate.mock.finder import MockFinder, StandIn, parse_forced
from migrate.mock.plan import MOCK_DEFINED, load_plan, resolve



def use(finder: MockFinder) -> MockFinder:
    sys.meta_path.insert(0, finder)
    return finder


@pytest.mark.usefixtures("in_process_mock")
def test_every_served_name_is_its_rule_target():
    use(MockFinder(installed=lambda scope: None))
    plan = load_plan()
    served = [r for r in plan.redirects.values() if r.kind == "symbol"]
    assert {r.name for r in served} >= {"apex.optimizers.FusedAdam", *MOCK_DEFINED}
    for redirect in served:
        module, _, attr = redirect.name.rpartition(".")
        assert getattr(importlib.import_module(module), attr) is resolve(redirect.target), redirect.name


@pytest.mark.usefixtures("in_process_mock")
def test_module_rule_forwards_to_its_target():
    use(MockFinder(installed=lambda scope: None))
    import deepspeed.checkpointing
    import shim.checkpointing

    assert isinstance(deepspeed.checkpointing, StandIn)
    assert deepspeed.checkpointing.get_cuda_rng_tracker is shim.checkpointing.get_cuda_rng_tracker
    assert "configure" in dir(deepspeed.checkpointing)


@pytest.mark.usefixtures("in_process_mock")
def test_uncovered_attribute_names_the_construct_and_the_rule():
    use(MockFinder(installed=lambda scope: None))
    import apex

    with pytest.raises(AttributeError, match=r"^apex\.amp is not covered by glm-mock: \[APX101\] apex\.amp has no"):
        apex.amp
    with pytest.raises(AttributeError, match=r"^apex\.contrib\.optimizers is not covered by glm-mock: \[APX199\]"):
        apex.contrib.optimizers
    with pytest.raises(ImportError, match=r"^apex\.optimizers\.FusedLAMB is not covered by glm-mock"):
        from apex.optimizers import FusedLAMB  # noqa: F401
    assert not hasattr(apex, "__file__")  # dunder probes get a plain AttributeError


@pytest.mark.usefixtures("in_process_mock")
def test_uncovered_submodule_import_is_refused_with_the_note():
    use(MockFinder(installed=lambda scope: None))
    with pytest.raises(ModuleNotFoundError, match=r"^apex\.amp is not covered by glm-mock: \[APX101\]"):
        import apex.amp  # noqa: F401
    import amp_C

    assert amp_C.multi_tensor_scale.__module__ == "shim.ops.multi_tensor"
    with pytest.raises(ImportError, match=r"^amp_C\.multi_tensor_lamb is not covered by glm-mock: \[APX109\]"):
        from amp_C import multi_tensor_lamb  # noqa: F401
    with pytest.raises(ModuleNotFoundError, match="install DeepSpeed"):
        import deepspeed.runtime.engine  # noqa: F401


@pytest.mark.usefixtures("in_process_mock")
def test_installed_package_wins_unless_forced():
    installed = {"apex": object()}
    finder = use(MockFinder(installed=installed.get))
    assert finder.find_spec("apex") is None and finder.find_spec("apex.amp") is None
    forced = MockFinder(forced=parse_forced("apex"), installed=installed.get)
    assert forced.find_spec("apex") is not None
    assert MockFinder(forced=parse_forced("all"), installed=installed.get).serves("deepspeed")


def test_force_names_are_checked():
    with pytest.raises(ValueError, match=r"--force: unknown package\(s\) \['apx'\]"):
        parse_forced("apex,apx", "--force")


@pytest.mark.usefixtures("in_process_mock")
def test_torch_six_forwards_to_shim_compat_six():
    use(MockFinder(installed=lambda scope: None))
    from torch._six import inf, string_classes

    assert inf == float("inf") and str in string_classes
