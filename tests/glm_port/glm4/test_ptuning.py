"""P-Tuning v2 on GLM-4 (``prefix_tuning``): THUDM's GLM-4 ``modeling_chatglm.py`` keeps ChatGLM2's ``PrefixEncoder``
(``pre_seq_len``, ``prefix_projection``), so glm-finetune ``--pre_seq_len`` trains the prefix alone on a GLM-4
directory and saves it in THUDM's layout (the prefix keys alone, GLM-4's tokenizer), which glm-generate, glm-chat and
glm-finetune ``--ptuning_checkpoint`` put back on the base; the prefix encoder stays in float under ``--quantize``;
a checkpoint that does not fit the base is one line, exit 2."""

from __future__ import annotations

import io
import json
import re

import pytest
import torch

from glm_port.finetune.run import main as finetune_main
from glm_port.models import FAMILIES

torch.set_num_threads(1)
PREFIX = "transformer.prefix_encoder."
IDS = torch.tensor([[3, 17, 250, 9, 511, 40, 961, 7]])


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("glm4-ptuning-data") / "train.json"
    path.write_text("\n".join(json.dumps({"source": f"question {i}", "target": "yes indeed"}) for i in range(16)))
    return path


def checkpoint(base, tmp_path, projection=False, pre_seq_len=3, num_layers=None):
    """A P-Tuning checkpoint saved by GLM-4's finetune binding, every prefix weight random (std 0.5); returns
    ``(the prefixed model, the checkpoint directory)``."""
    from glm_port.models.chatglm2.model import attach_prefix
    from glm_port.models.glm4.finetune import save_prefix
    from glm_port.models.glm4.weights import load_pretrained, load_tokenizer

    model = load_pretrained(base)
    if num_layers is not None:  # a base of another depth
        from glm_port.models.glm4.model import GLM4ForCausalLM

        model = GLM4ForCausalLM(type(model.config)(**{**model.config.to_dict(), "num_layers": num_layers})).eval()
    attach_prefix(model, pre_seq_len, projection)
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in model.transformer.prefix_encoder.parameters():
            parameter.normal_(0, 0.5)
    save_prefix(model, load_tokenizer(base), tmp_path / "pt")
    return model.eval(), tmp_path / "pt"


def test_glm4_declares_prefix_tuning():
    assert "prefix_tuning" in FAMILIES["glm4"].supports


def test_finetune_trains_the_prefix_alone_and_saves_thudms_layout(base, data, tmp_path, capsys):
    from glm_port.models.chatglm2.model import prefix_width
    from glm_port.models.glm4.weights import load_pretrained

    out = tmp_path / "out"
    finetune_main(["--model_name_or_path", base, "--train_file", str(data), "--do_train", "--pre_seq_len", "4",
                   "--learning_rate", "1e-1", "--max_steps", "24", "--per_device_train_batch_size", "8", "--logging_steps", "4",
                   "--src_length", "24", "--tgt_length", "8", "--output_dir", str(out)])
    log = capsys.readouterr().out
    losses = [float(x) for x in re.findall(r"lm loss ([0-9.E+-]+)", log)]
    assert len(losses) == 6 and losses[-1] < losses[0] - 0.5, losses  # the frozen model alone cannot move it
    config = load_pretrained(base).config
    assert f"trainable parameters: {4 * prefix_width(config):,} of" in log
    saved = torch.load(out / "final" / "pytorch_model.bin", weights_only=True)
    assert list(saved) == [PREFIX + "embedding.weight"] and saved[PREFIX + "embedding.weight"].shape == (
        4, prefix_width(config))
    assert {"config.json", "pytorch_model.bin", "tokenizer.model", "tokenizer_config.json"} <= {
        p.name for p in (out / "final").iterdir()}
    assert json.loads((out / "final" / "config.json").read_text())["pre_seq_len"] == 4
    loaded = load_pretrained(base, ptuning_checkpoint=out / "final")
    assert type(loaded).__name__ == "GLM4ForCausalLM"
    assert torch.equal(loaded.transformer.prefix_encoder.embedding.weight, saved[PREFIX + "embedding.weight"])
    # and glm-finetune evaluates with it
    finetune_main(["--model_name_or_path", base, "--ptuning_checkpoint", str(out / "final"), "--eval_file", str(data),
                   "--do_eval", "--src_length", "24", "--tgt_length", "4", "--output_dir", str(tmp_path / "eval")])
    assert json.loads((tmp_path / "eval" / "eval_results.json").read_text()).keys() >= {"rouge-l", "bleu-4"}


@pytest.mark.parametrize("projection", [False, True])
def test_glm_generate_and_glm_chat_run_a_glm4_ptuning_checkpoint(base, projection, tmp_path, capsys):
    from glm_port import chat as glm_chat
    from glm_port.generation import cli as generate

    model, pt = checkpoint(base, tmp_path, projection)
    loaded, _ = FAMILIES["glm4"].binding("generation").load(base, ptuning_checkpoint=pt)
    plain, _ = FAMILIES["glm4"].binding("generation").load(base)
    with torch.no_grad():
        torch.testing.assert_close(loaded(IDS).logits, model(IDS).logits, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(plain(IDS).logits, model(IDS).logits, atol=1e-3)  # the prefix matters
    assert glm_chat.main(["--model", base, "--ptuning_checkpoint", str(pt), "--prompt", "hi", "--greedy",
                          "--max-new-tokens", "3"]) == 0
    assert "hi" in capsys.readouterr().out
    out = io.StringIO()
    args = generate.build_parser().parse_args(["--model", base, "--ptuning-checkpoint", str(pt), "--max-new-tokens",
                                               "3", "--json", "the cat"])
    generate.run(args, out=out, err=io.StringIO())
    assert json.loads(out.getvalue())["text"].startswith("the cat")


def test_quantize_keeps_glm4s_prefix_encoder_in_float(base, tmp_path):
    from glm_port.models.glm4.weights import load_pretrained

    model, pt = checkpoint(base, tmp_path, projection=True)
    loaded = load_pretrained(base, ptuning_checkpoint=pt, quantize="int8")
    trans = loaded.transformer.prefix_encoder.trans
    assert type(trans[0]) is torch.nn.Linear and type(trans[2]) is torch.nn.Linear
    assert type(loaded.transformer.encoder.layers[0].mlp.dense_4h_to_h) is not torch.nn.Linear  # these are quantized


def test_a_checkpoint_for_other_layers_is_one_line_exit_2(base, tmp_path, capsys):
    from glm_port.generation import cli as generate

    _, pt = checkpoint(base, tmp_path, num_layers=3)
    with pytest.raises(SystemExit) as stop:
        generate.main(["--model", base, "--ptuning_checkpoint", str(pt), "the cat"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a prefix for 3 layers" in err[0] and "the base model has 2 layers" in err[0], err
