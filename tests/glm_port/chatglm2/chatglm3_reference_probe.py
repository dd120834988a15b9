"""Run THUDM's ChatGLM3 ``tokenization_chatglm.py`` (a fetched copy, never part of this project) on cases a
test wrote, in a Python whose transformers that code runs under (4.x: it calls ``batch_encode_plus``).

    python chatglm3_reference_probe.py CODE_DIR WORK_DIR

WORK_DIR holds ``tokenizer.model`` and ``cases.json``; ``reference.json`` is written there: the ids of the
nine specials, ``vocab_size``, and per case the ``build_chat_input`` ids and attention mask, THUDM's decode
of them, and the ids of a text with role tokens in it under ``encode_special_tokens`` on and off.
"""

import json
import sys
from pathlib import Path

code, work = Path(sys.argv[1]), Path(sys.argv[2])
sys.path.insert(0, str(code))

from tokenization_chatglm import ChatGLMTokenizer  # noqa: E402  (the fetched copy)

model = str(work / "tokenizer.model")
tokenizer = ChatGLMTokenizer(vocab_file=model)
specials = ["[MASK]", "[gMASK]", "[sMASK]", "sop", "eop", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"]
cases = json.loads((work / "cases.json").read_text(encoding="utf-8"))
result = {"specials": [tokenizer.get_command(t) for t in specials], "vocab_size": tokenizer.vocab_size, "chat": [],
          "text": []}
for case in cases["chat"]:
    inputs = tokenizer.build_chat_input(case["query"], history=case["history"], role=case["role"])
    ids = inputs["input_ids"][0].tolist()
    result["chat"].append({"input_ids": ids, "attention_mask": inputs["attention_mask"][0].tolist(),
                           "decoded": tokenizer.decode(ids)})
try:
    special_text = ChatGLMTokenizer(vocab_file=model, encode_special_tokens=True)
except TypeError:  # copies from before THUDM added the option
    special_text = None
for text in cases["text"]:
    result["text"].append({"plain": tokenizer(text)["input_ids"],
                           "special": special_text(text)["input_ids"] if special_text else None})
(work / "reference.json").write_text(json.dumps(result, ensure_ascii=False), encoding="utf-8")
