"""One conformance suite, run over every registered family (``glm_port.models.FAMILIES``): a family joins it by
registering (docs/architecture.md, "Adding a model family"). Each case is built through the family contract only:
a tiny model from the family's ``tiny`` binding (else its ``finetune`` binding's new small model), saved by its
own ``finetune`` binding's ``save``, found again by ``family_at`` and loaded by its ``generation`` binding.

For every family:

1. the saved weights, rewritten in each file layout a family directory may hold (one safetensors file, sharded
   safetensors with an index, ``pytorch_model.bin``, sharded ``.bin`` with an index), load back to equal logits
   (and pass the ``weights`` binding's checks where the family has one);
2. greedy decoding through the key/value cache gives the tokens and logits of decoding without it (each step the
   whole sequence again), and each cached step fed one new token;
3. every feature of ``FEATURES`` the family does not declare is refused by ``Family.require`` in one line naming
   the flag (what it declares passes);
4. glm-merge (and glm-convert there and back) round trips keep the logits, where the family has the ``hf`` or
   ``convert`` binding; glm-merge refuses one with neither in one line, exit status 2, nothing written; glm-export
   writes a family declaring ``export`` in fp32 with the same logits, and refuses any other in one line;
5. glm-generate at tensor parallel 2 (two gloo processes, one launch for all families) gives one process's
   results, for every family declaring ``tensor_parallel``.

Where a family lacks the binding a case needs, the case is skipped naming it, never passed silently.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

from glm_port.models import FAMILIES, FEATURES, Family, Unsupported, family_at

PROMPT = "the cat sat on the [MASK] and looked at it"  # GLM fills the blank; the others continue the text
NEW_TOKENS = 5

# How a user asks for each feature (the commands' flags, docs/architecture.md "What a family supports").
FLAGS = {
    "tensor_parallel": "--tensor-parallel-size 2",
    "pipeline_parallel": "--pipeline-parallel-size 2",
    "static_cache": "--static-cache",
    "recompute": "--recompute",
    "lora": "--lora",
    "export": "glm-export",
    "merge": "glm-merge",
    "decode_graph": "--onnx",
    "quantize": "--quantize int8",
    "prefix_tuning": "--pre_seq_len 8",
}

# The file layouts of a model directory (transformers' names, which every family's loaders read): name -> (weights
# file or index, shards, format).
LAYOUTS = {
    "safetensors": ("model.safetensors", 1, "safetensors"),
    "sharded-safetensors": ("model.safetensors.index.json", 2, "safetensors"),
    "bin": ("pytorch_model.bin", 1, "bin"),
    "sharded-bin": ("pytorch_model.bin.index.json", 2, "bin"),
}
WEIGHT_FILES = {"model.safetensors", "pytorch_model.bin"}


def binding_or_skip(family: Family, kind: str):
    if getattr(family, kind) is None:
        pytest.skip(f"the {family.name} family has no {kind} binding")
    return family.binding(kind)


def build_tiny(family: Family):
    """``(model, tokenizer)``: the family's tiny model, its weights drawn wide (std 0.3) so that greedy decoding
    is decisive; from the ``tiny`` binding, else the ``finetune`` binding's new small model."""
    torch.manual_seed(0)
    if family.tiny is not None:
        model, tokenizer = family.binding("tiny").build_tiny()
    elif family.finetune is not None:
        model, tokenizer = family.binding("finetune").load(None, "cpu")
    else:
        pytest.skip(f"the {family.name} family has neither a tiny nor a finetune binding to build a model from")
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.3)
    return model.eval(), tokenizer


def save(family: Family, model, tokenizer, directory: Path) -> Path:
    binding_or_skip(family, "finetune").save(model, tokenizer, directory, None)
    return directory


def read_tensors(directory: Path) -> dict:
    """The tensors of a directory holding one weights file."""
    if (directory / "model.safetensors").is_file():
        from safetensors.torch import load_file

        return load_file(str(directory / "model.safetensors"))
    return torch.load(directory / "pytorch_model.bin", map_location="cpu", weights_only=True)


