"""P-Tuning v2 as THUDM's ChatGLM2 ``ptuning/`` runs it: the prefix encoder's output as every layer's past keys
and values, only the prefix trained, THUDM's checkpoint layout (the prefix keys alone), its loading by
glm-chat / glm-generate / glm-finetune, and the refusals (LoRA at once, a checkpoint that does not fit)."""

import io
import json
import re

import pytest
import torch
from transformers.cache_utils import DynamicCache

from glm_port.models import FAMILIES, FEATURES, Unsupported
from glm_port.models.chatglm2 import ChatGLM2Config, ChatGLM2ForCausalLM
from glm_port.models.chatglm2.model import attach_prefix, prefix_width

from .conftest import SMALL, small_model

PREFIX = "transformer.prefix_encoder."


def prefixed(pre_seq_len=3, projection=False, seed=0, **overrides):
    """A small random model with a prefix; every weight, the prefix encoder's too, random."""
    return small_model(seed=seed, pre_seq_len=pre_seq_len, prefix_projection=projection, **overrides)


def base_of(model):
    """The same weights without the prefix encoder."""
    config = ChatGLM2Config(**{**SMALL, "pre_seq_len": None})
    base = ChatGLM2ForCausalLM(config).eval()
    state = {k: v for k, v in model.state_dict().items() if not k.startswith(PREFIX)}
    base.load_state_dict(state, strict=True)
    return base


def cache_by_hand(model, batch):
    """THUDM's get_prompt read off the embedding directly: row p is [layers, key|value, groups, d]."""
    config = model.config
    table = model.transformer.prefix_encoder.embedding.weight.detach()
    table = table.view(config.pre_seq_len, config.num_layers, 2, config.num_key_value_heads, config.kv_channels)
    cache = DynamicCache(config=config)
    for layer in range(config.num_layers):
        keys = table[:, layer, 0].transpose(0, 1)[None].expand(batch, -1, -1, -1)  # [b, G, P, d]
        values = table[:, layer, 1].transpose(0, 1)[None].expand(batch, -1, -1, -1)
        cache.update(keys.contiguous(), values.contiguous(), layer)
    return cache


def test_prefix_is_past_keys_and_values_before_the_tokens_which_keep_their_positions():
    model = prefixed()
    assert prefix_width(model.config) == 2 * 2 * 2 * 16
    ids = torch.randint(3, 120, (2, 6))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding in the second row
    with torch.no_grad():
        got = model(ids, attention_mask=mask, use_cache=False).logits
        cached = model(ids, attention_mask=mask, use_cache=True).logits
        expected = base_of(model)(ids, attention_mask=torch.cat([torch.ones(2, 3, dtype=mask.dtype), mask], 1),
                                  position_ids=torch.arange(6).expand(2, 6), cache=cache_by_hand(model, 2)).logits
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(cached, expected)
    with torch.no_grad():  # the prefix changes the result (a model that ignored it would pass the above with P=0)
        plain = base_of(model)(ids, attention_mask=mask).logits
    assert not torch.allclose(got[0], plain[0], atol=1e-3)


def test_projection_prefix_is_the_mlp_of_the_embedding():
    model = prefixed(projection=True, prefix_hidden_size=24)
    encoder = model.transformer.prefix_encoder
    assert [tuple(p.shape) for p in encoder.parameters()] == [(3, 128), (24, 128), (24,), (128, 24), (128,)]
    tokens = torch.arange(3)
    with torch.no_grad():
        by_hand = encoder.trans[2](torch.tanh(encoder.trans[0](encoder.embedding(tokens))))
        prompt = model.transformer.get_prompt(1, "cpu", torch.float32)
    layer1_values = by_hand.view(3, 2, 2, 2, 16)[:, 1, 1].transpose(0, 1)
    torch.testing.assert_close(prompt[1][1][0], layer1_values)


