"""The commands reach a family through the registry's contract only (docs/architecture.md, "The family
contract"): a family registered with the bindings a command needs is taken by it with no change to the
command, and a directory no such family reads is refused in one line by the default family's reader."""

import json
import sys
import types

import pytest

from glm_port import models
from glm_port.models import FAMILIES, Family


def _fake_family(monkeypatch, supports=frozenset(), **bindings) -> dict:
    """Register a family "fake" (config.json model_type "fake") whose bindings are in-memory modules, declaring
    ``supports``; returns what they were called with."""
    calls = {}
    declared = {}
    for kind, names in bindings.items():
        module = types.ModuleType(f"fake_family_{kind}")
        for name, value in names(calls).items():
            setattr(module, name, value)
        declared[kind] = module  # the declaration holds the binding itself
    glm = FAMILIES["glm"]
    family = Family("fake", glm.config_class, glm.model_class, ("fake",), supports=supports, **declared)
    monkeypatch.setitem(FAMILIES, "fake", family)
    return calls


def _directory(tmp_path, model_type="fake"):
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"model_type": model_type}))
    return directory


def test_glm_chat_talks_to_any_family_with_a_conversation_binding(tmp_path, monkeypatch, capsys):
    from glm_port.chat import main

    class FakeModel:
        config = types.SimpleNamespace(model_type="fake")
        device = types.SimpleNamespace(type="cpu")

    def conversation(calls):
        def load(directory, *, device="cpu", dtype=None, chat_format=None):
            calls["load"] = (str(directory), chat_format)
            return FakeModel(), types.SimpleNamespace(chat_format="fake-format")

        def stream_chat(model, tokenizer, query, history=None, return_past_key_values=False, **kwargs):
            calls.setdefault("queries", []).append((query, len(history)))
            reply = f"echo {query}"
            step = (reply, list(history) + [(query, reply)])
            yield step + (None,) if return_past_key_values else step

        return dict(load=load, stream_chat=stream_chat, PromptTooLong=ValueError, CHAT_FORMATS=("fake-format",),
                    DEFAULTS={}, chat_format=lambda tokenizer: tokenizer.chat_format,
                    accepts_system=lambda tokenizer: True, check_quantize=lambda *a: None)

    calls = _fake_family(monkeypatch, conversation=conversation)
    directory = _directory(tmp_path)
    assert main(["--model", str(directory), "--no-pack", "--chat-format", "fake-format", "--prompt", "a",
                 "--prompt", "b"]) == 0
    assert calls == {"load": (str(directory), "fake-format"), "queries": [("a", 0), ("b", 1)]}
    assert "echo a" in capsys.readouterr().out


@pytest.mark.parametrize("config, message", [
    (None, "not a directory"),
    ({"model_type": "glm"}, "model_type 'glm' is not a ChatGLM2-family model"),
    ({"model_type": "bert"}, "model_type 'bert' is not a ChatGLM2-family model"),
    ("{not json", "not valid JSON"),
])
def test_a_directory_no_chat_family_reads_is_one_line(tmp_path, capsys, config, message):
    """A GLM directory, an unknown family, a file that is not JSON, a missing directory: the default chat
    family's reader says what is wrong, in one line, exit status 2 (as before the contract)."""
    from glm_port.chat import main

    directory = tmp_path / "model"
    if config is not None:
        directory.mkdir()
        (directory / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    assert main(["--model", str(directory), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("glm-chat: error: ") and message in err[0]


def test_glm_convert_converts_any_family_with_a_convert_binding(tmp_path, monkeypatch, capsys):
    from glm_port.convert.native import main

    def convert(calls):
        return dict(to_transformers=lambda src, dst, **kw: calls.setdefault("to", []).append((str(src), str(dst))),
                    from_transformers=lambda src, dst, **kw: calls.setdefault("from", []).append(str(src)),
                    TRANSFORMERS_MODEL_TYPES=("fake_hf",))

    calls = _fake_family(monkeypatch, convert=convert)
    directory = _directory(tmp_path)
    assert main(["--to", "transformers", str(directory), str(tmp_path / "out")]) == 0
    native = tmp_path / "native"
    native.mkdir()
    (native / "config.json").write_text(json.dumps({"model_type": "fake_hf"}))
    assert main(["--from", "transformers", str(native), str(tmp_path / "back")]) == 0
    assert calls == {"to": [(str(directory), str(tmp_path / "out"))], "from": [str(native)]}


def test_glm_convert_on_a_family_that_does_not_convert_is_one_line(tmp_path, capsys):
    from glm_port.convert.native import main

    directory = _directory(tmp_path, "glm")
    assert main(["--to", "transformers", str(directory), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"glm-convert: error: {directory / 'config.json'}: model_type 'glm' is not a ChatGLM2-family "
                   f"model (expected 'chatglm')"]
    assert not (tmp_path / "out").exists()


def test_glm_merge_merges_a_family_kept_in_its_own_layout_through_its_convert_binding(tmp_path, monkeypatch):
    from glm_port.convert.merge import merge

    def convert(calls):
        def merge_checkpoint(src, dst, **options):
            calls["merge"] = (str(src), str(dst), options)
            return {"output": str(dst)}

        return dict(merge_checkpoint=merge_checkpoint)

    calls = _fake_family(monkeypatch, supports=frozenset({"merge"}), convert=convert)  # declared: merged
    directory = _directory(tmp_path)
    assert merge(directory, tmp_path / "out") == {"output": str(tmp_path / "out")}
    assert calls["merge"][:2] == (str(directory), str(tmp_path / "out"))


def test_the_weights_error_is_the_models_one():
    from glm_port.models.chatglm2.weights import read_config

    with pytest.raises(models.WeightsError):
        read_config("/nonexistent/directory")
