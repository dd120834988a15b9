"""glm-merge and glm-export: tensor-parallel shards merge to the one-process weights and load in glm-generate;
a LoRA adapter folds in as PEFT's own merged model computes; the ONNX decoding step, run by onnxruntime,
generates what the eager model generates; bad input is one line, exit 2, and nothing is left behind."""

import io
import json

import numpy as np
import pytest
import torch

from glm_port import GLMConfig, GLMModel
from glm_port.convert import export as export_cli
from glm_port.convert import merge as merge_cli
from glm_port.convert.decode_step import DecodeStep, example_inputs, onnx_session, run_onnx
from glm_port.data.tokenization import tiny_wordpiece
from glm_port.generation import cli as generate_cli
from glm_port.models.glm import weights
from glm_port.models.glm.generation import load_tokenizer
from glm_port.models.glm.hf import GLMForConditionalGeneration
from glm_port.models.glm.tokenizer import GLMTokenizer

VOCAB = tiny_wordpiece()
CONFIG = GLMConfig(vocab_size=VOCAB.vocab_size, num_layers=2, hidden_size=64, num_attention_heads=4,
                   max_sequence_length=32, init_method_std=0.3, embedding_dropout_prob=0.0,
                   attention_dropout_prob=0.0, output_dropout_prob=0.0)
PROMPTS = ["the cat sat on the [MASK] .", "language models"]


@pytest.fixture(scope="module")
def glm():
    torch.manual_seed(0)
    return GLMModel(CONFIG).eval()


def write_shards(directory, state, size, iteration=3):
    """What a glm-finetune / glm-pretrain run at tensor-parallel size ``size`` saves: one file per rank with
    Megatron's slice of every weight (weights.take_slice), the architecture under 'glm_config'."""
    (directory / str(iteration)).mkdir(parents=True)
    (directory / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    for rank in range(size):
        part = {k: weights.take_slice(k, v, size, rank).clone() for k, v in state.items()}
        torch.save({"module": part, "iteration": iteration, "glm_config": CONFIG.to_dict()},
                   directory / str(iteration) / f"mp_rank_{rank:02d}_model_states.pt")
    return directory


def generate(model_dir, *extra):
    out, err = io.StringIO(), io.StringIO()
    args = generate_cli.build_parser().parse_args(["--model", str(model_dir), "--json", "--max-new-tokens", "4",
                                                   *extra, *PROMPTS])
    generate_cli.run(args, out=out, err=err)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def exits_2(main, argv, capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def leftovers(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


# ---- glm-merge ---------------------------------------------------------------------------------------


def test_two_shards_merge_to_the_one_process_weights_and_load_in_glm_generate(tmp_path, glm, capsys):
    state = glm.state_dict()
    shards = write_shards(tmp_path / "tp2", state, 2)
    # The shards hold halves: the merge must reassemble them, not copy one.
    assert torch.load(shards / "3" / "mp_rank_01_model_states.pt")["module"]["word_embeddings.weight"].size(0) == \
        CONFIG.vocab_size // 2
    merge_cli.main([str(shards), str(tmp_path / "merged")])
    assert "2 tensor-parallel shards" in capsys.readouterr().out
    out = tmp_path / "merged"
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer_config.json"]
    assert leftovers(tmp_path) == []
    from safetensors.torch import load_file

    saved = weights.without_hf_prefix(load_file(out / "model.safetensors"))
    assert saved.keys() == state.keys()
    for name, tensor in state.items():
        assert torch.equal(saved[name], tensor), name
    loaded = GLMForConditionalGeneration.from_pretrained(out)
    written = {"architectures", "dtype", "_name_or_path", "transformers_version"}  # set by the writing
    assert {k: v for k, v in loaded.config.to_dict().items() if k not in written} == \
        {k: v for k, v in CONFIG.to_dict().items() if k not in written}
    # glm-generate reads the merged directory and gives what it gives from the shards themselves.
    merged_results = generate(out)
    assert merged_results == generate(shards)
    assert all(r["generated_ids"][0] for r in merged_results)


def test_sharded_hf_directory_merges_to_one_file_in_bf16_with_its_vocabulary(tmp_path, glm, capsys):
    vocab_words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "a", "."]
    source = tmp_path / "hf"
    config = {"model_type": "glm", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
              "vocab_size": CONFIG.vocab_size, "max_sequence_length": 32}
    weights.save_hf(glm.state_dict(), source, config, shards=3)
    (source / "vocab.txt").write_text("\n".join(vocab_words) + "\n")
    (source / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "GLMBertTokenizer"}))
    merge_cli.main([str(source), str(tmp_path / "one"), "--dtype", "bf16"])
    out = tmp_path / "one"
    assert {p.name for p in out.iterdir()} == {"config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"}
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    loaded = GLMForConditionalGeneration.from_pretrained(out)
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}
    for name, tensor in glm.state_dict().items():
        assert torch.equal(loaded.glm.state_dict()[name], tensor.to(torch.bfloat16)), name
    tokenizer = GLMTokenizer.from_pretrained(out)
    assert tokenizer.vocab.name == "BertWordPieceTokenizer"
    assert tokenizer.vocab.fingerprint == GLMTokenizer.from_pretrained(source).vocab.fingerprint


