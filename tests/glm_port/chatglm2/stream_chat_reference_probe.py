"""Run THUDM's ChatGLM2 or ChatGLM3 ``stream_chat(..., return_past_key_values=True)`` (a fetched copy of
chatglm2-6b's or chatglm3-6b's modeling_chatglm.py, configuration_chatglm.py and tokenization_chatglm.py, never
part of this project) over a conversation a test wrote, in a Python whose transformers that code runs under
(4.x: its ``stream_generate`` calls generation helpers transformers 5 removed).

    python stream_chat_reference_probe.py chatglm2|chatglm3 CODE_DIR WORK_DIR

WORK_DIR holds ``tokenizer.model``, ``weights.pt`` (a state dict), ``config.json`` (ChatGLMConfig fields) and
``cases.json`` (``queries``, ``generate``: keyword arguments for every turn). ``reference.json`` is written
there, one entry per turn: the ids THUDM's ``stream_chat`` prefills for the turn (after a past, ChatGLM2's
``build_stream_inputs``, ChatGLM3's ``build_chat_input`` without the history), the ids ``generate``'s logits
processors last saw (that turn's ids and the reply but its last token), the response and history of the last
yield, the length of the past after the turn's last generation step and that past's first-layer keys
(``[s, b, groups, d]``), and the length of the past the last yield carried (``yield_past_length``: shorter
when THUDM's stream held its last steps back, their text ending inside a character; the next turn is given
the last step's past, so the turns compare whatever the tiny model happens to write). With
``real_tokenizer.model`` there too (ChatGLM2), ``stream_inputs``: THUDM's ``build_stream_inputs`` ids on that
vocabulary for each ``cases["stream_inputs"]`` (query, history).
"""

import copy
import importlib
import json
import sys
import types
from pathlib import Path

import torch
from transformers import LogitsProcessor, LogitsProcessorList

chat_format, code, work = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
package = types.ModuleType("thudm_chatglm2")  # a package around the directory, for its relative imports
package.__path__ = [str(code)]
sys.modules["thudm_chatglm2"] = package
configuration = importlib.import_module("thudm_chatglm2.configuration_chatglm")
modeling = importlib.import_module("thudm_chatglm2.modeling_chatglm")
tokenization = importlib.import_module("thudm_chatglm2.tokenization_chatglm")


class Seen(LogitsProcessor):
    """Keeps the ids the last generation step was given (THUDM's stream_generate passes them to processors)."""

    ids = None

    def __call__(self, input_ids, scores):
        Seen.ids = input_ids[0].tolist()
        return scores


config = configuration.ChatGLMConfig(**json.loads((work / "config.json").read_text()))
model = modeling.ChatGLMForConditionalGeneration(config, empty_init=False).eval()
missing, unexpected = model.load_state_dict(torch.load(work / "weights.pt"), strict=False)
assert unexpected == [] and missing == ["transformer.rotary_pos_emb.inv_freq"], (missing, unexpected)
tokenizer = tokenization.ChatGLMTokenizer(vocab_file=str(work / "tokenizer.model"))
cases = json.loads((work / "cases.json").read_text(encoding="utf-8"))

steps = {}
plain_stream_generate = model.stream_generate


def stream_generate(*args, **kwargs):  # keeps the last step's past, which stream_chat may not yield
    for item in plain_stream_generate(*args, **kwargs):
        steps["past"] = item[1]
        yield item


model.stream_generate = stream_generate
turns, history, past = [], [], None
for query in cases["queries"]:
    # what stream_chat builds: the whole prompt without a past, only the new turn with one
    if chat_format == "chatglm3":
        built = tokenizer.build_chat_input(query, **({"history": history} if past is None else {}))
    elif past is None:
        built = model.build_inputs(tokenizer, query, history=history)
    else:
        built = model.build_stream_inputs(tokenizer, query, history=history)
    last = None  # (ChatGLM3's stream_chat appends to the history it is given: it gets a copy)
    for last in model.stream_chat(tokenizer, query, copy.deepcopy(history), past_key_values=past,
                                  return_past_key_values=True,
                                  logits_processor=LogitsProcessorList([Seen()]), **cases["generate"]):
        pass
    assert last is not None, "THUDM's stream_chat yielded nothing (an empty reply)"
    response, history, yielded = last
    past = steps["past"]
    turns.append({"input_ids": built["input_ids"][0].tolist(), "seen_ids": Seen.ids, "response": response,
                  "history": history, "past_length": past[0][0].shape[0], "keys": past[0][0].tolist(),
                  "yield_past_length": yielded[0][0].shape[0]})
stream_inputs = []  # build_stream_inputs on the real vocabulary too, when the test copied it here
if chat_format == "chatglm2" and (work / "real_tokenizer.model").is_file():
    real = tokenization.ChatGLMTokenizer(vocab_file=str(work / "real_tokenizer.model"))
    for query, history in cases["stream_inputs"]:
        stream_inputs.append(model.build_stream_inputs(real, query, history=history)["input_ids"][0].tolist())
(work / "reference.json").write_text(json.dumps({"turns": turns, "stream_inputs": stream_inputs},
                                                ensure_ascii=False), encoding="utf-8")
