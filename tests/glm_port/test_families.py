"""What a family declares it supports (``Family.supports``), and the commands refusing the rest before loading."""

import dataclasses

import pytest

from glm_port.models import FAMILIES, FEATURES, Family, Unsupported


def test_a_family_declares_known_features_only():
    with pytest.raises(ValueError, match="unknown features"):
        Family("x", FAMILIES["glm"].config_class, FAMILIES["glm"].model_class, ("x",),
               supports=frozenset({"speculative"}))
    with pytest.raises(KeyError):
        FAMILIES["glm"].require(("--speculative", "speculative"))


def test_require_names_the_flag_of_the_first_feature_asked_for_and_lacking():
    family = dataclasses.replace(FAMILIES["glm"], supports=frozenset({"lora"}))
    family.require(("--lora", "lora"), (None, "recompute"), (False, "pipeline_parallel"))  # nothing lacking asked
    with pytest.raises(Unsupported) as error:
        family.require(("--lora", "lora"), ("--recompute", "recompute"), ("--static-cache", "static_cache"))
    assert str(error.value) == f"--recompute: the glm family does not support {FEATURES['recompute']}"


def test_glm_finetune_refuses_a_feature_the_family_lacks_before_writing(tmp_path, capsys, monkeypatch):
    """glm-finetune checks --recompute, --lora and --tensor_parallel_degree against the family before it
    loads or writes anything (the embedded toy task included)."""
    from glm_port.finetune.run import main

    lacking = dataclasses.replace(FAMILIES["chatglm2"], supports=frozenset({"tensor_parallel"}))
    monkeypatch.setitem(FAMILIES, "chatglm2", lacking)
    for flag, feature in (("--recompute", "recompute"), ("--lora", "lora")):
        with pytest.raises(SystemExit) as exc:
            main(["--model_name_or_path", "chatglm2-tiny", flag, "--max_steps", "1", "--output_dir",
                  str(tmp_path / "out")])
        err = capsys.readouterr().err.strip().splitlines()
        assert exc.value.code == 2 and err == [
            f"glm-finetune: error: {flag}: the chatglm2 family does not support {FEATURES[feature]}"]
        assert not (tmp_path / "out").exists()


def test_each_registered_family_declares_what_its_commands_honour():
    """The declarations the commands read (docs/architecture.md, 'What a family supports')."""
    assert FAMILIES["glm"].supports == frozenset(FEATURES) - {"prefix_tuning"}
    chatglm2 = FAMILIES["chatglm2"].supports
    assert {"tensor_parallel", "static_cache", "recompute", "lora", "export", "quantize", "prefix_tuning"} <= chatglm2
    assert "pipeline_parallel" not in chatglm2 and "decode_graph" not in chatglm2