def test_cache_decoding_and_generate_match_the_whole_sequence():
    model = prefixed()
    ids = torch.randint(3, 120, (2, 7))
    with torch.no_grad():
        whole = model(ids, use_cache=False).logits
        cache = DynamicCache(config=model.config)
        first = model(ids[:, :4], cache=cache, use_cache=True).logits
        assert cache.get_seq_length() == 3 + 4  # the prefix sits in the cache, before the tokens
        rest = model(ids[:, 4:], cache=cache, use_cache=True).logits
        torch.testing.assert_close(torch.cat([first, rest], 1), whole)
        fast = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False)
        slow = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False,
                              use_cache=False)
    assert torch.equal(fast, slow)


@pytest.mark.parametrize("projection", [False, True])
def test_only_the_prefix_encoder_trains(projection):
    model = prefixed(projection=projection).train()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith(PREFIX) for n in trainable)
    ids = torch.randint(3, 120, (2, 6))
    model(ids, labels=ids, use_cache=False).loss.backward()
    for name, param in model.named_parameters():
        if name.startswith(PREFIX):
            assert param.grad is not None and param.grad.abs().sum() > 0, name
        else:
            assert param.grad is None, name


def test_recompute_gives_the_prefix_the_same_gradients():
    grads = []
    for recompute in (False, True):
        model = prefixed().train()
        if recompute:
            (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
            assert model.transformer.encoder.checkpointing()
        with torch.random.fork_rng():
            torch.manual_seed(1)  # the prefix's dropout draws the same
            ids = torch.randint(3, 120, (2, 6))
            model(ids, labels=ids, use_cache=False).loss.backward()
        grads.append(model.transformer.prefix_encoder.embedding.weight.grad)
    torch.testing.assert_close(grads[0], grads[1])


def test_attach_prefix_keeps_the_base_and_freezes_it():
    model = small_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    attach_prefix(model, 5, prefix_projection=True)
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in before.items())
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {
        PREFIX + n for n in ("embedding.weight", "trans.0.weight", "trans.0.bias", "trans.2.weight", "trans.2.bias")}
    assert model.config.pre_seq_len == 5 and model.config.prefix_projection
    assert model.transformer.prefix_encoder.embedding.weight.dtype == torch.float32


def test_glm_family_refuses_prefix_tuning_in_one_line():
    assert "prefix_tuning" in FAMILIES["chatglm2"].supports and "prefix_tuning" not in FAMILIES["glm"].supports
    with pytest.raises(Unsupported) as error:
        FAMILIES["glm"].require(("--pre_seq_len 8", "prefix_tuning"))
    assert str(error.value) == f"--pre_seq_len 8: the glm family does not support {FEATURES['prefix_tuning']}"


# ---- save / load -----------------------------------------------------------------------------------


def write_checkpoint(tmp_path, projection=False, pre_seq_len=3, **overrides):
    """A base directory (THUDM's layout, tokenizer included) and a P-Tuning checkpoint saved by glm-finetune's
    binding; returns (model, base dir, checkpoint dir)."""
    from glm_port.models.chatglm2.finetune import save_base, save_prefix
    from glm_port.models.chatglm2.tiny import build_tokenizer

    (tmp_path / "tok").mkdir(exist_ok=True)
    tokenizer = build_tokenizer(str(tmp_path / "tok"))
    model = prefixed(pre_seq_len, projection, padded_vocab_size=1024, **overrides)
    save_base(model, tokenizer, tmp_path / "base")
    save_prefix(model, tokenizer, tmp_path / "pt")
    return model, tmp_path / "base", tmp_path / "pt"


@pytest.fixture(autouse=True)
def quiet_saves(monkeypatch):
    """transformers' 'Writing model shards' bar (stderr) off, so the error lines are what the tests read."""
    from transformers.utils import logging

    logging.disable_progress_bar()
    yield
    logging.enable_progress_bar()