def write_layout(source: Path, layout: str, directory: Path) -> Path:
    """``source`` (a saved model directory) rewritten with its weights in ``layout``; every other file copied."""
    name, shards, fmt = LAYOUTS[layout]
    directory.mkdir(parents=True)
    for file in source.iterdir():
        if file.name not in WEIGHT_FILES:
            shutil.copy2(file, directory / file.name)
    tensors = {k: v.contiguous() for k, v in read_tensors(source).items()}
    keys = list(tensors)
    base, ext = ("model", "safetensors") if fmt == "safetensors" else ("pytorch_model", "bin")
    files = ([f"{base}.{ext}"] if shards == 1 else
             [f"{base}-{i + 1:05d}-of-{shards:05d}.{ext}" for i in range(shards)])
    weight_map = {}
    for i, file in enumerate(files):
        part = {k: tensors[k] for k in keys[i::shards]}
        if fmt == "safetensors":
            from safetensors.torch import save_file

            save_file(part, str(directory / file), metadata={"format": "pt"})
        else:
            torch.save(part, directory / file)
        weight_map.update(dict.fromkeys(part, file))
    if shards > 1:
        (directory / name).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    assert (directory / name).is_file()
    return directory


def input_ids() -> torch.Tensor:  # ids every tiny vocabulary holds
    return torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(1))


def logits_of(family: Family, directory) -> torch.Tensor:
    """The logits of ``directory``'s model as the family's generation binding loads it."""
    model, _ = family.binding("generation").load(directory, dtype="fp32", device="cpu")
    with torch.no_grad():
        return model(input_ids()).logits


class Case(NamedTuple):  # not a dataclass: tests/distributed/conftest.py's clean launch runs this file unregistered
    family: Family
    saved: Path  # the tiny model, saved by the family's own save path
    logits: torch.Tensor  # its logits as the generation binding loads it


@pytest.fixture(scope="module", params=list(FAMILIES))
def case(request, tmp_path_factory) -> Case:
    torch.set_num_threads(1)
    family = FAMILIES[request.param]
    binding_or_skip(family, "generation")
    model, tokenizer = build_tiny(family)
    saved = save(family, model, tokenizer, tmp_path_factory.mktemp(family.name) / "saved")
    return Case(family, saved, logits_of(family, saved))


