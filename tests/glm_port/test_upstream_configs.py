"""Each of upstream's pretraining configs (config/ds_block*.sh in GLM_UPSTREAM) runs through glm-pretrain.

The script's options are read from the file itself (its ``gpt_options`` strings, with ``${MP_SIZE}`` = 1 and
``${config_json}`` its DeepSpeed JSON beside it), then only what cannot run here is overridden: the sizes
(a tiny model, 2 iterations, 2 evaluation batches), the paths (--save in a temporary directory; --load
dropped, its checkpoint not being here) and the corpora, whose upstream names resolve through a GLM_CORPORA
mapping to small files written here. Vocabularies come from $GLM_VOCAB_DIR or ../shared/vocab when present,
else the built-in one. Skipped without a THUDM/GLM checkout.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

from glm_port.pretrain_glm import main

UPSTREAM = Path(os.environ.get("GLM_UPSTREAM", "/nonexistent"))
CONFIGS = sorted((UPSTREAM / "config").glob("ds_block*.sh"))
VOCAB = Path(os.environ.get("GLM_VOCAB_DIR") or Path(__file__).resolve().parents[3] / "shared" / "vocab")
pytestmark = pytest.mark.skipif(not CONFIGS, reason="needs a THUDM/GLM checkout: set GLM_UPSTREAM=/path/to/GLM")

TINY = {"--num-layers": "1", "--hidden-size": "32", "--num-attention-heads": "2", "--seq-length": "32",
        "--max-position-embeddings": "64", "--train-iters": "2", "--eval-iters": "2", "--log-interval": "1"}
DROPPED = {"--load": 1}  # flag: how many values it takes
SENTENCES = ["The river runs past the mill and the miller counts the sacks.",
             "Every morning the baker lights the oven before the sun is up.",
             "A fisher mends the nets; the boats wait at the quiet harbour.",
             "Children walk to school along the road beside the wheat fields."]


def script_options(script: Path) -> list[str]:
    """The options a ds_block*.sh script hands to pretrain_glm.py."""
    text = script.read_text()
    parts = re.findall(r'gpt_options="(.*?)"', text, flags=re.DOTALL)
    joined = " ".join(parts).replace("${gpt_options}", "").replace("\\\n", " ")
    json_name = re.search(r'config_json="\$script_dir/(\S+?)"', text)[1]
    joined = joined.replace("${MP_SIZE}", "1").replace("${config_json}", str(script.parent / json_name))
    return shlex.split(joined)


def tiny_argv(options: list[str], save: Path) -> list[str]:
    argv, i = [], 0
    while i < len(options):
        flag = options[i]
        if flag in DROPPED:
            i += 1 + DROPPED[flag]
            continue
        if flag in TINY or flag == "--save":
            i += 2
            continue
        if flag in ("--tokenizer-type", "--tokenizer-model-type") and not VOCAB.is_dir():
            i += 2
            continue
        argv.append(flag)
        i += 1
    for flag, value in TINY.items():
        argv += [flag, value]
    return argv + ["--save", str(save)]


@pytest.fixture
def corpora(tmp_path, monkeypatch):
    """Every corpus name the configs use, mapped to a small JSON-lines file of English documents."""
    names = {name for script in CONFIGS for name in _train_data(script_options(script))}
    data = tmp_path / "corpus.jsonl"
    docs = [" ".join(SENTENCES[(i + j) % 4] for j in range(3 + i % 5)) for i in range(60)]
    data.write_text("".join('{"text": "%s"}\n' % doc for doc in docs))
    mapping = tmp_path / "corpora.toml"
    mapping.write_text("".join(f'{name} = "{data.name}"\n' for name in sorted(names)))
    monkeypatch.setenv("GLM_CORPORA", str(mapping))
    if VOCAB.is_dir():
        monkeypatch.setenv("GLM_VOCAB_DIR", str(VOCAB))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return names


def _train_data(options: list[str]) -> list[str]:
    start = options.index("--train-data") + 1
    end = next((i for i in range(start, len(options)) if options[i].startswith("--")), len(options))
    return options[start:end]


def test_options_are_read_from_the_scripts():
    options = script_options(UPSTREAM / "config" / "ds_block_large.sh")
    assert options[:3] == ["--block-lm", "--bert-prob", "1.0"]
    assert _train_data(options) == ["bert-large"] and "--deepspeed_config" in options
    assert Path(options[options.index("--deepspeed_config") + 1]).is_file()


@pytest.mark.parametrize("script", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_upstream_config_runs(script, corpora, tmp_path, capsys):
    options = script_options(script)
    main(tiny_argv(options, tmp_path / "save"))
    out = capsys.readouterr().out
    assert re.search(r"^ iteration +2/ +2 \| .* lm loss \d\.\d+E[+-]\d+ \|", out, re.MULTILINE), out
    assert "validation loss at the end of training for val data | LM loss: " in out
    assert "validation loss at the end of training for test data | LM loss: " in out
    name = options[options.index("--experiment-name") + 1]
    [saved] = (tmp_path / "save").iterdir()  # upstream's layout: --save/NAME<month-day-hour-minute>
    assert re.fullmatch(re.escape(name) + r"\d\d-\d\d-\d\d-\d\d", saved.name)
    assert (saved / "latest_checkpointed_iteration.txt").read_text() == "2"
