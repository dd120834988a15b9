"""The embedded task ``glm-finetune`` learns with no arguments: give the words of a phrase in reverse order.

Phrases are runs of 3 to 6 words of the embedded corpus, drawn with a fixed seed, so every machine
builds the same training and evaluation sets with no download. A model that has not learned the task
scores near zero on ROUGE-2 and ROUGE-L (order matters to both); one that has, near 100.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from glm_port.data.corpus import DEFAULT_CORPUS

TRAIN_SAMPLES, EVAL_SAMPLES = 4000, 48


def _phrases(count: int, seed: int) -> list[dict]:
    words = re.findall(r"[a-z]+", DEFAULT_CORPUS.read_text(encoding="utf-8").lower())
    rng = random.Random(seed)
    samples = []
    for _ in range(count):
        length = rng.randint(3, 6)
        start = rng.randrange(len(words) - length)
        phrase = words[start:start + length]
        samples.append({"source": " ".join(phrase), "target": " ".join(reversed(phrase))})
    return samples


def write_toy_task(directory: Path) -> tuple[Path, Path]:
    """``train.json`` and ``dev.json`` of the embedded task in ``directory`` (plain layout)."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, count, seed in (("train.json", TRAIN_SAMPLES, 1), ("dev.json", EVAL_SAMPLES, 2)):
        path = directory / name
        path.write_text("".join(json.dumps(s) + "\n" for s in _phrases(count, seed)), encoding="utf-8")
        paths.append(path)
    return paths[0], paths[1]
