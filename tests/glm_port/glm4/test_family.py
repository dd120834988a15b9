"""GLM-4 as glm_port's third family (issue 27): detection, both directory layouts, logits against transformers'
own ``GlmForCausalLM``, the cache, and glm-chat / glm-generate on a tiny GLM-4 directory."""

from __future__ import annotations

import io
import json

import pytest
import torch
from transformers import GlmConfig, GlmForCausalLM

from glm_port.models import FAMILIES, family_at
from glm_port.models.glm4 import GLM4Config, GLM4ForCausalLM, GLM4Tokenizer
from glm_port.models.glm4.tiny import tiny_config, write_directory
from glm_port.models.glm4.weights import load_pretrained

torch.set_num_threads(1)
IDS = torch.tensor([[3, 17, 250, 9, 511, 40, 961, 7, 88, 300, 2, 64]])


def randomized(model, seed=0, std=0.3):
    """Every weight random (norms and biases too), so that no term of the network hides."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, std)
    return model.eval()


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from glm_port.models.glm4.tiny import build_tokenizer

    return build_tokenizer(str(tmp_path_factory.mktemp("glm4-tok")))


@pytest.fixture(scope="module")
def model(tokenizer):
    return randomized(GLM4ForCausalLM(tiny_config(tokenizer)))


@pytest.fixture(scope="module")
def dirs(model, tokenizer, tmp_path_factory):
    root = tmp_path_factory.mktemp("glm4-dirs")
    return {layout: write_directory(model, tokenizer, root / layout, layout) for layout in ("thudm", "transformers")}


def test_the_config_defaults_are_glm_4_9b_chats():
    config = GLM4Config()
    assert (config.num_layers, config.hidden_size, config.ffn_hidden_size, config.padded_vocab_size) == \
        (40, 4096, 13696, 151552)
    assert (config.num_attention_heads, config.kv_channels, config.multi_query_group_num) == (32, 128, 2)
    assert (config.seq_length, config.rope_ratio, config.layernorm_epsilon) == (131072, 500, 1.5625e-07)
    assert config.eos_token_id == [151329, 151336, 151338] and config.pad_token_id == 151329
    assert config.add_qkv_bias and not config.add_bias_linear and config.model_type == "chatglm"


def test_a_thudm_layout_config_json_holds_original_rope(dirs):
    """THUDM's GLM-4 ``modeling_chatglm.py`` reads ``config.original_rope``, which its ``ChatGLMConfig`` does not
    default (glm-4-9b-chat's config.json sets it true): a directory written in THUDM's layout must say it, or THUDM's
    code cannot load it (AttributeError)."""
    with open(f"{dirs['thudm']}/config.json", encoding="utf-8") as f:
        assert json.load(f)["original_rope"] is True


def test_both_layouts_load_to_the_same_logits(model, dirs):
    expected = model(IDS).logits
    for layout, directory in dirs.items():
        loaded = load_pretrained(directory)
        assert isinstance(loaded, GLM4ForCausalLM) and loaded.config.rope_ratio == 500, layout
        torch.testing.assert_close(loaded(IDS).logits, expected, rtol=0, atol=0, msg=layout)


def test_logits_equal_transformers_glm_for_causal_lm(model, dirs):
    """transformers' own GlmForCausalLM on the transformers-layout directory gives our logits (rotary base
    10000 x rope_ratio, partial rotary 0.5, the QKV split), and a padded batch too."""
    reference = GlmForCausalLM.from_pretrained(dirs["transformers"]).eval()
    assert reference.config.rope_parameters["rope_theta"] == 5_000_000.0
    ours = load_pretrained(dirs["thudm"])
    torch.testing.assert_close(ours(IDS).logits, reference(IDS).logits, rtol=0, atol=1e-5)
    batch = torch.cat([IDS, IDS.roll(3, dims=1)])
    mask = torch.ones_like(batch)
    mask[1, :4] = 0
    got = ours(batch, attention_mask=mask).logits
    want = reference(batch, attention_mask=mask).logits
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(got[1, 4:], want[1, 4:], rtol=0, atol=1e-5)


def test_a_glm_written_by_transformers_loads_to_its_logits(tmp_path, tokenizer):
    """Weights made by transformers itself (its key names, its GlmConfig), not by our writer."""
    config = GlmConfig(vocab_size=1024, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                       attention_bias=True, rms_norm_eps=1e-5, tie_word_embeddings=False,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0 * 500,
                                        "partial_rotary_factor": 0.5},
                       eos_token_id=tokenizer.stop_ids, pad_token_id=tokenizer.eos_token_id)
    reference = randomized(GlmForCausalLM(config), seed=1)
    reference.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    assert family_at(tmp_path).name == "glm4"
    ours = load_pretrained(tmp_path)
    assert ours.config.rope_ratio == 500 and ours.config.ffn_hidden_size == 96
    torch.testing.assert_close(ours(IDS).logits, reference(IDS).logits, rtol=0, atol=1e-5)


def test_the_rotary_base_is_scaled_by_rope_ratio(model, dirs):
    """The check above would not see a rope_ratio left unread if it changed nothing: it does."""
    plain = GLM4ForCausalLM(GLM4Config(**{**model.config.to_diff_dict(), "rope_ratio": 1}))
    plain.load_state_dict(model.state_dict())
    assert (plain.eval()(IDS).logits - model(IDS).logits).abs().max() > 1e-3


# ---------------------------------------------------------------- detection
def test_the_detector_tells_glm4_from_chatglm2_and_glm(tmp_path, dirs):
    from glm_port.models.chatglm2 import ChatGLM2Config
    from glm_port.models.chatglm2.tiny import build_tokenizer as chatglm2_tokenizer

    assert family_at(dirs["thudm"]).name == "glm4"
    assert family_at(dirs["transformers"]).name == "glm4"
    assert family_at(f"{dirs['thudm']}/model.safetensors").name == "glm4"
    chatglm2 = tmp_path / "chatglm2"  # model_type chatglm too, a sentencepiece tokenizer.model
    ChatGLM2Config(padded_vocab_size=1024).save_pretrained(chatglm2)
    chatglm2_tokenizer(str(chatglm2))
    assert (chatglm2 / "tokenizer.model").is_file() and family_at(chatglm2).name == "chatglm2"
    bare = tmp_path / "bare"  # no tokenizer files: the vocabulary tells
    ChatGLM2Config().save_pretrained(bare)
    assert family_at(bare).name == "chatglm2"
    GLM4Config().save_pretrained(bare)
    assert family_at(bare).name == "glm4"
    small = tmp_path / "small"  # no tokenizer files, a small vocabulary: the class glm_port names a GLM-4 by tells
    ChatGLM2Config(padded_vocab_size=1024, architectures=["ChatGLMModel"]).save_pretrained(small)
    assert family_at(small).name == "chatglm2"  # THUDM's name, ChatGLM2's and GLM-4's alike
    GLM4Config(padded_vocab_size=1024, architectures=["GLM4ForCausalLM"]).save_pretrained(small)
    assert family_at(small).name == "glm4"
    thudm_config = tmp_path / "named"  # THUDM's tokenizer_config.json names ChatGLM4Tokenizer
    ChatGLM2Config(padded_vocab_size=1024).save_pretrained(thudm_config)
    (thudm_config / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "ChatGLM4Tokenizer"}))
    assert family_at(thudm_config).name == "glm4"
    glm10b = tmp_path / "glm10b"  # THUDM's GLM-10b: model_type glm, not transformers' GlmForCausalLM
    glm10b.mkdir()
    (glm10b / "config.json").write_text(json.dumps({"model_type": "glm", "architectures": ["GLMModel"],
                                                    "num_layers": 2, "vocab_size": 151552}))
    assert family_at(glm10b).name == "glm"
    converted = tmp_path / "chatglm2-hf"  # glm-convert --to transformers of a ChatGLM2: its sentencepiece model
    converted.mkdir()
    (converted / "config.json").write_text(json.dumps({"model_type": "glm", "architectures": ["GlmForCausalLM"]}))
    (converted / "tokenizer.model").write_bytes((chatglm2 / "tokenizer.model").read_bytes())
    assert family_at(converted).name == "glm"


def test_glm4s_bindings_are_the_contracts(dirs, model, tokenizer):
    """GLM-4 reaches glm-chat through its ``conversation`` binding and names its directories' tensors through its
    ``weights`` binding (``open_weights``: THUDM's names from either layout, read when asked); a loaded GLM-4 model is
    told from a ChatGLM2 one (both say model_type "chatglm") by its class."""
    from glm_port.models import family_of
    from glm_port.models.chatglm2.tiny import build_tiny as chatglm2_tiny
    from glm_port.models.contract import missing

    family = FAMILIES["glm4"]
    for kind in ("conversation", "weights", "generation", "chat", "tiny"):
        assert missing(kind, family.binding(kind)) == [], kind
    conversation = family.binding("conversation")
    assert conversation.CHAT_FORMATS == ("glm4",) and conversation.accepts_system(tokenizer)
    expected = model.state_dict()
    for layout in ("thudm", "transformers"):
        weights = family.binding("weights").open_weights(dirs[layout])
        assert set(weights) == set(expected), layout
        assert all(torch.equal(weights[name], expected[name]) for name in expected), layout
    assert family_of(model) is family and family_of(chatglm2_tiny()[0]) is FAMILIES["chatglm2"]


def test_a_chatglm2_directory_is_refused_by_the_glm4_loader(tmp_path):
    from glm_port.models.chatglm2 import ChatGLM2Config
    from glm_port.models.chatglm2.weights import WeightsError

    ChatGLM2Config(padded_vocab_size=1024).save_pretrained(tmp_path)
    with pytest.raises(WeightsError, match="not a GLM-4 directory"):
        load_pretrained(tmp_path)


def test_a_missing_weight_is_one_line(tmp_path, model, tokenizer):
    from safetensors.torch import load_file, save_file

    from glm_port.models.chatglm2.weights import WeightsError

    write_directory(model, tokenizer, tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    del state["transformer.encoder.layers.1.mlp.dense_4h_to_h.weight"]
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(WeightsError, match="weight transformer.encoder.layers.1.mlp.dense_4h_to_h.weight missing"):
        load_pretrained(tmp_path)


# ---------------------------------------------------------------- the cache
def test_the_cache_gives_the_full_forwards_logits(model):
    full = model(IDS).logits
    prefix = model(IDS[:, :7], use_cache=True)
    from glm_port.models.chatglm2.config import CACHE_KWARG

    cache = getattr(prefix, CACHE_KWARG)
    steps = [prefix.logits]
    for i in range(7, IDS.shape[1]):
        out = model(IDS[:, i:i + 1], **{CACHE_KWARG: cache}, use_cache=True)
        cache = getattr(out, CACHE_KWARG)
        steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-5)
    kwargs = dict(max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert model.generate(IDS, use_cache=True, **kwargs).tolist() == model.generate(IDS, use_cache=False, **kwargs).tolist()


# ---------------------------------------------------------------- the commands
@pytest.mark.parametrize("layout", ["thudm", "transformers"])
def test_glm_chat_runs_on_a_glm4_directory_in_glm4s_chat_format(dirs, layout, generate_calls, capsys):
    from glm_port.chat import main

    assert main(["--model", dirs[layout], "--greedy", "--max-new-tokens", "3", "--no-pack",
                 "--prompt", "你好", "--prompt", "hi"]) == 0
    tokenizer = GLM4Tokenizer.from_pretrained(dirs[layout])
    first = generate_calls[0]["input_ids"][0].tolist()
    assert tokenizer.decode(first) == "[gMASK]<sop><|user|>\n你好<|assistant|>"
    assert generate_calls[0]["eos_token_id"] == tokenizer.stop_ids
    second = generate_calls[1]["input_ids"][0].tolist()  # the cache holds turn one: this turn's ids only
    assert tokenizer.decode(second) == "[gMASK]<sop><|user|>\nhi<|assistant|>"
    out = capsys.readouterr().out
    assert out.count("ChatGLM：") == 2


def test_glm_chat_with_a_system_prompt_and_without_cache_reuse(dirs, generate_calls, capsys):
    from glm_port.chat import main

    assert main(["--model", dirs["thudm"], "--greedy", "--max-new-tokens", "2", "--no-pack", "--no-cache-reuse",
                 "--system", "Be brief.", "--prompt", "你好", "--prompt", "hi"]) == 0
    tokenizer = GLM4Tokenizer.from_pretrained(dirs["thudm"])
    text = tokenizer.decode(generate_calls[1]["input_ids"][0].tolist())
    assert text.startswith("[gMASK]<sop><|system|>\nBe brief.<|user|>\n你好<|assistant|>")
    assert text.endswith("<|user|>\nhi<|assistant|>")


def test_glm_chat_on_the_embedded_tiny_glm4(tokenizer, generate_calls, capsys):
    """``--chat-format glm4`` with no --model: the embedded tiny GLM-4 (its rank file trained the same way)."""
    from glm_port.chat import main

    assert main(["--chat-format", "glm4", "--greedy", "--max-new-tokens", "2", "--no-pack", "--prompt", "你好"]) == 0
    assert tokenizer.decode(generate_calls[0]["input_ids"][0].tolist()) == "[gMASK]<sop><|user|>\n你好<|assistant|>"
    assert generate_calls[0]["eos_token_id"] == tokenizer.stop_ids


@pytest.mark.parametrize("argv, message", [
    (["--chat-format", "chatglm3"], "is a glm4 model, whose chat format is glm4"),
    (["--quantize", "int4"], "int4 group size 128 does not divide the row of 64 input features"),
])
def test_glm_chat_refuses_what_glm4_lacks_in_one_line(dirs, argv, message, capsys):
    from glm_port.chat import main

    assert main(["--model", dirs["thudm"], *argv, "--prompt", "hi"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


@pytest.mark.parametrize("layout", ["thudm", "transformers"])
def test_glm_generate_continues_prompts_on_a_glm4_directory(dirs, layout, generate_calls):
    from glm_port.generation import cli

    out = io.StringIO()
    results = cli.run(cli.build_parser().parse_args(["--model", dirs[layout], "--max-new-tokens", "4", "--json",
                                                     "hello world", "the cat"]), out=out, err=io.StringIO())
    tokenizer = GLM4Tokenizer.from_pretrained(dirs[layout])
    rows = generate_calls[0]["input_ids"].tolist()
    assert tokenizer.decode(rows[0]).endswith("[gMASK]<sop>hello world")  # left padding first
    assert [json.loads(line)["prompt"] for line in out.getvalue().splitlines()] == ["hello world", "the cat"]
    assert all(r["text"].startswith(r["prompt"]) for r in results)


def test_generation_ends_at_any_of_the_configs_end_ids(model, tokenizer):
    """GLM-4's config lists three end ids: the continuation is cut at the first of them."""
    from glm_port.models.glm4.generation import generate

    free = generate(model, tokenizer, ["hello"], max_new_tokens=4, do_sample=False)[0]["generated_ids"][0]
    assert free, "the random model ended at once"
    saved = model.config.eos_token_id
    model.config.eos_token_id = [tokenizer.eos_token_id, free[1]]
    try:
        cut = generate(model, tokenizer, ["hello"], max_new_tokens=4, do_sample=False)[0]["generated_ids"][0]
    finally:
        model.config.eos_token_id = saved
    assert cut == free[:free.index(free[1])]


@pytest.mark.parametrize("argv, message", [
    (["--pipeline-parallel-size", "2"], "--pipeline-parallel-size 2: the glm4 family does not support pipeline"),
    (["--quantize", "int4"], "int4 group size 128 does not divide the row of 64 input features"),
])
def test_glm_generate_refuses_what_glm4_does_not_support_in_one_line(dirs, argv, message, capsys):
    from glm_port.generation import cli

    with pytest.raises(SystemExit) as stop:
        cli.main(["--model", dirs["thudm"], *argv, "hi"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_glm_generate_static_cache_gives_the_growing_caches_continuations(dirs, generate_calls):
    from glm_port.generation import cli

    def run(*flags):
        args = cli.build_parser().parse_args(["--model", dirs["thudm"], "--max-new-tokens", "6", "--no-pack", *flags,
                                              "hello world", "the cat sat"])
        return [r["sequence"] for r in cli.run(args, out=io.StringIO(), err=io.StringIO())]

    assert run("--static-cache") == run()
    assert generate_calls[0].get("cache_implementation") == "static" and "cache_implementation" not in generate_calls[1]


def test_quantize_keeps_the_output_layer_and_follows_the_float_model(model, tokenizer, dirs, generate_calls):
    import copy

    from glm_port.generation import cli
    from shim.nn import Int8Linear

    quantized = copy.deepcopy(model)
    assert FAMILIES["glm4"].quantize(quantized, "int8") == 4 * model.config.num_layers
    assert type(quantized.transformer.output_layer) is torch.nn.Linear
    assert isinstance(quantized.transformer.encoder.layers[0].mlp.dense_h_to_4h, Int8Linear)
    with torch.no_grad():
        a, b = model(IDS).logits, quantized(IDS).logits
    assert torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0) > 0.99
    results = cli.run(cli.build_parser().parse_args(["--model", dirs["thudm"], "--max-new-tokens", "3", "--quantize",
                                                     "int8", "hi"]), out=io.StringIO(), err=io.StringIO())
    assert len(results) == 1 and len(generate_calls) == 1


# ---------------------------------------------------------------- the chat API and the server's binding
def test_model_chat_returns_the_reply_and_glm4s_history(model, tokenizer):
    response, history = model.chat(tokenizer, "你好", do_sample=False, max_new_tokens=3)
    assert isinstance(response, str)
    assert history[0] == {"role": "user", "content": "你好"} and history[1]["role"] == "assistant"


def test_a_reply_naming_a_declared_function_is_a_tool_call(tokenizer):
    from glm_port.models.glm4 import chat

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    ids = tokenizer.encode('get_weather\n{"city": "北京"}', add_special_tokens=False)
    assert chat.parse_reply(tokenizer, ids, tools) == ("", [{"name": "get_weather", "arguments": '{"city": "北京"}'}])
    assert chat.parse_reply(tokenizer, ids, tools, final=False) == ("", [])
    plain = tokenizer.encode("\n你好！", add_special_tokens=False)
    assert chat.parse_reply(tokenizer, plain, tools) == ("你好！", [])
    response, _ = chat.process_response('get_weather\n{"city": "北京"}', [{"role": "system", "content": "",
                                                                          "tools": tools}])
    assert response == {"name": "get_weather", "parameters": {"city": "北京"}}


def test_encode_messages_is_the_chat_template(model, tokenizer):
    from glm_port.models.glm4 import chat

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    messages = [{"role": "user", "content": "天气？"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"function": {"name": "get_weather", "arguments": '{"city": "北京"}'}}]},
                {"role": "tool", "content": "晴"}]
    text = tokenizer.decode(chat.encode_messages(tokenizer, messages, tools))
    assert text.startswith("[gMASK]<sop><|system|>\n") and "## get_weather" in text
    assert text.endswith('<|user|>\n天气？<|assistant|>get_weather\n{"city": "北京"}<|observation|>\n晴<|assistant|>')
    assert FAMILIES["glm4"].binding("chat") is chat
    assert chat.reply_stop_ids(model, tokenizer) == tokenizer.stop_ids


