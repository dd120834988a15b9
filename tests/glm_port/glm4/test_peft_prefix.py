"""A P-Tuning v2 prefix trained as THUDM's GLM-4 finetune_demo trains it, through PEFT (``PrefixTuningConfig``,
``peft_type: PREFIX_TUNING``, ``num_attention_heads`` = the key/value groups, ``token_dim`` = groups x channels, as
its ``configs/ptuning_v2.yaml`` sets them for glm-4-9b): the PEFT directory (``adapter_config.json`` +
``adapter_model.safetensors`` holding ``prompt_embeddings``) written here by PEFT's own ``save_pretrained`` from
PEFT wrapped around our GLM-4, loaded by glm-generate's and glm-chat's ``--ptuning_checkpoint``, gives the logits
PEFT's own ``PeftModel`` gives over the same base."""

from __future__ import annotations

import io
import json

import pytest
import torch

from glm_port.models import FAMILIES

torch.set_num_threads(1)
IDS = torch.tensor([[3, 17, 250, 9, 511, 40, 961, 7], [88, 300, 2, 64, 5, 6, 7, 8]])
MASK = torch.tensor([[1] * 8, [0, 0, 0, 1, 1, 1, 1, 1]])  # the second row left-padded
LENGTH = 5


def peft_directory(base, directory, projection=False, **overrides):
    """PEFT's prefix tuning on our GLM-4 read from ``base`` (finetune_demo's ``get_peft_model``), its prompt encoder
    drawn at random (std 0.5), saved by PEFT's ``save_pretrained`` into ``directory``."""
    from peft import PrefixTuningConfig, get_peft_model

    from glm_port.models.glm4.weights import load_pretrained

    model = load_pretrained(base)
    groups, channels = model.config.num_key_value_heads, model.config.kv_channels
    settings = dict(task_type="CAUSAL_LM", num_virtual_tokens=LENGTH, num_attention_heads=groups,
                    token_dim=groups * channels, prefix_projection=projection, encoder_hidden_size=24)
    peft_model = get_peft_model(model, PrefixTuningConfig(**{**settings, **overrides}))
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in peft_model.prompt_encoder.parameters():
            parameter.normal_(0, 0.5)
    peft_model.save_pretrained(str(directory))
    return directory


def peft_logits(base, directory):
    """PEFT's own logits for ``IDS`` / ``MASK``: ``PeftModel.from_pretrained`` over the base, the base run as
    ``PeftModelForCausalLM.forward`` runs it for prefix tuning (``past_key_values`` = PEFT's ``get_prompt``, the
    attention mask opened over the virtual tokens), with the tokens numbered from 0 as THUDM's GLM-4
    ``ChatGLMModel`` numbers them when given no ``position_ids`` (finetune_demo's training). (``PeftModel.forward``
    itself (PEFT 0.21, installed here) adds ``num_virtual_tokens`` to ``position_ids`` passed to it, which THUDM's model
    never sees in training; so the base is called here with PEFT's cache rather than through that offset.)"""
    from peft import PeftModel

    from glm_port.models.glm4.weights import load_pretrained

    peft_model = PeftModel.from_pretrained(load_pretrained(base), str(directory)).eval()
    batch, seq = IDS.shape
    with torch.no_grad():
        return peft_model.get_base_model()(
            input_ids=IDS, attention_mask=torch.cat([torch.ones(batch, LENGTH, dtype=MASK.dtype), MASK], dim=1),
            past_key_values=peft_model.get_prompt(batch), position_ids=torch.arange(seq).expand(batch, seq)).logits


def test_peft_saves_prefix_tuning_as_finetune_demo_gets_it(base, tmp_path):
    """What the loader reads: PEFT's adapter_config.json and one tensor, prompt_embeddings [P, L * 2 * G * d]."""
    from safetensors.torch import load_file

    directory = peft_directory(base, tmp_path / "peft")
    config = json.loads((directory / "adapter_config.json").read_text())
    assert config["peft_type"] == "PREFIX_TUNING" and config["num_virtual_tokens"] == LENGTH
    assert (config["num_layers"], config["num_attention_heads"], config["token_dim"]) == (2, 2, 2 * 16)
    assert {k: list(v.shape) for k, v in load_file(directory / "adapter_model.safetensors").items()} == {
        "prompt_embeddings": [LENGTH, 2 * 2 * 2 * 16]}