@pytest.mark.parametrize("projection", [False, True])
def test_save_writes_thudm_layout_and_loading_gives_equal_logits(tmp_path, projection):
    from glm_port.chat import load as chat_load
    from glm_port.models.chatglm2 import generation
    from glm_port.models.chatglm2.weights import load_pretrained

    model, base, checkpoint = write_checkpoint(tmp_path, projection)
    saved = torch.load(checkpoint / "pytorch_model.bin", weights_only=True)
    assert saved and all(k.startswith(PREFIX) for k in saved)  # THUDM's file: the prefix encoder alone
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["pre_seq_len"] == 3 and config["prefix_projection"] is projection
    assert json.loads((base / "config.json").read_text())["pre_seq_len"] is None
    ids = torch.randint(3, 1000, (2, 5))
    with torch.no_grad():
        expected = model(ids).logits
        for loaded in (load_pretrained(base, ptuning_checkpoint=checkpoint),
                       chat_load(str(base), ptuning_checkpoint=str(checkpoint))[0],
                       generation.load(str(base), ptuning_checkpoint=str(checkpoint))[0]):
            torch.testing.assert_close(loaded(ids).logits, expected)
        # THUDM's own recipe (main.py / web_demo.py): the config with pre_seq_len, the file's prefix_encoder keys
        thudm = ChatGLM2ForCausalLM(ChatGLM2Config.from_pretrained(checkpoint)).eval()
        thudm.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith(PREFIX)}, strict=False)
        thudm.transformer.prefix_encoder.load_state_dict({k[len(PREFIX):]: v for k, v in saved.items()})
        torch.testing.assert_close(thudm(ids).logits, expected)


def test_glm_chat_and_glm_generate_run_a_ptuning_checkpoint(tmp_path, capsys):
    from glm_port import chat as glm_chat
    from glm_port.generation import cli as generate

    _, base, checkpoint = write_checkpoint(tmp_path)
    assert glm_chat.main(["--model", str(base), "--ptuning_checkpoint", str(checkpoint), "--prompt", "hi",
                          "--greedy", "--max-new-tokens", "4"]) == 0
    assert capsys.readouterr().out.startswith("用户：hi\nChatGLM：")
    out = io.StringIO()  # run's own streams: main's default is the sys.stdout of the import
    args = generate.build_parser().parse_args(["--model", str(base), "--ptuning-checkpoint", str(checkpoint),
                                               "--max-new-tokens", "4", "--json", "the cat"])
    generate.run(args, out=out, err=io.StringIO())
    result = json.loads(out.getvalue())
    assert result["prompt"] == "the cat" and result["text"].startswith("the cat")


def test_finetune_trains_the_prefix_lowers_the_loss_and_saves_only_its_keys(tmp_path, capsys):
    from glm_port.finetune.run import main
    from glm_port.models.chatglm2.tiny import build_tiny
    from glm_port.models.chatglm2.weights import load_pretrained

    data = tmp_path / "train.json"
    rows = [{"source": f"question {i}", "target": "yes indeed"} for i in range(16)]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "out"
    main(["--model_name_or_path", "chatglm2-tiny", "--train_file", str(data), "--do_train", "--pre_seq_len", "4",
          "--learning_rate", "2e-2", "--max_steps", "24", "--per_device_train_batch_size", "8", "--logging_steps", "4",
          "--output_dir", str(out)])
    log = capsys.readouterr().out
    losses = [float(x) for x in re.findall(r"lm loss ([0-9.E+-]+)", log)]
    # the frozen model alone cannot move the loss: what falls is the prefix's doing
    assert len(losses) == 6 and all(x < losses[0] for x in losses[1:]) and losses[-1] < losses[0] - 0.05, losses
    assert "trainable parameters: 512 of" in log  # 4 positions x 2 layers x (key, value) x 2 groups x 16
    saved = torch.load(out / "final" / "pytorch_model.bin", weights_only=True)
    assert list(saved) == [PREFIX + "embedding.weight"] and saved[PREFIX + "embedding.weight"].shape == (4, 128)
    assert sorted(p.name for p in (out / "final").iterdir()) == [
        "config.json", "pytorch_model.bin", "tokenizer.model", "tokenizer_config.json"]
    # the embedded base is kept beside it, unchanged by training; the pair loads back
    base_state = load_pretrained(out / "base").state_dict()
    tiny_state = build_tiny()[0].state_dict()
    assert base_state.keys() == tiny_state.keys()
    assert all(torch.equal(base_state[k], tiny_state[k]) for k in tiny_state)
    loaded = load_pretrained(out / "base", ptuning_checkpoint=out / "final")
    assert torch.equal(loaded.transformer.prefix_encoder.embedding.weight, saved[PREFIX + "embedding.weight"])


