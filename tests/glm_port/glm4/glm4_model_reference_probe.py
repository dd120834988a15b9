"""Run THUDM's GLM-4 ``modeling_chatglm.py`` on a GLM-4 directory's weights (THUDM's layout) and save its logits.

    PYTHON glm4_model_reference_probe.py CODE_DIR MODEL_DIR WORK_DIR

Run by ``test_model_reference.py`` under a Python with transformers 4.x (what THUDM's code was written for).
``CODE_DIR`` holds glm-4-9b-chat's ``configuration_chatglm.py`` and ``modeling_chatglm.py`` (never part of this
project). ``WORK_DIR/inputs.pt``: a list of keyword-argument dicts for the forward pass; ``WORK_DIR/reference.pt``
gets the logits of each, fp32. With ``WORK_DIR/greedy.pt`` (``input_ids`` and ``steps``), ``WORK_DIR/greedy_reference.pt``
gets THUDM's greedy continuation two ways: ``generate`` (``do_sample=False``, no end id) and a loop over THUDM's
forward with its cache (``past_key_values``, the next position as ``position_ids``), with each step's last logits.
"""

import importlib
import inspect
import os
import sys
import types

import torch
from safetensors.torch import load_file


def main(code, model_dir, work):
    name = "thudm_glm4_reference"
    package = types.ModuleType(name)  # a package around CODE_DIR, for modeling_chatglm's relative import
    package.__path__ = [code]
    sys.modules[name] = package
    configuration = importlib.import_module(f"{name}.configuration_chatglm")
    modeling = importlib.import_module(f"{name}.modeling_chatglm")
    config = configuration.ChatGLMConfig.from_pretrained(model_dir)
    config.torch_dtype = torch.float32
    model = modeling.ChatGLMForConditionalGeneration(config, empty_init=False).float().eval()
    missing, unexpected = model.load_state_dict(load_file(f"{model_dir}/model.safetensors"), strict=False)
    if unexpected or any(not key.endswith("rotary_pos_emb.inv_freq") for key in missing):
        raise SystemExit(f"weights do not fit THUDM's model: missing {missing}, unexpected {unexpected}")
    logits = []
    with torch.no_grad():
        for kwargs in torch.load(f"{work}/inputs.pt"):
            logits.append(model(**kwargs, use_cache=False).logits.float())
    torch.save(logits, f"{work}/reference.pt")
    if os.path.exists(f"{work}/greedy.pt"):
        torch.save(greedy(model, **torch.load(f"{work}/greedy.pt")), f"{work}/greedy_reference.pt")


def _transformers_4_44_for_thudms_generation_hooks(wants_pair: bool):
    """THUDM's mid-2024 ``_update_model_kwargs_for_generation`` calls transformers'
    ``_extract_past_from_model_output(outputs, standardize_cache_format=...)``, taking its result as the cache
    (early July) or as ``(cache_name, cache)`` (late July); transformers 4.44 dropped the argument and returns the
    pair. Under such a transformers, give THUDM's call what it expects (a patch on transformers' class in this
    process; THUDM's file is left as published). Older transformers (4.40, the copy's own pin) are left alone."""
    from transformers.generation.utils import GenerationMixin

    extract = GenerationMixin._extract_past_from_model_output
    if "standardize_cache_format" in inspect.signature(extract).parameters:
        return

    def legacy(self, outputs, standardize_cache_format=False):
        pair = extract(self, outputs)
        return pair if wants_pair else pair[1]

    GenerationMixin._extract_past_from_model_output = legacy


def greedy(model, input_ids, steps):
    _transformers_4_44_for_thudms_generation_hooks(
        "cache_name, cache = self._extract_past_from_model_output" in inspect.getsource(type(model)))
    with torch.no_grad():
        generated = model.generate(input_ids, do_sample=False, max_new_tokens=steps, min_new_tokens=steps,
                                   eos_token_id=None, pad_token_id=model.config.pad_token_id)
        out = model(input_ids=input_ids, use_cache=True, return_dict=True)
        tokens, logits = [], []
        for step in range(steps):
            last = out.logits[:, -1].float()
            logits.append(last)
            tokens.append(last.argmax(-1, keepdim=True))
            if step + 1 < steps:
                position = torch.full_like(tokens[-1], input_ids.shape[1] + step)
                out = model(input_ids=tokens[-1], position_ids=position, past_key_values=out.past_key_values,
                            use_cache=True, return_dict=True)
    return {"generate": generated[:, input_ids.shape[1]:], "tokens": torch.cat(tokens, 1),
            "logits": torch.stack(logits, 1)}


if __name__ == "__main__":
    main(*sys.argv[1:4])