@pytest.mark.parametrize("case,message", [
    ("missing", "no such file or directory"),
    ("not_empty", "exists and is not empty (pass --overwrite"),
    ("same", "the output cannot be the input"),
    ("lora_checkpoint", "holds a LoRA training checkpoint"),
    ("wrong_positions", "the architecture in config.json needs [65, 64]"),
    ("no_vocabulary", "no vocabulary file beside"),
])
def test_merge_bad_input_is_one_line_and_leaves_nothing(tmp_path, glm, capsys, case, message):
    state = glm.state_dict()
    src, out = tmp_path / "src", tmp_path / "out"
    argv = [str(src), str(out)]
    if case == "not_empty":
        write_shards(src, state, 2)
        out.mkdir()
        (out / "keep.txt").write_text("mine")
    elif case == "same":
        write_shards(src, state, 1)
        argv = [str(src), str(src)]
    elif case == "lora_checkpoint":
        lora = {"base_model.model." + k: v for k, v in state.items()}
        lora_a = "base_model.model.transformer.layers.0.attention.query_key_value.lora_A.default.weight"
        lora[lora_a] = torch.zeros(8, 64)
        src.mkdir()
        torch.save({"module": lora, "glm_config": CONFIG.to_dict()}, src / "mp_rank_00_model_states.pt")
    elif case == "wrong_positions":
        weights.save_hf(state, src, {"model_type": "glm", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                                     "vocab_size": CONFIG.vocab_size, "max_sequence_length": 64})
    elif case == "no_vocabulary":  # a model of another vocabulary, with only a tokenizer_config.json beside it
        big = {k: torch.cat((v, v)) if k == "word_embeddings.weight" else v for k, v in state.items()}
        weights.save_hf(big, src, {"model_type": "glm", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                                   "vocab_size": 2 * CONFIG.vocab_size, "max_sequence_length": 32})
        (src / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "GLMChineseTokenizer"}))
    err = exits_2(merge_cli.main, argv, capsys)
    assert err.startswith("glm-merge: error:") and message in err, err
    if case == "not_empty":
        assert [p.name for p in out.iterdir()] == ["keep.txt"]
    else:
        assert not out.exists()
    assert leftovers(tmp_path) == []


