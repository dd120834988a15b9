"""Our GLM-4 against THUDM's own GLM-4 ``modeling_chatglm.py`` on the same tiny random weights (opt-in; THUDM's
code never ships with this project).

    GLM4_CODE=/dir/with/modeling_chatglm.py  GLM4_PYTHON=/python/with/transformers-4.x  pytest ...

``GLM4_CODE`` holds glm-4-9b-chat's ``configuration_chatglm.py`` and ``modeling_chatglm.py`` (the same directory
may hold its tokenizer code for ``test_reference.py``); ``GLM4_PYTHON`` (or ``GLM_REF_PYTHON``) is a Python with
transformers 4.x, which that code needs (4.44: the probe adapts THUDM's mid-2024 generation hooks to its
``_extract_past_from_model_output``; the early-July copy's own pin, 4.40.0, also works); THUDM's model runs there in a subprocess
(glm4_model_reference_probe.py) on a tiny GLM-4 written here in THUDM's layout (``rope_ratio`` 500, every weight
random): the logits of a batch and of a left-padded batch, then six greedy steps with the cache (THUDM's ``generate``
and THUDM's cached forward step by step) give our tokens and our logits.
"""

import os
import subprocess
from pathlib import Path

import pytest
import torch

CODE = os.environ.get("GLM4_CODE")
PYTHON = os.environ.get("GLM4_PYTHON") or os.environ.get("GLM_REF_PYTHON")
PROBE = Path(__file__).with_name("glm4_model_reference_probe.py")

pytestmark = pytest.mark.skipif(
    not (CODE and all(Path(CODE, f).is_file() for f in ("modeling_chatglm.py", "configuration_chatglm.py"))
         and PYTHON and Path(PYTHON).is_file()),
    reason="THUDM's GLM-4 model code not given (set GLM4_CODE to the directory of a copy of glm-4-9b-chat's "
           "modeling_chatglm.py and configuration_chatglm.py and GLM4_PYTHON, or GLM_REF_PYTHON, to a Python with "
           "transformers 4.x, which that code needs)")


def test_logits_match_thudms_glm4_code(tmp_path):
    from glm_port.models.chatglm2.config import CACHE_KWARG
    from glm_port.models.glm4 import GLM4ForCausalLM
    from glm_port.models.glm4.tiny import build_tokenizer, tiny_config, write_directory

    (tmp_path / "tok").mkdir()
    tokenizer = build_tokenizer(str(tmp_path / "tok"))
    torch.manual_seed(0)
    model = GLM4ForCausalLM(tiny_config(tokenizer)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    write_directory(model, tokenizer, tmp_path / "model")
    ids = torch.randint(0, len(tokenizer), (2, 16), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # THUDM's tokenizer pads position_ids with 0 on the left
    inputs = [{"input_ids": ids}, {"input_ids": ids, "attention_mask": mask, "position_ids": positions}]
    torch.save(inputs, tmp_path / "inputs.pt")
    steps = 6
    torch.save({"input_ids": ids, "steps": steps}, tmp_path / "greedy.pt")
    run = subprocess.run([PYTHON, str(PROBE), CODE, str(tmp_path / "model"), str(tmp_path)], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    plain, padded = torch.load(tmp_path / "reference.pt")
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, plain, rtol=1e-5, atol=1e-5)
        ours = model(ids, attention_mask=mask, position_ids=positions).logits
    torch.testing.assert_close(ours[0], padded[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours[1, 5:], padded[1, 5:], rtol=1e-5, atol=1e-5)  # the tokens, not the padding

    # greedy decoding with the cache: THUDM's generate and THUDM's cached forward, step by step, against ours
    theirs = torch.load(tmp_path / "greedy_reference.pt")
    with torch.no_grad():
        generated = model.generate(ids, do_sample=False, max_new_tokens=steps, min_new_tokens=steps, use_cache=True,
                                   eos_token_id=None, pad_token_id=model.config.pad_token_id)[:, ids.shape[1]:]
        out = model(ids, use_cache=True)
        tokens, logits = [], []
        for _ in range(steps):
            logits.append(out.logits[:, -1])
            tokens.append(logits[-1].argmax(-1, keepdim=True))
            out = model(tokens[-1], **{CACHE_KWARG: getattr(out, CACHE_KWARG)}, use_cache=True)
    assert theirs["generate"].tolist() == theirs["tokens"].tolist()  # THUDM's two ways agree
    assert generated.tolist() == theirs["generate"].tolist()
    assert torch.cat(tokens, 1).tolist() == theirs["tokens"].tolist()
    torch.testing.assert_close(torch.stack(logits, 1), theirs["logits"], rtol=1e-5, atol=1e-5)
