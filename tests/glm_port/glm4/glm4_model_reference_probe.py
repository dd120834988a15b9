"""Run THUDM's GLM-4 ``modeling_chatglm.py`` on a GLM-4 directory's weights (THUDM's layout) and save its logits.

    PYTHON glm4_model_reference_probe.py CODE_DIR MODEL_DIR WORK_DIR

Run by ``test_model_reference.py`` under a Python with transformers 4.x (what THUDM's code was written for).
``CODE_DIR`` holds glm-4-9b-chat's ``configuration_chatglm.py`` and ``modeling_chatglm.py`` (never part of this
project). ``WORK_DIR/inputs.pt``: a list of keyword-argument dicts for the forward pass; ``WORK_DIR/reference.pt``
gets the logits of each, fp32.
"""

import importlib
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


if __name__ == "__main__":
    main(*sys.argv[1:4])