# ---- glm-export --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, glm):
    """A base model directory and a PEFT LoRA adapter for it with non-zero weights (as training leaves them)."""
    import peft

    root = tmp_path_factory.mktemp("finetuned")
    weights.save_hf(glm.state_dict(), root / "base", {"model_type": "glm", **{
        k: v for k, v in CONFIG.to_dict().items()
        if k in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size", "max_sequence_length")}})
    GLMTokenizer(VOCAB).save_pretrained(root / "base")
    base = GLMModel(CONFIG)
    base.load_state_dict(glm.state_dict())
    adapted = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["query_key_value"]))
    torch.manual_seed(3)
    with torch.no_grad():
        for name, parameter in adapted.named_parameters():
            if "lora_" in name:
                parameter.normal_(0, 0.2)
    adapted.save_pretrained(str(root / "adapter"))
    return root, adapted.eval()


def test_lora_folds_in_as_peft_computes_and_loads_in_glm_generate(tmp_path, finetuned, glm, capsys):
    root, adapted = finetuned
    export_cli.main(["--model_name_or_path", str(root / "base"), "--lora_path", str(root / "adapter"),
                     "--output_path", str(tmp_path / "served")])
    out = tmp_path / "served"
    assert (out / "model.safetensors").is_file() and (out / "tokenizer_config.json").is_file()
    loaded = GLMForConditionalGeneration.from_pretrained(out)
    ids = torch.randint(0, CONFIG.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    positions = torch.stack((torch.arange(9).expand(2, 9), torch.zeros(2, 9, dtype=torch.long)), dim=1)
    sep = torch.tensor([4, 6])
    with torch.no_grad():
        (expected,) = adapted(ids, positions, sep)  # PEFT's model: base + B A x * alpha / r, unmerged
        (base_logits,) = glm(ids, positions, sep)
        got = loaded(ids, position_ids=positions, attention_mask=sep).logits
    assert (expected - base_logits).abs().max() > 1e-2  # the adapter changes the model
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert generate(out)  # loads and generates


def test_float16_export(tmp_path, finetuned):
    root, _ = finetuned
    export_cli.main(["--model_name_or_path", str(root / "base"), "--output_path", str(tmp_path / "half"),
                     "--dtype", "float16"])
    loaded = GLMForConditionalGeneration.from_pretrained(tmp_path / "half")
    assert {p.dtype for p in loaded.parameters()} == {torch.float16}
    assert json.loads((tmp_path / "half" / "config.json").read_text())["dtype"] == "float16"
    assert generate(tmp_path / "half", "--dtype", "fp16")


def test_onnx_decode_step_generates_what_the_eager_model_generates(tmp_path, finetuned, capsys):
    root, _ = finetuned
    export_cli.main(["--model_name_or_path", str(root / "base"), "--lora_path", str(root / "adapter"),
                     "--output_path", str(tmp_path / "served"), "--onnx"])
    assert "checked with onnxruntime" in capsys.readouterr().out
    out = tmp_path / "served"
    model = GLMForConditionalGeneration.from_pretrained(out)
    tokenizer = load_tokenizer(out)  # as glm-generate reads it
    session = onnx_session(out / "onnx" / "decode_step.onnx")
    # Greedy decoding driven by onnxruntime alone: the prompt forward (empty cache), then one token at a time.
    new_tokens = 6
    inputs = tokenizer.build_inputs_for_generation(PROMPTS, max_gen_length=new_tokens)
    expected = model.generate(**inputs, max_new_tokens=new_tokens, do_sample=False, num_beams=1,
                              eos_token_id=None)[:, inputs["input_ids"].size(1):]
    ids = inputs["input_ids"]
    heads, head_dim = CONFIG.num_attention_heads, CONFIG.head_dim
    keys = values = torch.zeros(CONFIG.num_layers, ids.size(0), heads, 0, head_dim)
    past, generated = 0, []
    step_ids = ids
    for _ in range(new_tokens):
        current = past + step_ids.size(1)
        # the rows generate() feeds (prepare_inputs_for_generation): the generation mask, padding dropped
        new = torch.ones(ids.size(0), current - ids.size(1), dtype=torch.long)
        real = torch.cat((inputs["attention_mask"], new), 1)
        mask = inputs["generation_attention_mask"][:, :, past:current, :current].bool() & real[:, None, None, :].bool()
        logits, keys, values = run_onnx(session, (step_ids, inputs["position_ids"][:, :, past:current], mask,
                                                  keys, values))
        step_ids = logits[:, -1].argmax(-1, keepdim=True)
        generated.append(step_ids)
        past = current
    assert torch.equal(torch.cat(generated, dim=1), expected)


def test_onnx_and_torch_export_match_the_eager_step_at_other_sizes(tmp_path, glm):
    from glm_port.convert.decode_step import export_onnx, export_program

    model = GLMForConditionalGeneration(CONFIG, glm=glm).eval()
    onnx_path = export_onnx(model, tmp_path / "step.onnx")
    program_path = export_program(model, tmp_path / "step.pt2")
    session = onnx_session(onnx_path)
    program = torch.export.load(str(program_path)).module()
    step = DecodeStep(model).eval()
    for batch, query, past in [(1, 1, 7), (3, 5, 0), (2, 1, 0)]:
        inputs = example_inputs(model.config, batch=batch, query=query, past=past, seed=batch + query + past)
        with torch.no_grad():
            expected = step(*inputs)
            exported = program(*inputs)
        for got in (run_onnx(session, inputs), exported):
            for g, e in zip(got, expected):
                assert g.shape == e.shape
                np.testing.assert_allclose(g.numpy(), e.numpy(), atol=1e-5, rtol=1e-5)


def test_export_bad_input(tmp_path, finetuned, capsys):
    root, _ = finetuned
    other = GLMModel(CONFIG.replace(hidden_size=32))
    import peft

    peft.get_peft_model(other, peft.LoraConfig(r=2, target_modules=["query_key_value"])).save_pretrained(
        str(tmp_path / "other_adapter"))
    (tmp_path / "not_adapter").mkdir()
    cases = [
        (["--lora_path", str(tmp_path / "other_adapter")], "was made for another base model"),
        (["--lora_path", str(tmp_path / "not_adapter")], "not a PEFT adapter"),
    ]
    for extra, message in cases:
        err = exits_2(export_cli.main, ["--model_name_or_path", str(root / "base"), "--output_path",
                                        str(tmp_path / "out"), *extra], capsys)
        assert err.startswith("glm-export: error:") and message in err, err
        assert not (tmp_path / "out").exists()
    err = exits_2(export_cli.main, ["--model_name_or_path", str(tmp_path / "absent"), "--output_path",
                                    str(tmp_path / "out")], capsys)
    assert "no such file or directory" in err
    err = exits_2(export_cli.main, ["--model_name_or_path", str(root / "adapter"), "--output_path",
                                    str(tmp_path / "out")], capsys)
    assert "is a PEFT LoRA adapter, not a model" in err and "--lora_path" in err
    err = exits_2(merge_cli.main, [str(root / "adapter"), str(tmp_path / "out")], capsys)
    assert "is a PEFT LoRA adapter, not a model" in err
    assert leftovers(tmp_path) == []


# ---- an output never deletes its input (outputs.check_apart) -----------------------------------------


def snapshot(directory) -> dict:
    """Every file under ``directory`` with its bytes: what must survive a refused command."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("layout", ["out_contains_src", "out_is_a_link_above_src", "out_inside_src"])
def test_merge_never_writes_over_its_input_whatever_the_flags(tmp_path, glm, capsys, layout):
    """glm-merge tp2par/3 tp2par --overwrite replaced the whole TP-2 checkpoint (shards, tracker) with the
    merged model: OUT may neither contain SRC nor lie inside it, symbolic links resolved, --overwrite or not."""
    run = tmp_path / "tp2par"
    write_shards(run, glm.state_dict(), 2)
    (run / "other.txt").write_text("the run's notes")
    src, out = run / "3", run
    if layout == "out_is_a_link_above_src":
        (tmp_path / "link").symlink_to(run)
        out = tmp_path / "link"
    elif layout == "out_inside_src":
        src, out = run, run / "merged"
    before = snapshot(tmp_path)
    err = exits_2(merge_cli.main, [str(src), str(out), "--overwrite"], capsys)
    assert err.startswith("glm-merge: error:") and ("contains the input SRC" in err or "is inside the input SRC" in err)
    assert snapshot(tmp_path) == before  # the shards, the tracker and the sibling, byte for byte
    assert leftovers(tmp_path) == []


def test_export_never_writes_over_its_inputs(tmp_path, finetuned, capsys):
    """glm-export --lora_path run/final --output_path run --overwrite deleted the adapter and the run's results."""
    import shutil

    root, _ = finetuned
    run = tmp_path / "run"
    shutil.copytree(root / "adapter", run / "final")
    shutil.copytree(root / "base", tmp_path / "base")
    (run / "other.txt").write_text("eval results")
    before = snapshot(tmp_path)
    cases = [
        (["--model_name_or_path", str(tmp_path / "base"), "--lora_path", str(run / "final"), "--output_path", str(run)],
         "contains the input --lora_path"),
        (["--model_name_or_path", str(tmp_path / "base"), "--output_path", str(tmp_path / "base")],
         "the output cannot be the input"),
        (["--model_name_or_path", str(tmp_path / "base"), "--output_path", str(tmp_path / "base" / "served")],
         "is inside the input --model_name_or_path"),
        (["--model_name_or_path", str(tmp_path / "base"), "--tokenizer_path", str(run / "vocab.txt"),
          "--output_path", str(run)], "contains the input --tokenizer_path"),
    ]
    for argv, message in cases:
        err = exits_2(export_cli.main, [*argv, "--overwrite"], capsys)
        assert err.startswith("glm-export: error: --output_path") and message in err, err
        assert snapshot(tmp_path) == before
    assert leftovers(tmp_path) == [] and leftovers(run) == []


def test_merge_and_export_refuse_an_output_that_cannot_be_written_before_reading(tmp_path, glm, capsys):
    write_shards(tmp_path / "src", glm.state_dict(), 1)
    (tmp_path / "notes.txt").write_text("mine")
    for out, message in [(tmp_path / "notes.txt", "exists and is not a directory"),
                         (tmp_path / "notes.txt" / "out", "notes.txt is a file, not a directory")]:
        err = exits_2(merge_cli.main, [str(tmp_path / "src"), str(out), "--overwrite"], capsys)
        assert message in err, err
        err = exits_2(export_cli.main, ["--model_name_or_path", str(tmp_path / "src"), "--output_path", str(out)],
                      capsys)
        assert message in err, err
    assert (tmp_path / "notes.txt").read_text() == "mine"


# ---- damaged and mismatched inputs, a full disk: one line naming what is wrong, nothing left behind -----


def test_a_truncated_safetensors_file_is_named(tmp_path, glm, capsys):
    source = tmp_path / "model"
    weights.save_hf(glm.state_dict(), source, {"model_type": "glm", "num_layers": 2, "hidden_size": 64,
                                               "num_attention_heads": 4, "vocab_size": CONFIG.vocab_size,
                                               "max_sequence_length": 32})
    GLMTokenizer(VOCAB).save_pretrained(source)
    data = (source / "model.safetensors").read_bytes()
    (source / "model.safetensors").write_bytes(data[:len(data) // 2])  # an interrupted copy
    message = f"{source / 'model.safetensors'}: not a readable safetensors file"
    assert message in exits_2(merge_cli.main, [str(source), str(tmp_path / "out")], capsys)
    assert message in exits_2(generate_cli.main, ["--model", str(source), "hello"], capsys)
    assert leftovers(tmp_path) == [] and not (tmp_path / "out").exists()


def test_a_missing_rank_is_named(tmp_path, glm, capsys):
    """A TP-2 checkpoint without rank 1's file was blamed on 'the architecture in config.json'."""
    old = write_shards(tmp_path / "old", glm.state_dict(), 2)  # files that record no rank count
    (old / "3" / "mp_rank_01_model_states.pt").unlink()
    err = exits_2(merge_cli.main, [str(old), str(tmp_path / "out")], capsys)
    assert "mp_rank_01_model_states.pt is missing" in err and "2 model-parallel ranks" in err, err
    # glm-pretrain / glm-finetune record the count (DeepSpeed's 'mp_world_size'): a missing last rank is named
    # whatever the shapes say.
    new = write_shards(tmp_path / "new", glm.state_dict(), 4)
    for rank in range(4):
        path = new / "3" / f"mp_rank_{rank:02d}_model_states.pt"
        torch.save({**torch.load(path), "mp_world_size": 4}, path)
    (new / "3" / "mp_rank_03_model_states.pt").unlink()
    err = exits_2(merge_cli.main, [str(new), str(tmp_path / "out")], capsys)
    assert "mp_rank_03_model_states.pt is missing (the checkpoint has 4 model-parallel ranks)" in err, err
    assert err == exits_2(generate_cli.main, ["--model", str(new), "hello"], capsys).replace("glm-generate", "glm-merge")
    assert leftovers(tmp_path) == [] and not (tmp_path / "out").exists()


def test_save_checkpoint_records_the_rank_count(tmp_path, glm):
    from glm_port.checkpoint_io import save_checkpoint, saved_ranks

    path = save_checkpoint(tmp_path, 1, glm.state_dict(), config=CONFIG, save_rng=False)
    assert saved_ranks(path / "mp_rank_00_model_states.pt") == 1


def test_shards_of_two_models_are_named_not_a_torch_cat_error(tmp_path, glm, capsys):
    a = write_shards(tmp_path / "a", glm.state_dict(), 2)
    other = GLMModel(CONFIG.replace(hidden_size=32, num_attention_heads=2))
    b = write_shards(tmp_path / "b", other.state_dict(), 2)
    (b / "3" / "mp_rank_01_model_states.pt").replace(a / "3" / "mp_rank_01_model_states.pt")
    err = exits_2(merge_cli.main, [str(a), str(tmp_path / "out")], capsys)
    assert "the tensor-parallel shards in" in err and "do not fit together" in err, err
    assert "[192, 64] in mp_rank_00_model_states.pt, [192, 32] in mp_rank_01_model_states.pt" in err, err
    shallow = write_shards(tmp_path / "c", GLMModel(CONFIG.replace(num_layers=1)).state_dict(), 2)  # fewer weights
    (shallow / "3" / "mp_rank_01_model_states.pt").replace(a / "3" / "mp_rank_01_model_states.pt")
    err = exits_2(merge_cli.main, [str(a), str(tmp_path / "out")], capsys)
    assert "mp_rank_01_model_states.pt lacks transformer.layers.1." in err and "different models mixed" in err, err
    assert leftovers(tmp_path) == [] and not (tmp_path / "out").exists()


def full_disk(tensors, filename, metadata=None):
    """safetensors' writer on a full disk: part of the file written, then its SafetensorError."""
    from safetensors import SafetensorError

    with open(filename, "wb") as handle:
        handle.write(b"\0" * 64)
    raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")


def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, glm, capsys, monkeypatch):
    import safetensors.torch

    shards = write_shards(tmp_path / "tp2", glm.state_dict(), 2)
    (tmp_path / "merged").mkdir()
    (tmp_path / "merged" / "earlier.txt").write_text("an earlier output")
    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    err = exits_2(merge_cli.main, [str(shards), str(tmp_path / "merged"), "--overwrite"], capsys)
    message = f"{tmp_path / 'merged' / 'model.safetensors'}: could not be written (No space left on device (os error 28))"
    assert message in err, err
    assert leftovers(tmp_path) == []
    assert [p.name for p in (tmp_path / "merged").iterdir()] == ["earlier.txt"]  # the old output stays


@pytest.mark.parametrize("absent", ["onnx", "onnxruntime"])
def test_onnx_without_its_modules_is_one_line_naming_the_extra(tmp_path, finetuned, capsys, monkeypatch, absent):
    # A machine without the `onnx` extra: the module cannot be imported (None in sys.modules makes import fail).
    monkeypatch.setitem(__import__("sys").modules, absent, None)
    root, _ = finetuned
    err = exits_2(export_cli.main, ["--model_name_or_path", str(root / "base"), "--output_path",
                                    str(tmp_path / "served"), "--onnx"], capsys)
    assert err.startswith("glm-export: error: --onnx needs") and absent in err and "glm-migrate[onnx]" in err, err
    assert not (tmp_path / "served").exists() and leftovers(tmp_path) == []


def test_weights_fingerprint_holds_across_exact_dtypes_and_sees_one_changed_value():
    from glm_port.checkpoint_io import weights_fingerprint

    state = {"b": torch.randn(3, 4).bfloat16(), "a": torch.arange(5), "c": torch.tensor(True)}
    wide = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
    assert weights_fingerprint(state) == weights_fingerprint(wide) == weights_fingerprint(dict(reversed(state.items())))
    changed = dict(wide, b=wide["b"].clone())
    changed["b"][2, 3] += 2 ** -6
    renamed = {("B" if k == "b" else k): v for k, v in wide.items()}
    assert len({weights_fingerprint(wide), weights_fingerprint(changed), weights_fingerprint(renamed),
                weights_fingerprint(dict(wide, b=wide["b"].reshape(4, 3)))}) == 4


def test_export_refuses_an_adapter_trained_on_another_base_of_the_same_shape(tmp_path, finetuned, capsys):
    import shutil

    from safetensors.torch import load_file, save_file

    from glm_port.finetune.run import main as finetune

    finetune(["--max_steps", "2", "--eval_steps", "0", "--lora", "--do_eval", "false",
              "--output_dir", str(tmp_path / "run")])
    base, adapter = tmp_path / "run" / "base", tmp_path / "run" / "final"
    record = json.loads((adapter / "base_model.json").read_text())
    assert record["base_model_name_or_path"] == str(base.resolve())
    assert len(record["weights_sha256"]) == 64
    # The base the adapter was trained on: exported without a word.
    capsys.readouterr()
    export_cli.main(["--model_name_or_path", str(base), "--lora_path", str(adapter), "--output_path",
                     str(tmp_path / "served")])
    assert capsys.readouterr().err == "" and (tmp_path / "served" / "model.safetensors").is_file()
    # Another base of the same shape (one weight nudged): refused in one line, nothing written ...
    other = tmp_path / "other_base"
    shutil.copytree(base, other)
    state = load_file(other / "model.safetensors")
    name = sorted(state)[0]
    state[name] = state[name].clone()
    state[name].view(-1)[0] += 0.5
    save_file(state, other / "model.safetensors", metadata={"format": "pt"})
    argv = ["--model_name_or_path", str(other), "--lora_path", str(adapter), "--output_path", str(tmp_path / "out")]
    err = exits_2(export_cli.main, argv, capsys)
    assert err.startswith(f"glm-export: error: --lora_path {adapter} was trained on {base.resolve()} "), err
    assert f"not on --model_name_or_path {other}" in err and "--allow_base_mismatch" in err, err
    assert not (tmp_path / "out").exists()
    # ... unless asked, with a warning.
    export_cli.main([*argv, "--allow_base_mismatch"])
    err = capsys.readouterr().err
    assert "warning" in err and "folded in as --allow_base_mismatch asks" in err and (tmp_path / "out" / "model.safetensors").is_file()
    # An adapter saved by plain PEFT records no base: a warning, not a refusal.
    root, _ = finetuned
    export_cli.main(["--model_name_or_path", str(root / "base"), "--lora_path", str(root / "adapter"),
                     "--output_path", str(tmp_path / "plain")])
    err = capsys.readouterr().err.strip()
    assert err.startswith("glm-export: warning: cannot check that --lora_path") and "base_model.json" in err, err
    assert (tmp_path / "plain" / "model.safetensors").is_file()