@pytest.mark.parametrize("projection", [False, True])
def test_a_peft_prefix_directory_on_glm4_gives_peft_model_logits(base, projection, tmp_path):
    directory = peft_directory(base, tmp_path / "peft", projection)
    generation = FAMILIES["glm4"].binding("generation")
    loaded, _ = generation.load(base, ptuning_checkpoint=directory)
    plain, _ = generation.load(base)
    expected = peft_logits(base, directory)
    with torch.no_grad():
        torch.testing.assert_close(loaded(IDS, attention_mask=MASK).logits, expected, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(plain(IDS, attention_mask=MASK).logits, expected, atol=1e-2)  # the prefix matters
    assert loaded.config.pre_seq_len == LENGTH and not loaded.config.prefix_projection


def test_glm_generate_and_glm_chat_take_a_peft_prefix_directory(base, tmp_path, capsys):
    from glm_port import chat as glm_chat
    from glm_port.generation import cli as generate

    directory = peft_directory(base, tmp_path / "peft")
    assert glm_chat.main(["--model", base, "--ptuning_checkpoint", str(directory), "--prompt", "hi", "--greedy",
                          "--max-new-tokens", "3"]) == 0
    assert "hi" in capsys.readouterr().out
    out = io.StringIO()
    args = generate.build_parser().parse_args(["--model", base, "--ptuning_checkpoint", str(directory),
                                               "--max-new-tokens", "3", "--json", "the cat"])
    generate.run(args, out=out, err=io.StringIO())
    assert json.loads(out.getvalue())["text"].startswith("the cat")


def _refused(base, directory, capsys) -> str:
    from glm_port.generation import cli as generate

    with pytest.raises(SystemExit) as stop:
        generate.main(["--model", base, "--ptuning_checkpoint", str(directory), "the cat"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_a_peft_prefix_of_the_query_heads_width_is_one_line_exit_2(base, tmp_path, capsys):
    """PEFT's defaults from a config without ``num_key_value_heads`` (THUDM's says ``multi_query_group_num``) are
    the query heads and the hidden width: a prefix that does not fit GLM-4's 2 key/value groups."""
    directory = peft_directory(base, tmp_path / "peft", num_attention_heads=4, token_dim=64)
    line = _refused(base, directory, capsys)
    assert "num_attention_heads 4, token_dim 64" in line and "2 key/value groups x 16 channels" in line, line


def test_another_peft_adapter_or_a_short_file_is_one_line_exit_2(base, tmp_path, capsys):
    from safetensors.torch import save_file

    lora = tmp_path / "lora"
    lora.mkdir()
    (lora / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    assert "a PEFT LORA adapter, not prefix tuning" in _refused(base, lora, capsys)
    short = peft_directory(base, tmp_path / "short")
    save_file({"prompt_embeddings": torch.zeros(LENGTH, 8)}, str(short / "adapter_model.safetensors"))
    assert "prompt_embeddings is [5, 8], expected [5, 128]" in _refused(base, short, capsys)


def test_a_peft_bin_whose_prompt_embeddings_is_no_tensor_is_one_line_exit_2(base, tmp_path, capsys):
    """An adapter_model.bin whose prompt_embeddings is not a tensor is one line naming the file (it was an
    AttributeError traceback)."""
    directory = peft_directory(base, tmp_path / "peft")
    (directory / "adapter_model.safetensors").unlink()
    torch.save({"prompt_embeddings": [[0.0] * 128] * LENGTH}, directory / "adapter_model.bin")
    line = _refused(base, directory, capsys)
    assert "adapter_model.bin" in line and "prompt_embeddings" in line, line


def test_glm_finetune_ptuning_checkpoint_starts_from_a_peft_prefix(base, tmp_path):
    """glm-finetune's GLM-4 binding puts a PEFT prefix on the frozen base to train on: PEFT's prompt_embeddings as the
    prefix encoder's embedding, nothing else trainable, the logits PEFT's."""
    from safetensors.torch import load_file

    from glm_port.models.glm4.finetune import load

    directory = peft_directory(base, tmp_path / "peft")
    model, _ = load(base, "cpu", ptuning_checkpoint=directory)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"transformer.prefix_encoder.embedding.weight"}
    torch.testing.assert_close(model.transformer.prefix_encoder.embedding.weight.detach(),
                               load_file(directory / "adapter_model.safetensors")["prompt_embeddings"])
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(IDS, attention_mask=MASK).logits, peft_logits(base, directory),
                                   rtol=1e-5, atol=1e-5)