def test_finetune_evaluates_with_a_ptuning_checkpoint(tmp_path, capsys):
    from glm_port.finetune.run import main

    _, base, checkpoint = write_checkpoint(tmp_path)
    data = tmp_path / "dev.json"
    data.write_text(json.dumps({"source": "a b", "target": "b a"}))
    main(["--model_name_or_path", str(base), "--ptuning_checkpoint", str(checkpoint), "--pre_seq_len", "3",
          "--eval_file", str(data), "--do_eval", "--tgt_length", "4", "--output_dir", str(tmp_path / "out")])
    assert json.loads((tmp_path / "out" / "eval_results.json").read_text()).keys() >= {"rouge-l", "bleu-4"}


# ---- refusals: one line, exit 2, nothing written ---------------------------------------------------


def finetune_refusal(argv, out, capsys):
    from glm_port.finetune.run import main

    with pytest.raises(SystemExit) as stop:
        main(argv + ["--output_dir", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1, err
    assert not out.exists()
    return err[0]


def test_finetune_refuses_ptuning_with_lora_glm_and_tensor_parallel(tmp_path, capsys):
    out = tmp_path / "out"
    err = finetune_refusal(["--model_name_or_path", "chatglm2-tiny", "--pre_seq_len", "4", "--lora"], out, capsys)
    assert err == "glm-finetune: error: --pre_seq_len 4 with --lora: P-Tuning and LoRA exclude each other (one kind of " \
                  "tuning a run)"
    err = finetune_refusal(["--pre_seq_len", "4"], out, capsys)  # the embedded default is a GLM
    assert err == f"glm-finetune: error: --pre_seq_len 4: the glm family does not support {FEATURES['prefix_tuning']}"
    err = finetune_refusal(["--model_name_or_path", "chatglm2-tiny", "--pre_seq_len", "4",
                            "--tensor_parallel_degree", "2"], out, capsys)
    assert err.endswith("a P-Tuning prefix is not split by tensor parallelism")
    err = finetune_refusal(["--model_name_or_path", "chatglm2-tiny", "--ptuning_checkpoint", str(tmp_path / "no")],
                           out, capsys)
    assert err == f"glm-finetune: error: --ptuning_checkpoint {tmp_path / 'no'}: no such directory"
    err = finetune_refusal(["--model_name_or_path", "chatglm2-tiny", "--prefix_projection"], out, capsys)
    assert err == "glm-finetune: error: --prefix_projection needs --pre_seq_len"


def mismatched(tmp_path, **overrides):
    """A checkpoint made for another shape than the base model written beside it."""
    from glm_port.models.chatglm2.finetune import save_prefix
    from glm_port.models.chatglm2.tiny import build_tokenizer

    _, base, _ = write_checkpoint(tmp_path)
    other = prefixed(3, padded_vocab_size=1024, **overrides)
    (tmp_path / "tok2").mkdir()
    save_prefix(other, build_tokenizer(str(tmp_path / "tok2")), tmp_path / "other")
    return base, tmp_path / "other"


def test_a_checkpoint_for_other_layers_is_refused_by_every_loader(tmp_path, capsys):
    from glm_port import chat as glm_chat
    from glm_port.generation import cli as generate

    base, other = mismatched(tmp_path, num_layers=3)
    expected = (f"{other / 'pytorch_model.bin'}: {PREFIX}embedding.weight is [3, 192], a prefix for 3 layers; the "
                f"base model has 2 layers of 2 key/value groups x 16 channels ([pre_seq_len, 128])")
    assert glm_chat.main(["--model", str(base), "--ptuning_checkpoint", str(other), "--prompt", "hi"]) == 2
    with pytest.raises(SystemExit) as stop:
        generate.main(["--model", str(base), "--ptuning_checkpoint", str(other), "hi"])
    assert stop.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"glm-chat: error: {expected}", f"glm-generate: error: {expected}"]
    data = tmp_path / "train.json"
    data.write_text(json.dumps({"source": "a", "target": "b"}))
    err = finetune_refusal(["--model_name_or_path", str(base), "--ptuning_checkpoint", str(other), "--train_file",
                            str(data), "--do_train"], tmp_path / "out", capsys)
    assert err == f"glm-finetune: error: {expected}"


def test_a_checkpoint_of_another_length_is_refused(tmp_path, capsys):
    from glm_port import chat as glm_chat

    _, base, checkpoint = write_checkpoint(tmp_path)
    data = tmp_path / "train.json"
    data.write_text(json.dumps({"source": "a", "target": "b"}))
    err = finetune_refusal(["--model_name_or_path", str(base), "--ptuning_checkpoint", str(checkpoint),
                            "--pre_seq_len", "8", "--train_file", str(data), "--do_train"], tmp_path / "out", capsys)
    assert err == (f"glm-finetune: error: {checkpoint / 'pytorch_model.bin'}: the prefix has 3 positions, not "
                   f"--pre_seq_len 8")
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps({**config, "pre_seq_len": 16}))
    assert glm_chat.main(["--model", str(base), "--ptuning_checkpoint", str(checkpoint), "--prompt", "hi"]) == 2
    assert capsys.readouterr().err.strip() == (f"glm-chat: error: {checkpoint / 'config.json'}: pre_seq_len 16, but "
                                               f"pytorch_model.bin's prefix has 3 positions")
    from glm_port.generation import cli as generate

    with pytest.raises(SystemExit) as stop:
        generate.main(["--model", str(base), "--ptuning_checkpoint", str(checkpoint), "hi"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip() == (f"glm-generate: error: {checkpoint / 'config.json'}: pre_seq_len 16, "
                                               f"but pytorch_model.bin's prefix has 3 positions")


def test_a_checkpoint_given_as_the_model_or_a_base_as_the_checkpoint_is_named(tmp_path, capsys):
    from glm_port import chat as glm_chat
    from glm_port.generation import cli as generate

    _, base, checkpoint = write_checkpoint(tmp_path)
    assert glm_chat.main(["--model", str(checkpoint), "--prompt", "hi"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"glm-chat: error: {checkpoint}: a P-Tuning checkpoint (transformer.prefix_encoder.* weights only), not a "
        f"model: give it as --ptuning_checkpoint beside the base model")
    with pytest.raises(SystemExit):
        generate.main(["--model", str(base), "--ptuning_checkpoint", str(base), "hi"])
    assert capsys.readouterr().err.strip() == (
        f"glm-generate: error: {base / 'model.safetensors'}: no {PREFIX}embedding.weight (not a P-Tuning v2 "
        f"checkpoint)")
    with pytest.raises(SystemExit):
        generate.main(["--model", str(base), "--ptuning_checkpoint", str(checkpoint), "--static-cache", "hi"])
    assert capsys.readouterr().err.strip() == ("glm-generate: error: --ptuning_checkpoint with --static-cache: a "
                                               "P-Tuning prefix runs with a growing cache")
    with pytest.raises(SystemExit):  # before any process group starts
        generate.main(["--model", str(base), "--ptuning_checkpoint", str(checkpoint), "--tensor-parallel-size", "2",
                       "hi"])
    assert capsys.readouterr().err.strip() == ("glm-generate: error: --ptuning_checkpoint with --tensor-parallel-size "
                                               "2: a P-Tuning prefix is not split by tensor parallelism")
    assert glm_chat.main(["--ptuning_checkpoint", str(checkpoint), "--prompt", "hi"]) == 2
    assert capsys.readouterr().err.strip() == ("glm-chat: error: --ptuning_checkpoint needs --model, the base model it "
                                               "was trained on")


def test_quantize_keeps_the_prefix_encoder_in_float(tmp_path):
    from glm_port.models.chatglm2.weights import load_pretrained

    model, base, checkpoint = write_checkpoint(tmp_path, projection=True)
    loaded = load_pretrained(base, ptuning_checkpoint=checkpoint, quantize="int8")
    trans = loaded.transformer.prefix_encoder.trans
    assert type(trans[0]) is torch.nn.Linear and type(trans[2]) is torch.nn.Linear
    assert type(loaded.transformer.encoder.layers[0].mlp.dense_4h_to_h) is not type(trans[0])  # the layers are
    ids = torch.randint(3, 1000, (1, 5))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, atol=0.05, rtol=0.05)


def test_chat_turns_reusing_the_cache_see_the_prefix_and_keep_thudms_positions():
    """stream_chat with a past (glm-chat's cache reuse): the prefix stays in the cache, takes no position, and
    the cache after two turns holds what one pass over the conversation's ids computes."""
    from glm_port.models.chatglm2.chat import build_inputs, build_stream_inputs, stop_ids
    from glm_port.models.chatglm2.config import CACHE_KWARG
    from glm_port.models.chatglm2.tiny import build_tiny

    model, tok = build_tiny()
    torch.manual_seed(3)
    attach_prefix(model, 4, state={"embedding.weight": torch.randn(4, prefix_width(model.config))})
    model.eval()
    history, past, fed = [], None, []
    stops = stop_ids(model, tok)
    for query in ("你好", "晚上好"):
        new = (build_stream_inputs(tok, query, history) if fed else build_inputs(model, tok, query))["input_ids"]
        for response, history, past in model.stream_chat(tok, query, history, past_key_values=past,
                                                         return_past_key_values=True, do_sample=False,
                                                         max_new_tokens=5):
            pass
        context = fed + new[0].tolist()
        reply = model.generate(torch.tensor([context]), do_sample=False, max_new_tokens=5, eos_token_id=stops,
                               pad_token_id=0)[0, len(context):].tolist()
        fed = context + reply[:-1]
        assert past.get_seq_length() == 4 + len(fed)
    with torch.no_grad():
        whole = getattr(model(torch.tensor([fed]), use_cache=True), CACHE_KWARG)
    for ours, fresh in zip(past.layers, whole.layers, strict=True):
        torch.testing.assert_close(ours.keys, fresh.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours.values, fresh.values, atol=1e-5, rtol=1e-5)


# ---- resumable checkpoints: the prefix alone, resumed on the base ------------------------------------


def interrupted_at(out, step):
    """``out`` as a run killed after saving ``step`` leaves it: later checkpoints and final/ gone."""
    import shutil

    checkpoints = out / "checkpoints"
    for entry in checkpoints.iterdir():
        if entry.name.isdigit() and int(entry.name) > step:
            shutil.rmtree(entry)
    (checkpoints / "latest_checkpointed_iteration.txt").write_text(str(step))
    shutil.rmtree(out / "final")


def test_checkpoints_hold_the_prefix_alone_and_resume_on_the_base_exactly(tmp_path, capsys):
    """glm-finetune --pre_seq_len's resumable checkpoints keep the prefix encoder, the optimizer, the schedule and
    the RNG, not the frozen base; a run killed after step 3 and started again takes steps 4-6 as the
    uninterrupted run did (the same losses, the same final prefix, bit for bit), the base read again."""
    from glm_port.finetune.run import main

    _, base, _ = write_checkpoint(tmp_path)
    data = tmp_path / "train.json"
    data.write_text("\n".join(json.dumps({"source": f"question {i}", "target": "yes indeed"}) for i in range(16)))
    out = tmp_path / "out"
    argv = ["--model_name_or_path", str(base), "--train_file", str(data), "--do_train", "--pre_seq_len", "4",
            "--learning_rate", "2e-2", "--max_steps", "6", "--save_steps", "3", "--per_device_train_batch_size", "8",
            "--logging_steps", "1", "--output_dir", str(out)]
    main(argv)
    whole = re.findall(r"iteration +(\d)/ +6 .* lm loss (\S+)", capsys.readouterr().out)
    assert [step for step, _ in whole] == list("123456")
    saved = torch.load(out / "checkpoints" / "3" / "mp_rank_00_model_states.pt", weights_only=True)
    assert "module" not in saved and list(saved["trainable"]) == [PREFIX + "embedding.weight"]
    assert saved["trainable"][PREFIX + "embedding.weight"].shape == (4, 128)
    assert saved["optimizer"]["state"] and "lr_scheduler" in saved and "torch_rng_state" in saved
    assert saved["base_model"] == str(base.resolve()) and saved["trained_part"] == "P-Tuning v2 prefix encoder"
    first = torch.load(out / "final" / "pytorch_model.bin", weights_only=True)

    interrupted_at(out, 3)
    main(argv)
    log = capsys.readouterr().out
    assert f" > resumed from {out / 'checkpoints'} at step 3" in log
    assert re.findall(r"iteration +(\d)/ +6 .* lm loss (\S+)", log) == whole[3:]
    again = torch.load(out / "final" / "pytorch_model.bin", weights_only=True)
    assert list(again) == list(first) and all(torch.equal(again[k], first[k]) for k in first)


def test_resuming_prefix_checkpoints_on_another_base_or_run_is_refused_in_one_line(tmp_path, capsys):
    """Started again in the same --output_dir, a run that does not fit its prefix checkpoints is one line, exit
    2, nothing written: another base, a full finetune (the base is not in them), another --pre_seq_len;
    glm-merge, which wants a whole model, says what they hold."""
    from glm_port.convert.merge import main as merge_main

    _, base, _ = write_checkpoint(tmp_path)
    data = tmp_path / "train.json"
    data.write_text(json.dumps({"source": "a", "target": "b"}))
    out = tmp_path / "out"
    common = ["--train_file", str(data), "--do_train", "--max_steps", "2", "--save_steps", "2"]
    from glm_port.finetune.run import main

    main(["--model_name_or_path", "chatglm2-tiny", "--pre_seq_len", "4", *common, "--output_dir", str(out)])
    capsys.readouterr()
    checkpoint = out / "checkpoints" / "2" / "mp_rank_00_model_states.pt"
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))

    def refused(*flags):
        with pytest.raises(SystemExit) as stop:
            main([*flags, *common, "--output_dir", str(out)])
        err = [line for line in capsys.readouterr().err.strip().splitlines() if "error" in line]
        assert stop.value.code == 2 and len(err) == 1, err
        assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before
        return err[0]

    assert refused("--model_name_or_path", str(base), "--pre_seq_len", "4") == (
        f"glm-finetune: error: {checkpoint}: holds the P-Tuning v2 prefix encoder trained on the embedded "
        f"chatglm2-tiny, not on {base.resolve()}: resume on that base (or start in another output directory)")
    assert refused("--model_name_or_path", "chatglm2-tiny") == (
        f"glm-finetune: error: {checkpoint}: holds only the P-Tuning v2 prefix encoder of a run on the embedded "
        f"chatglm2-tiny (the frozen base is not in it), not the whole model this run trains")
    assert refused("--model_name_or_path", "chatglm2-tiny", "--pre_seq_len", "5") == (
        f"glm-finetune: error: {checkpoint} does not fit this model: {PREFIX}embedding.weight is [4, 128] there, "
        f"[5, 128] here")
    with pytest.raises(SystemExit) as stop:
        merge_main([str(out / "checkpoints"), str(tmp_path / "merged")])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip() == (
        f"glm-merge: error: {checkpoint}: holds only the P-Tuning v2 prefix encoder of a run on the embedded "
        f"chatglm2-tiny (resumable state; the frozen base is not in it), not a model: take the run's final/ directory")
    assert not (tmp_path / "merged").exists()