def test_the_saved_model_is_the_family_s_and_loads_as_built(case):
    """The family's own save path gives a directory ``family_at`` gives back to it, whose model holds the weights
    built (under the same names, or under a prefix the loaded class adds, as GLM's Hugging Face class's ``glm.``)."""
    family = case.family
    assert family_at(case.saved) is family
    built, _ = build_tiny(family)
    loaded, _ = family.binding("generation").load(case.saved, dtype="fp32", device="cpu")
    ours = loaded.state_dict()
    for name, tensor in built.state_dict().items():
        found = [key for key in ours if key == name or key.endswith("." + name)]
        assert len(found) == 1, (name, found)
        torch.testing.assert_close(ours[found[0]], tensor, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_file_layout_loads_to_equal_logits(case, layout, tmp_path):
    family = case.family
    directory = write_layout(case.saved, layout, tmp_path / layout)
    assert family_at(directory) is family
    if family.weights is not None:  # the family's reader checks the directory before reading a tensor
        family.binding("weights").check_directory(directory)
    torch.testing.assert_close(logits_of(family, directory), case.logits, rtol=0, atol=0)


def _decode(family: Family, model, tokenizer, use_cache: bool):
    """The generation binding's greedy result, with each forward's input length and last logits."""
    steps = []

    def record(module, args, kwargs, output):
        ids = kwargs.get("input_ids", args[0] if args else None)
        steps.append((ids.shape[1], output.logits[:, -1].detach().clone()))

    handle = model.register_forward_hook(record, with_kwargs=True)
    try:
        results = family.binding("generation").generate(model, tokenizer, [PROMPT], max_new_tokens=NEW_TOKENS,
                                                        min_new_tokens=NEW_TOKENS, do_sample=False,
                                                        use_cache=use_cache)
    finally:
        handle.remove()
    return results, steps


def test_cached_decoding_equals_the_full_forward(case):
    family = case.family
    model, tokenizer = family.binding("generation").load(case.saved, dtype="fp32", device="cpu")
    cached, cached_steps = _decode(family, model, tokenizer, use_cache=True)
    full, full_steps = _decode(family, model, tokenizer, use_cache=False)
    assert cached == full
    assert len(cached_steps) == len(full_steps) == NEW_TOKENS
    prompt = full_steps[0][0]
    assert [length for length, _ in cached_steps] == [prompt] + [1] * (NEW_TOKENS - 1)  # through the cache
    assert [length for length, _ in full_steps] == list(range(prompt, prompt + NEW_TOKENS))  # the whole again
    for (_, ours), (_, theirs) in zip(cached_steps, full_steps):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_what_the_family_does_not_declare_is_refused_in_one_line(case):
    family = case.family
    assert set(FLAGS) == set(FEATURES), "a new feature needs its flag here"
    for feature in FEATURES:
        flag = FLAGS[feature]
        if feature in family.supports:
            family.require((flag, feature))  # declared: no refusal
            continue
        with pytest.raises(Unsupported) as refused:
            family.require((flag, feature))
        message = str(refused.value)
        assert "\n" not in message and message.startswith(f"{flag}: ") and family.name in message, message
        family.require((None, feature))  # not asked for: nothing to refuse


# glm-generate's flags for the features it can be asked for
GENERATE_FLAGS = {
    "tensor_parallel": ["--tensor-parallel-size", "2"],
    "pipeline_parallel": ["--pipeline-parallel-size", "2"],
    "static_cache": ["--static-cache"],
    "quantize": ["--quantize", "int8"],
    "prefix_tuning": ["--ptuning_checkpoint", "{saved}"],
}


def test_glm_generate_refuses_what_the_family_does_not_declare(case, capsys):
    """The command, not only ``require``: one line naming the flag, exit status 2, before any weight is read."""
    from glm_port.generation.cli import main

    family = case.family
    lacking = [feature for feature in GENERATE_FLAGS if feature not in family.supports]
    if not lacking:
        pytest.skip(f"the {family.name} family declares every feature glm-generate can be asked for")
    for feature in lacking:
        flags = [flag.format(saved=case.saved) for flag in GENERATE_FLAGS[feature]]
        with pytest.raises(SystemExit) as exit_:
            main(["--model", str(case.saved), *flags, PROMPT])
        err = capsys.readouterr().err
        assert exit_.value.code == 2, err
        assert len(err.strip().splitlines()) == 1, err
        assert " ".join(flags) in err and f"the {family.name} family does not support {FEATURES[feature]}" in err, err


def _exit_status(main, argv: list[str], capsys) -> tuple[int, str]:
    """``main(argv)``'s exit status (0 when it returns, argparse's and the commands' exits caught) and stderr."""
    try:
        main(argv)
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    return code, capsys.readouterr().err


def _merge(src: Path, out: Path, capsys) -> tuple[int, str]:
    from glm_port.convert.merge import main

    return _exit_status(main, [str(src), str(out)], capsys)


def test_glm_merge_round_trip_keeps_the_logits(case, tmp_path, capsys):
    family = case.family
    if "merge" not in family.supports:
        pytest.skip(f"the {family.name} family does not declare merge (glm-merge refuses it: the next test)")
    sharded = write_layout(case.saved, "sharded-safetensors", tmp_path / "sharded")
    code, err = _merge(sharded, tmp_path / "merged", capsys)
    assert code == 0, err
    assert family_at(tmp_path / "merged") is family
    torch.testing.assert_close(logits_of(family, tmp_path / "merged"), case.logits, rtol=0, atol=0)


def test_glm_merge_refuses_a_family_it_cannot_write(case, tmp_path, capsys):
    family = case.family
    if "merge" in family.supports:
        pytest.skip(f"the {family.name} family declares merge: glm-merge merges it")
    code, err = _merge(case.saved, tmp_path / "merged", capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and family.name in err, err
    assert not (tmp_path / "merged").exists()


def _export(src: Path, out: Path, capsys) -> tuple[int, str]:
    from glm_port.convert.export import main

    return _exit_status(main, ["--model_name_or_path", str(src), "--output_path", str(out)], capsys)


def test_glm_export_keeps_the_logits(case, tmp_path, capsys):
    family = case.family
    if "export" not in family.supports:
        pytest.skip(f"the {family.name} family does not declare export (glm-export refuses it: the next test)")
    code, err = _export(case.saved, tmp_path / "exported", capsys)
    assert code == 0, err
    assert family_at(tmp_path / "exported") is family
    torch.testing.assert_close(logits_of(family, tmp_path / "exported"), case.logits, rtol=0, atol=0)


def test_glm_export_refuses_a_family_that_does_not_declare_it(case, tmp_path, capsys):
    family = case.family
    if "export" in family.supports:
        pytest.skip(f"the {family.name} family declares export: glm-export writes it")
    code, err = _export(case.saved, tmp_path / "exported", capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and f"the {family.name} family does not support glm-export" in err, err
    assert not (tmp_path / "exported").exists()


def test_glm_convert_round_trip_keeps_the_logits(case, tmp_path, capsys):
    from glm_port.convert.native import main

    family = case.family
    convert = binding_or_skip(family, "convert")
    there, back = tmp_path / "transformers", tmp_path / "back"
    assert main(["--to", "transformers", str(case.saved), str(there)]) == 0, capsys.readouterr().err
    raw = json.loads((there / "config.json").read_text())
    assert raw["model_type"] in convert.TRANSFORMERS_MODEL_TYPES
    assert main(["--from", "transformers", str(there), str(back)]) == 0, capsys.readouterr().err
    assert family_at(back) is family
    torch.testing.assert_close(logits_of(family, back), case.logits, rtol=0, atol=0)


def test_glm_convert_refuses_a_family_it_cannot_convert(case, tmp_path, capsys):
    from glm_port.convert.native import main

    family = case.family
    if family.convert is not None:
        pytest.skip(f"the {family.name} family has the convert binding: glm-convert converts it")
    assert main(["--to", "transformers", str(case.saved), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    # refused for what the directory is (its family, or a model type no converter reads), not misread as a
    # converting family's directory and failed on one of its files
    assert (f"SRC {case.saved}: glm-convert does not convert the {family.name} family" in err
            or f"{case.saved / 'config.json'}: model_type" in err), err
    assert not (tmp_path / "out").exists()


# ---- tensor parallel 2 = one process ----------------------------------------------------------------------
TP_WORK = "GLM_CONFORMANCE_TP_WORK"  # where the parent left each family's directory and its one-process results
TP_FAMILIES = [name for name, family in FAMILIES.items() if "tensor_parallel" in family.supports]


def _generate(directory, *flags) -> list[dict]:
    from glm_port.generation import cli

    args = cli.build_parser().parse_args(["--model", str(directory), "--json", "--max-new-tokens", str(NEW_TOKENS),
                                          "--min-new-tokens", str(NEW_TOKENS), *flags, PROMPT, "a [MASK] b"])
    return cli.run(args, out=io.StringIO(), err=io.StringIO())


def _local(tensor):
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _tensor_parallel_check(name):
    def check():
        work = Path(os.environ[TP_WORK]) / name
        expected = json.loads((work / "expected.json").read_text())
        generation = FAMILIES[name].binding("generation")
        load, loaded = generation.load, []

        def recording_load(*args, **kwargs):
            loaded.append(load(*args, **kwargs))
            return loaded[-1]

        generation.load = recording_load
        try:
            assert _generate(work / "model", "--tensor-parallel-size", "2") == expected
        finally:
            generation.load = load
        (model, _), = loaded  # split: this rank holds part of the weights
        local = sum(_local(p).numel() for p in model.parameters())
        whole = sum(p.numel() for p in model.parameters())
        assert local < whole, (local, whole)

    check.__name__ = f"check_tensor_parallel_2_{name}"
    return check


for _name in TP_FAMILIES:
    globals()[f"check_tensor_parallel_2_{_name}"] = _tensor_parallel_check(_name)
TP_CHECKS = {name: globals()[f"check_tensor_parallel_2_{name}"] for name in TP_FAMILIES}


def _launcher():
    """tests/distributed/conftest.py's ``run_checks`` (forked gloo ranks, one launch for every check)."""
    path = Path(__file__).resolve().parents[1] / "distributed" / "conftest.py"
    spec = importlib.util.spec_from_file_location("distributed_conftest", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.run_checks


@pytest.fixture(scope="module")
def tensor_parallel_results(tmp_path_factory):
    work = tmp_path_factory.mktemp("tensor-parallel")
    for name in TP_FAMILIES:
        family = FAMILIES[name]
        if family.generation is None:
            continue
        model, tokenizer = build_tiny(family)
        directory = save(family, model, tokenizer, work / name / "model")
        (work / name / "expected.json").write_text(json.dumps(_generate(directory)))
    os.environ[TP_WORK] = str(work)
    try:
        return _launcher()(TP_CHECKS, 2)
    finally:
        del os.environ[TP_WORK]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_tensor_parallel_2_equals_one_process(name, request):
    family = FAMILIES[name]
    if "tensor_parallel" not in family.supports:
        pytest.skip(f"the {name} family does not declare tensor_parallel")
    binding_or_skip(family, "generation")
    request.getfixturevalue("tensor_parallel_results").assert_passed(name)
