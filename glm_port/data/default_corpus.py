"""The embedded tiny corpus: short English paragraphs about a made-up valley, from a small grammar.

It exists so ``glm-pretrain`` runs with no arguments on a fresh machine: the text is regular enough that a tiny
GLM's loss falls visibly within ~100 iterations, and varied enough that blank infilling has something to
predict. ``default_corpus.txt`` (next to this file) is what this grammar writes; regenerate it with
``python -m glm_port.data.default_corpus`` (a test checks the two agree). Nothing imports this module at
run time: training reads the text file.
"""

from __future__ import annotations

import random
from glm_port.data.corpus import DEFAULT_CORPUS

SEED = 2021
NUM_PARAGRAPHS = 520

PEOPLE = ["Ada", "Bram", "Cora", "Dov", "Esme", "Finn", "Gala", "Hugo", "Ines", "Jory", "Kira", "Lev", "Mira",
          "Nico", "Orla", "Pim", "Quin", "Rosa", "Sami", "Tove"]
# trade -> (what they make, the verb for making it, where they work)
TRADES = {"baker": ("loaves", "bakes", "the oven"), "smith": ("nails", "forges", "the forge"),
          "weaver": ("scarves", "weaves", "the loom"), "potter": ("bowls", "shapes", "the wheel"),
          "fisher": ("trout", "catches", "the river"), "miller": ("sacks of flour", "grinds", "the mill"),
          "carpenter": ("chairs", "builds", "the bench"), "beekeeper": ("jars of honey", "fills", "the hives")}
PLACES = ["the north bridge", "the market square", "the old mill", "the hill farm", "the harbour",
          "the school", "the orchard", "the stone well", "the pine wood", "the lower meadow"]
TIMES = ["at dawn", "in the morning", "at noon", "in the afternoon", "at dusk", "late at night"]
# weather -> (how it arrives, what it did)
WEATHER = {"rain": ("heavy rain", "the roads turned to mud"), "snow": ("deep snow", "the children built a fort"),
           "wind": ("a strong wind", "the shutters banged all day"), "fog": ("thick fog", "nobody could see the hills"),
           "sun": ("bright sun", "the river shone like glass"), "frost": ("a hard frost", "the ponds froze solid")}
ANIMALS = ["a grey goat", "two geese", "an old dog", "a red fox", "a lost lamb", "three crows", "a white cat"]
FEELINGS = ["happy", "tired", "proud", "worried", "hungry", "calm"]
NUMBERS = ["two", "three", "four", "five", "six", "seven", "eight", "ten", "twelve"]


def _paragraph(rng: random.Random) -> str:
    person, friend = rng.sample(PEOPLE, 2)
    trade = rng.choice(list(TRADES))
    goods, verb, workplace = TRADES[trade]
    weather = rng.choice(list(WEATHER))
    arrival, effect = WEATHER[weather]
    place = rng.choice(PLACES)
    count = rng.choice(NUMBERS)
    sentences = [
        f"{person} is the {trade} of the valley.",
        rng.choice([f"Every day {person} works at {workplace} and {verb} {goods}.",
                    f"{person} goes to {workplace} {rng.choice(TIMES)} and {verb} {goods}.",
                    f"Most of the {goods} in the valley come from {person}."]),
        rng.choice([f"One day there was {arrival} and {effect}.",
                    f"When the {weather} came, {effect}."]),
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
    DEFAULT_CORPUS.write_text(generate(), encoding="utf-8")
    print(f"wrote {DEFAULT_CORPUS} ({DEFAULT_CORPUS.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
