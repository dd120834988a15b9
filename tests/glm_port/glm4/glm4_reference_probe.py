"""Run THUDM's GLM-4 ``tokenization_chatglm.py`` (a fetched copy, never part of this project) on cases a test
wrote, in a Python whose transformers that code runs under (4.x).

    python glm4_reference_probe.py CODE_DIR WORK_DIR

WORK_DIR holds a tokenizer directory (``tokenizer.model`` and the ``tokenizer_config.json`` our tokenizer
saved, its ``chat_template`` replaced by THUDM's when the test had one) and ``cases.json``;
``reference.json`` is written there: the specials' ids, ``vocab_size``, per text its ids with and without
``[gMASK]<sop>`` and the decode of the latter, a left-padded batch, and per conversation the ids of
``build_chat_input`` (the first published version has it) and of ``apply_chat_template`` (text and ids, when
the directory has a template), and ``build_single_message`` on each ``(role, metadata, content)`` of ``single``.
"""

import json
import sys
from pathlib import Path

code, work = Path(sys.argv[1]), Path(sys.argv[2])
sys.path.insert(0, str(code))

from tokenization_chatglm import ChatGLM4Tokenizer  # noqa: E402  (the fetched copy)

tokenizer = ChatGLM4Tokenizer.from_pretrained(str(work / "tokenizer"))
cases = json.loads((work / "cases.json").read_text(encoding="utf-8"))
result = {"specials": tokenizer.convert_tokens_to_ids(cases["specials"]), "vocab_size": tokenizer.vocab_size,
          "eos": tokenizer.eos_token_id, "pad": tokenizer.pad_token_id, "text": [], "chat": [], "template": []}
for text in cases["texts"]:
    plain = tokenizer.encode(text, add_special_tokens=False)
    result["text"].append({"with_prefix": tokenizer(text)["input_ids"], "plain": plain,
                           "decoded": tokenizer.decode(plain, skip_special_tokens=True)})
batch = tokenizer(cases["texts"][:3], padding=True)
result["batch"] = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
for case in cases["chat"]:
    if hasattr(tokenizer, "build_chat_input"):
        inputs = tokenizer.build_chat_input(case["query"], history=case["history"], role=case["role"])
        result["chat"].append(inputs["input_ids"][0].tolist())
    else:
        result["chat"].append(None)
result["single"] = [tokenizer.build_single_message(*case) for case in cases["single"]]
for messages in cases["messages"]:
    if tokenizer.chat_template or "apply_chat_template" in vars(type(tokenizer)):  # July 2024's had it in code
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if ids and isinstance(ids[0], list):  # THUDM's July 2024 apply_chat_template (in code) returns a batch of one
            (ids,) = ids
        result["template"].append({"text": text, "input_ids": list(ids)})
    else:
        result["template"].append(None)
(work / "reference.json").write_text(json.dumps(result, ensure_ascii=False), encoding="utf-8")
