"""GLMForConditionalGeneration against THUDM's published Hugging Face GLM code, on the same small random
weights: logits of one forward, greedy tokens (ours cached, theirs recomputed) and the tokenizer's
build_inputs_for_generation on the GPT-2 vocabulary.

THUDM's code is fetched, never part of the project: GLM_HF_CODE names the directory holding its
modeling_glm.py / configuration_glm.py / tokenization_glm.py, GLM_REF_PYTHON a Python with
transformers 4.27 (the version it runs under). Skipped with a reason where either is absent.
"""

import os
import subprocess
from pathlib import Path

import pytest
import torch

from glm_port.models.glm import weights
from glm_port.models.glm.hf import GLMForConditionalGeneration, GLMPretrainedConfig
from glm_port.models.glm.tokenizer import GLMTokenizer

HF_CODE = os.environ.get("GLM_HF_CODE")
REF_PYTHON = os.environ.get("GLM_REF_PYTHON")
VOCAB = Path(os.environ.get("GLM_VOCAB") or Path(__file__).resolve().parents[2] / ".." / "shared" / "vocab")
PROBE = Path(__file__).with_name("glm_reference_probe.py")

pytestmark = pytest.mark.skipif(
    not (HF_CODE and Path(HF_CODE, "modeling_glm.py").is_file() and REF_PYTHON and Path(REF_PYTHON).is_file()),
    reason="THUDM's HF GLM code not given (set GLM_HF_CODE to a copy's directory and GLM_REF_PYTHON to a "
           "Python with transformers 4.27)")


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    work = tmp_path_factory.mktemp("reference")
    if not VOCAB.is_dir():
        pytest.skip(f"real vocab files not found at {VOCAB}")
    tokenizer = GLMTokenizer.from_pretrained(VOCAB / "gpt2-vocab.json")
    torch.manual_seed(0)
    config = GLMPretrainedConfig(num_layers=2, hidden_size=64, num_attention_heads=4,
                                 vocab_size=tokenizer.vocab_size, max_sequence_length=64, initializer_range=0.3)
    model = GLMForConditionalGeneration(config).eval()
    state = {k[len("glm."):]: v for k, v in model.state_dict().items()}
    weights.save_hf(state, work / "hf", {k: v for k, v in config.to_dict().items() if k != "attention_impl"})
    text = "Ng is an adjunct professor at [MASK] (he used to be the Director of Stanford AI Lab)."
    new = 8
    inputs = tokenizer.build_inputs_for_generation([text], max_gen_length=new + 1)
    ours = model.generate(**inputs, max_new_tokens=new, do_sample=False, eos_token_id=[tokenizer.eop_token_id],
                          pad_token_id=tokenizer.pad_token_id)
    n = ours.size(1)
    ours_logits = model(ours, position_ids=inputs.position_ids[:, :, :n],
                        attention_mask=inputs.generation_attention_mask[:, :, :n, :n]).logits
    (work / "vocab").mkdir()
    (work / "vocab" / "vocab.json").symlink_to(VOCAB / "gpt2-vocab.json")
    (work / "vocab" / "merges.txt").symlink_to(VOCAB / "gpt2-merges.txt")
    torch.save({"input_ids": inputs.input_ids, "position_ids": inputs.position_ids,
                "generation_attention_mask": inputs.generation_attention_mask, "full_ids": ours,
                "max_new_tokens": new, "max_gen_length": new + 1, "eop": tokenizer.eop_token_id, "pad": tokenizer.pad_token_id,
                "text": text}, work / "inputs.pt")
    run = subprocess.run([REF_PYTHON, str(PROBE), HF_CODE, str(work)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    reference = torch.load(work / "reference.pt")
    return dict(ours=ours, ours_logits=ours_logits, inputs=inputs, reference=reference)


def test_logits_match_thudms_code(compared):
    torch.testing.assert_close(compared["ours_logits"], compared["reference"]["logits"], rtol=1e-5, atol=1e-5)


def test_greedy_tokens_match_thudms_generate(compared):
    assert compared["ours"].tolist() == compared["reference"]["greedy"].tolist()


def test_build_inputs_match_thudms_tokenizer(compared):
    theirs, ours = compared["reference"]["tokenizer"], compared["inputs"]
    # Their text -> ids differs from upstream's in one place (a space after [MASK]; see the probe): the
    # same ids but that one.
    their_ids, our_ids = compared["reference"]["their_ids"][0].tolist(), ours.input_ids[0, :-1].tolist()
    assert len(their_ids) == len(our_ids)
    assert [(a, b) for a, b in zip(our_ids, their_ids) if a != b] == [(357, 7)]  # " (" vs "("
    assert ours.input_ids.tolist() == theirs["input_ids"].tolist()
    assert ours.position_ids.tolist() == theirs["position_ids"].tolist()
    assert ours.generation_attention_mask.int().tolist() == theirs["generation_attention_mask"].int().tolist()
