"""The embedded tiny corpus: short English paragraphs about a made-up valley, from a small grammar.

It exists so ``glm-pretrain`` runs with no arguments on a fresh machine: the text is regular enough that a tiny
GLM's loss falls visibly within ~100 iterations, and varied enough that blank infilling has something to
predict. ``default_corpus.txt`` (next to this file) is what this grammar writes; regenerate it with
``python -m glm_port.data.default_corpus`` (a test checks the two agree).
"""

from __future__ import annotations

import random
from pathlib import Path

CORPUS_FILE = Path(__file__).with_name("default_corpus.txt")
SEED = 2021
NUM_PARAGRAPHS = 520

PEOPLE = ["Ada", "Bram", "Cora", "Dov", "Esme", "Finn", "Gala", "Hugo", "Ines", "Jory", "Kira", "Lev", "Mira",
          "Nico", "Orla", "Pim", "Quin", "Rosa", "Sami", "Tove"]
TRADES = {"baker": ("bread", "the oven"), "smith": ("nails", "the forge"), "weaver": ("cloth", "the loom"),
          "potter": ("bowls", "the wheel"), "fisher": ("trout", "the river"), "miller": ("flour", "the mill"),
          "carpenter": ("chairs", "the bench"), "beekeeper": ("honey", "the hives")}
PLACES = ["the north bridge", "the market square", "the old mill", "the hill farm", "the harbour",
          "the school", "the orchard", "the stone well", "the pine wood", "the lower meadow"]
TIMES = ["at dawn", "in the morning", "at noon", "in the afternoon", "at dusk", "late at night"]
WEATHER = {"rain": "the roads turned to mud", "snow": "the children built a fort",
           "wind": "the shutters banged all day", "fog": "nobody could see the hills",
           "sun": "the river shone like glass", "frost": "the ponds froze solid"}
ANIMALS = ["a grey goat", "two geese", "an old dog", "a red fox", "a lost lamb", "three crows", "a white cat"]
FEELINGS = ["happy", "tired", "proud", "worried", "hungry", "calm"]
NUMBERS = ["two", "three", "four", "five", "six", "seven", "eight", "ten", "twelve"]


def _paragraph(rng: random.Random) -> str:
    person, friend = rng.sample(PEOPLE, 2)
    trade = rng.choice(list(TRADES))
    goods, workplace = TRADES[trade]
    weather = rng.choice(list(WEATHER))
    place = rng.choice(PLACES)
    count = rng.choice(NUMBERS)
    sentences = [
        f"{person} is the {trade} of the valley.",
        rng.choice([f"Every day {person} works at {workplace} and makes {goods}.",
                    f"{person} goes to {workplace} {rng.choice(TIMES)} to make {goods}.",
                    f"Most of the {goods} in the valley come from {person}."]),
        rng.choice([f"One day there was {weather} and {WEATHER[weather]}.",
                    f"When the {weather} came, {WEATHER[weather]}."]),
        rng.choice([f"{person} met {friend} near {place} and gave {friend} {count} {goods}.",
                    f"{friend} walked to {place} to buy {count} {goods} from {person}.",
                    f"At {place}, {person} saw {rng.choice(ANIMALS)} and told {friend} about it."]),
        rng.choice([f"That evening {person} felt {rng.choice(FEELINGS)}.",
                    f"{friend} said thank you, and {person} went home {rng.choice(TIMES)}.",
                    f"Why did {friend} need {goods}? Nobody knows!"]),
    ]
    return " ".join(sentences[: rng.randint(3, len(sentences))])


def generate(seed: int = SEED, num_paragraphs: int = NUM_PARAGRAPHS) -> str:
    """The corpus text: paragraphs (documents) separated by blank lines."""
    rng = random.Random(seed)
    return "\n\n".join(_paragraph(rng) for _ in range(num_paragraphs)) + "\n"


def main() -> None:
    CORPUS_FILE.write_text(generate(), encoding="utf-8")
    print(f"wrote {CORPUS_FILE} ({CORPUS_FILE.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
