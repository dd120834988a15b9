"""Run THUDM's Hugging Face GLM code (a fetched copy, never part of this project) on weights and inputs a
test wrote, in a Python that has transformers 4.27 (the version that code runs under).

    python glm_reference_probe.py HF_CODE_DIR WORK_DIR

WORK_DIR holds ``hf/`` (config.json + model.safetensors) and ``inputs.pt``; ``reference.pt`` is written
there: the logits of one forward, the greedy tokens of THUDM's own ``generate`` (no cache: its
``prepare_inputs_for_generation(past=...)`` never receives one under newer transformers) and, when
``vocab/`` is there, its tokenizer's ``build_inputs_for_generation``.

THUDM's MLP uses transformers' erf GELU; the weights were trained with upstream's tanh form, which
glm_port keeps, so the probe swaps in the tanh form for the comparison.
"""

import json
import math
import sys
from pathlib import Path

import torch

code, work = Path(sys.argv[1]), Path(sys.argv[2])
sys.path.insert(0, str(code))

import modeling_glm  # noqa: E402  (the fetched copy)
from configuration_glm import GLMConfig  # noqa: E402


def tanh_gelu(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


modeling_glm.gelu = tanh_gelu

config = GLMConfig(**{**json.loads((work / "hf" / "config.json").read_text()), "output_predict": True})
model = modeling_glm.GLMForConditionalGeneration(config).eval()
from safetensors.torch import load_file  # noqa: E402

missing, unexpected = model.load_state_dict(load_file(str(work / "hf" / "model.safetensors")), strict=False)
assert not missing and not unexpected, (missing, unexpected)
inputs = torch.load(work / "inputs.pt")
out = {}
with torch.no_grad():
    mask = inputs["generation_attention_mask"].float()
    n = inputs["full_ids"].size(1)
    out["logits"] = model(input_ids=inputs["full_ids"], position_ids=inputs["position_ids"][:, :, :n],
                          attention_mask=mask[:, :, :n, :n]).logits
    generated = model.generate(input_ids=inputs["input_ids"], position_ids=inputs["position_ids"],
                               generation_attention_mask=mask, max_new_tokens=inputs["max_new_tokens"],
                               eos_token_id=inputs["eop"], pad_token_id=inputs["pad"], do_sample=False,
                               num_beams=1)
    out["greedy"] = generated
if (work / "vocab").is_dir():
    import tokenization_glm

    tokenizer = tokenization_glm.GLMGPT2Tokenizer(str(work / "vocab" / "vocab.json"),
                                                  str(work / "vocab" / "merges.txt"))
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|endoftext|>", "<|startofpiece|>",
                                                                "<|endofpiece|>", "[CLS]", "[MASK]", "[SEP]",
                                                                "[UNUSED]", "[gMASK]", "[sMASK]"]})
    tokenizer.mask_token, tokenizer.cls_token, tokenizer.eos_token = "[MASK]", "[CLS]", "<|endoftext|>"
    tokenizer.pad_token = "<|endoftext|>"
    # The layout is compared on our ids: THUDM's slow tokenizer also strips the space after a special token,
    # where upstream's command tokens strip only the one before (lstrip), as glm_port does.
    from transformers import BatchEncoding

    prompt = inputs["input_ids"][:, :-1]
    encoded = BatchEncoding({"input_ids": prompt, "attention_mask": torch.ones_like(prompt)})
    out["their_ids"] = tokenizer(inputs["text"], return_tensors="pt").input_ids
    built = tokenizer.build_inputs_for_generation(encoded, max_gen_length=inputs["max_gen_length"])
    out["tokenizer"] = {k: v for k, v in built.items()}
torch.save(out, work / "reference.pt")
