"""glm-convert against transformers' own GlmForCausalLM: the converted directory loads with
AutoModelForCausalLM (no remote code) and gives our logits and tokens, which checks our model's numerics
against transformers' implementation; the way back restores THUDM's tensors exactly."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, GlmForCausalLM

from glm_port.convert.native import main as convert_main
from glm_port.models.chatglm2.weights import load_pretrained


@pytest.fixture(scope="module")
def converted(tmp_path_factory, make_model, write_thudm):
    root = tmp_path_factory.mktemp("convert")
    model = make_model(rope_ratio=2.0)
    write_thudm(model, root / "src", shards=3)
    assert convert_main(["--to", "transformers", str(root / "src"), str(root / "hf"), "--max-shard-size", "40KB"]) == 0
    return model, root


def test_transformers_loads_it_and_gives_our_logits(converted):
    model, root = converted
    hf = AutoModelForCausalLM.from_pretrained(root / "hf").eval()
    assert isinstance(hf, GlmForCausalLM)
    assert len(json.loads((root / "hf" / "model.safetensors.index.json").read_text())["weight_map"]) > 0
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 128, (2, 12), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, hf(ids).logits, atol=1e-5, rtol=1e-5)
        ours = model(ids, attention_mask=mask, position_ids=positions).logits
        theirs = hf(ids, attention_mask=mask, position_ids=positions).logits
        torch.testing.assert_close(ours[1], theirs[1], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours[0, 4:], theirs[0, 4:], atol=1e-5, rtol=1e-5)
        kw = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert torch.equal(model.generate(ids, **kw), hf.generate(ids, **kw))


def test_round_trip_restores_thudms_tensors(converted):
    model, root = converted
    assert convert_main(["--from", "transformers", str(root / "hf"), str(root / "back")]) == 0
    back = load_pretrained(root / "back")
    assert back.config.rope_ratio == 2.0 and back.config.multi_query_group_num == 2
    original = model.state_dict()
    assert set(back.state_dict()) == set(original)
    for name, tensor in back.state_dict().items():
        assert torch.equal(tensor, original[name]), name


def test_chatglm2_32k_positions_become_linear_rope(tmp_path, make_model, write_thudm):
    model = make_model(rope_ratio=4.0, rope_ratio_scales="positions")
    write_thudm(model, tmp_path / "src")
    assert convert_main(["--to", "transformers", str(tmp_path / "src"), str(tmp_path / "hf"), "--dtype", "float32"]) == 0
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert hf.config.rope_parameters["rope_type"] == "linear"
    ids = torch.arange(1, 17)[None]
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, hf(ids).logits, atol=1e-5, rtol=1e-5)


def test_bad_input_is_one_line_exit_2(tmp_path, converted, capsys):
    _, root = converted
    (tmp_path / "glm10b").mkdir()
    (tmp_path / "glm10b" / "config.json").write_text(json.dumps({"model_type": "glm", "num_layers": 48}))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    cases = [
        (["--to", "transformers", str(root / "src"), str(tmp_path / "full")], "exists and is not empty"),
        (["--to", "transformers", str(root / "hf"), str(tmp_path / "a")], "model_type 'glm' is not a ChatGLM2"),
        (["--from", "transformers", str(root / "src"), str(tmp_path / "b")], "model_type 'chatglm' is not transformers"),
        (["--to", "transformers", str(tmp_path / "nowhere"), str(tmp_path / "c")], "not a directory"),
        (["--from", "transformers", str(tmp_path / "glm10b"), str(tmp_path / "d")], "not a GlmForCausalLM config"),
    ]
    for argv, message in cases:
        assert convert_main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err, err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_convert_never_writes_over_its_source(tmp_path, make_model, write_thudm, capsys):
    """DST may neither be, contain nor lie inside SRC (symbolic links resolved): refused before reading."""
    run = tmp_path / "run"
    write_thudm(make_model(), run / "model")
    (run / "other.txt").write_text("notes")
    (tmp_path / "link").symlink_to(run)
    before = {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    for src, dst, message in [(run / "model", run, "contains the input SRC"),
                              (run / "model", tmp_path / "link", "contains the input SRC"),
                              (run / "model", run / "model" / "hf", "is inside the input SRC"),
                              (run / "model", run / "model", "the output cannot be the input")]:
        assert convert_main(["--to", "transformers", str(src), str(dst)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, err
        assert {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()} == before
    assert not [p for p in tmp_path.rglob(".*")]


def test_a_truncated_safetensors_file_is_named_by_every_command(tmp_path, capsys):
    """glm-generate, glm-chat and glm-convert ended in a SafetensorError traceback naming no file."""
    from glm_port.chat import main as chat_main
    from glm_port.generation.cli import main as generate_main
    from glm_port.models.chatglm2.finetune import save
    from glm_port.models.chatglm2.tiny import build_tiny

    (tmp_path / "tokenizer").mkdir()
    save(*build_tiny(str(tmp_path / "tokenizer")), tmp_path / "model")
    weights = tmp_path / "model" / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:len(data) // 2])
    capsys.readouterr()
    for run in (lambda: convert_main(["--to", "transformers", str(tmp_path / "model"), str(tmp_path / "hf")]),
                lambda: generate_main(["--model", str(tmp_path / "model"), "hello"]),
                lambda: chat_main(["--model", str(tmp_path / "model")])):
        try:
            code = run()
        except SystemExit as stop:
            code = stop.code
        assert code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"{weights}: not a readable safetensors file" in err, err
    assert not (tmp_path / "hf").exists() and not [p for p in tmp_path.rglob(".*")]


def test_a_full_disk_during_a_chatglm2_merge_is_one_line_and_leaves_nothing(tmp_path, capsys, monkeypatch):
    import safetensors.torch

    from glm_port.convert.merge import main as merge_main
    from glm_port.models.chatglm2.finetune import save
    from glm_port.models.chatglm2.tiny import build_tiny

    (tmp_path / "tokenizer").mkdir()
    save(*build_tiny(str(tmp_path / "tokenizer")), tmp_path / "src")
    capsys.readouterr()

    def full_disk(tensors, filename, metadata=None):
        from safetensors import SafetensorError

        with open(filename, "wb") as handle:
            handle.write(b"\0" * 64)
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    with pytest.raises(SystemExit) as stop:
        merge_main([str(tmp_path / "src"), str(tmp_path / "merged")])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"{tmp_path / 'merged' / 'model.safetensors'}: could not be written (No space left on device" in err, err
    assert not (tmp_path / "merged").exists() and not [p for p in tmp_path.rglob(".*")]


def test_an_unreadable_tokenizer_model_is_one_line_before_any_tensor(tmp_path, make_model, write_thudm, capsys,
                                                                      monkeypatch):
    from glm_port.models.chatglm2.weights import TensorSource

    write_thudm(make_model(), tmp_path / "src")
    (tmp_path / "src" / "tokenizer.model").write_bytes(b"not a sentencepiece model")
    read = []
    monkeypatch.setattr(TensorSource, "__getitem__", lambda self, name: read.append(name))
    assert convert_main(["--to", "transformers", str(tmp_path / "src"), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "tokenizer.model: not a readable sentencepiece model" in err, err
    assert not read and not (tmp_path / "hf").exists() and not [p for p in tmp_path.rglob(".*")]


def test_a_vocabulary_holding_a_specials_name_is_refused_before_any_tensor(tmp_path, make_model, write_thudm,
                                                                          capsys):
    """A sentencepiece model with a piece named [gMASK]: the fast tokenizer could not give THUDM's ids."""
    import sentencepiece as spm

    from glm_port.models.chatglm2.tiny import corpus_lines

    write_thudm(make_model(), tmp_path / "src")
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus_lines(100)), model_prefix=str(tmp_path / "sp"), vocab_size=600,
        model_type="bpe", byte_fallback=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2,
        hard_vocab_limit=False, user_defined_symbols=["[gMASK]"])
    (tmp_path / "src" / "tokenizer.model").write_bytes((tmp_path / "sp.model").read_bytes())
    assert convert_main(["--to", "transformers", str(tmp_path / "src"), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "the specials would not get THUDM's ids" in err, err
    assert not (tmp_path / "hf").exists()