def test_glm_serve_loads_a_glm4_directory_and_chats_as_generate_does(dirs):
    """glm-serve reaches GLM-4 through the registry only: the family, its generation and chat bindings; a greedy
    reply from the engine's batch is what transformers' generate gives on the same prompt."""
    import threading

    from glm_port.serve.engine import Engine, Sampling, Sequence, ServedModel

    served = ServedModel.load(dirs["thudm"])
    assert served.family.name == "glm4" and served.chat_format == "glm4" and served.stepped
    ids = served.encode_chat([{"role": "user", "content": "你好"}])
    assert served.tokenizer.decode(ids) == "[gMASK]<sop><|user|>\n你好<|assistant|>"
    assert served.stop_ids(True) == frozenset(served.tokenizer.stop_ids)
    done, events = threading.Event(), []

    def notify(event):
        events.append(event)
        if event.finish_reason:
            done.set()

    engine = Engine(served)
    try:
        engine.submit([Sequence(ids, Sampling(max_tokens=5, temperature=0), notify)])
        assert done.wait(60)
    finally:
        engine.close()
    expected = served.model.generate(torch.tensor([ids]), max_new_tokens=5, do_sample=False,
                                     eos_token_id=served.tokenizer.stop_ids, pad_token_id=0)[0, len(ids):].tolist()
    expected = next((expected[:i] for i, t in enumerate(expected) if t in served.tokenizer.stop_ids), expected)
    content, _ = served.parse_reply(expected)
    assert content and events[-1].content == content


def test_a_directory_with_only_a_tokenizer_json_loads_with_the_same_ids(tmp_path, model, tokenizer, generate_calls):
    """glm-4-9b-chat-hf carries a ``tokenizer.json`` (transformers' TikTokenConverter on the rank file) and no
    ``tokenizer.model``: its ranks are read back from it, the chat template from the directory."""
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    from glm_port.chat import main as chat_main
    from glm_port.models.glm4.tokenizer import PAT_STR, SPECIAL_TOKENS
    from glm_port.models.glm4.weights import load_tokenizer

    directory = tmp_path / "hf"
    write_directory(model, tokenizer, directory, "transformers")
    for name in ("tokenizer.model", "tokenizer_config.json", "added_tokens.json"):
        (directory / name).unlink(missing_ok=True)
    converted = TikTokenConverter(tokenizer.vocab_file, pattern=PAT_STR, extra_special_tokens=list(SPECIAL_TOKENS))
    PreTrainedTokenizerFast(tokenizer_object=converted.converted(), eos_token="<|endoftext|>",
                            pad_token="<|endoftext|>", padding_side="left",
                            chat_template=tokenizer.chat_template).save_pretrained(directory)
    assert not (directory / "tokenizer.model").exists() and family_at(directory).name == "glm4"
    loaded = load_tokenizer(directory)
    assert loaded.ranks == tokenizer.ranks and loaded.chat_template == tokenizer.chat_template
    for text in ("hello world", "你好，今天天气很好。\n  spaces  "):
        assert loaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert chat_main(["--model", str(directory), "--greedy", "--max-new-tokens", "2", "--no-pack",
                      "--prompt", "你好"]) == 0
    assert tokenizer.decode(generate_calls[0]["input_ids"][0].tolist()) == "[gMASK]<sop><|user|>\n你好<|assistant|>"


def test_a_tokenizer_json_of_another_vocabulary_is_one_line(tmp_path):
    from glm_port.models.chatglm2.weights import WeightsError
    from glm_port.models.glm4.weights import load_tokenizer

    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"type": "WordPiece", "vocab": {}}}))
    with pytest.raises(WeightsError, match="not a byte-level BPE vocabulary"):
        load_tokenizer(tmp_path)


def test_the_embedded_tiny_glm4_samples_only_ids_its_tokenizer_decodes():
    """The tiny model's vocabulary is its tokenizer's, with no padding rows: a random model samples every row, and
    the tokenizer refuses ids it has no token for (glm-generate failed on them)."""
    from glm_port.models.glm4.generation import generate
    from glm_port.models.glm4.tiny import build_tiny

    model, tok = build_tiny()
    assert model.config.padded_vocab_size == len(tok)
    torch.manual_seed(0)
    results = generate(model, tok, ["hello", "你好"], max_new_tokens=48, do_sample=True, temperature=2.0)
    assert all(max(r["generated_ids"][0], default=0) < len(tok) for r in results)
