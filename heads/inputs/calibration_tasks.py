"""Zero-shot evaluation tasks for ACT calibration: JSONL formats, loading, prompts, splits.

Two line formats (one JSON object per line; a file holds one format):

- classification: ``{"text": str, "labels": [str, ...], "label": str}``
- multiple choice: ``{"question": str, "options": [str, ...], "answer": "B" | 1 | option text}``

Both take an optional ``"instruction"`` (shown before the item; a default is used otherwise)
and an optional ``"id"``. Evaluation is as in ACT: the prompt ends in ``Answer:`` and the
prediction is the argmax, at the last position, over the logits of the first token of each
``" " + label`` (classification) or of each answer letter ``" A"``, ``" B"``, ...
(multiple choice). Labels must start with distinct tokens.

Bundled tasks (``heads/data/tasks/*.jsonl``) were generated for this project by
:func:`write_bundled` (``python -m headhunt.heads.inputs.calibration_tasks DIR``) from hand-written templates and
word lists with verifiable answers; no third-party data set is used.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from headhunt.errors import HeadhuntError
from headhunt.reading import read_rows

Kind = Literal["classification", "multiple_choice"]
LETTERS = "ABCDEFGH"


@dataclass
class TaskItem:
    """One item, ready to be rendered.

    Attributes:
        prompt: the full text given to the model (ends with ``Answer:``).
        choices: the strings whose first token is scored (``" positive"``, ``" A"``, ...).
        answer: index of the right choice.
    """

    prompt: str
    choices: list[str]
    answer: int


@dataclass
class Task:
    """A loaded task: its name, format and items (in file order)."""

    name: str
    kind: Kind
    items: list[TaskItem]


def bundled_tasks() -> list[str]:
    """Names of the tasks shipped with headhunt."""
    folder = resources.files("headhunt.heads") / "data" / "tasks"
    return sorted(p.name[: -len(".jsonl")] for p in folder.iterdir() if p.name.endswith(".jsonl"))


def load_task(spec: str | os.PathLike) -> Task:
    """Load a bundled task by name, or a JSONL file.

    Raises:
        HeadhuntError: unknown name, unreadable file, malformed line, unknown label, mixed
            formats, empty task.
    """
    path = Path(spec).expanduser()
    if not path.is_file():
        names = bundled_tasks()
        if str(spec) not in names:
            raise HeadhuntError(
                f"no task file {spec!r} and no bundled task of that name "
                f"(bundled: {', '.join(names)})"
            )
        path = Path(str(resources.files("headhunt.heads") / "data" / "tasks" / f"{spec}.jsonl"))
    kind: Kind | None = None
    items = []
    for no, obj in read_rows(path, "task file "):
        if not isinstance(obj, dict):
            raise HeadhuntError(f"{path.name} line {no}: expected a JSON object")
        this: Kind = "multiple_choice" if "question" in obj else "classification"
        if kind is not None and this != kind:
            raise HeadhuntError(
                f"{path.name} line {no}: mixes multiple-choice and classification items"
            )
        kind = this
        items.append(_parse_item(obj, this, f"{path.name} line {no}"))
    if not items:
        raise HeadhuntError(f"task file {path} holds no items")
    return Task(name=path.stem, kind=kind or "classification", items=items)


def _parse_item(obj: dict[str, Any], kind: Kind, where: str) -> TaskItem:
    instruction = obj.get("instruction")
    if instruction is not None and not isinstance(instruction, str):
        raise HeadhuntError(f"{where}: 'instruction' must be a string")
    if kind == "classification":
        text, labels, label = obj.get("text"), obj.get("labels"), obj.get("label")
        if not isinstance(text, str) or not text.strip():
            raise HeadhuntError(f"{where}: needs a non-empty string 'text'")
        if not _str_list(labels) or len(labels) < 2 or len(set(labels)) != len(labels):
            raise HeadhuntError(f"{where}: 'labels' must list at least 2 distinct strings")
        if label not in labels:
            raise HeadhuntError(f"{where}: label {label!r} is not one of the labels {labels}")
        instruction = instruction or (
            f"Classify the text. Answer with one of: {', '.join(labels)}."
        )
        prompt = f"{instruction}\n\n{text.strip()}\nAnswer:"
        return TaskItem(prompt, [f" {x.strip()}" for x in labels], labels.index(label))
    question, options, answer = obj.get("question"), obj.get("options"), obj.get("answer")
    if not isinstance(question, str) or not question.strip():
        raise HeadhuntError(f"{where}: needs a non-empty string 'question'")
    if not _str_list(options) or not 2 <= len(options) <= len(LETTERS):
        raise HeadhuntError(f"{where}: 'options' must list 2 to {len(LETTERS)} strings")
    letters = LETTERS[: len(options)]
    if isinstance(answer, int) and not isinstance(answer, bool) and 0 <= answer < len(options):
        idx = answer
    elif isinstance(answer, str) and answer.strip() in letters and len(answer.strip()) == 1:
        idx = letters.index(answer.strip())
    elif isinstance(answer, str) and answer in options:
        idx = options.index(answer)
    else:
        raise HeadhuntError(
            f"{where}: answer {answer!r} is not an option, a letter {letters[0]}-{letters[-1]} "
            "or a 0-based index"
        )
    instruction = instruction or "Answer the question with the letter of the correct option."
    body = "\n".join(f"{c}. {o}" for c, o in zip(letters, options, strict=False))
    prompt = f"{instruction}\n\n{question.strip()}\n{body}\nAnswer:"
    return TaskItem(prompt, [f" {c}" for c in letters], idx)


def _str_list(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(s, str) and s.strip() for s in x)


@dataclass
class Split:
    """Disjoint item indices of the three splits."""

    calibration: list[int]
    dev: list[int]
    test: list[int]

    def to_dict(self) -> dict[str, list[int]]:
        return {"calibration": self.calibration, "dev": self.dev, "test": self.test}


def split_task(
    n_items: int, n_calib: int, n_dev: int, n_test: int | None = None, seed: int = 0
) -> Split:
    """Shuffle item indices (seeded) into calibration / dev / test; test takes the rest
    (at most ``n_test``)."""
    if min(n_calib, n_dev) < 1 or (n_test is not None and n_test < 1):
        raise HeadhuntError("each split needs at least one item")
    if n_items < n_calib + n_dev + 1:
        raise HeadhuntError(
            f"the task has {n_items} items; calibration ({n_calib}) + dev ({n_dev}) "
            "leave none for the test split"
        )
    order = list(range(n_items))
    random.Random(seed).shuffle(order)
    rest = order[n_calib + n_dev :]
    return Split(
        calibration=sorted(order[:n_calib]),
        dev=sorted(order[n_calib : n_calib + n_dev]),
        test=sorted(rest if n_test is None else rest[:n_test]),
    )


# ---------------------------------------------------------------------------------------
# Bundled task generators. Fixed seeds: rerunning write_bundled reproduces the files.
# ---------------------------------------------------------------------------------------


def _labelled(text: str, labels: list[str], label: str, instruction: str) -> dict[str, Any]:
    """One classification item of a bundled task, as its JSONL line holds it."""
    return {"text": text, "labels": labels, "label": label, "instruction": instruction}


def _sentiment(rng: random.Random) -> list[dict[str, Any]]:
    domains = {
        "restaurant": ["the food", "the service", "the pasta", "our waiter", "the dessert"],
        "film": ["the movie", "the plot", "the acting", "the ending", "the soundtrack"],
        "hotel": ["the room", "the bed", "the staff", "the breakfast", "the view"],
        "phone": ["the phone", "the battery", "the screen", "the camera", "the speaker"],
        "book": ["the novel", "the story", "the characters", "the writing", "the last chapter"],
    }
    pos = ["excellent", "wonderful", "superb", "delightful", "fantastic", "great", "lovely"]
    pos += ["outstanding", "brilliant", "charming", "impressive", "pleasant", "perfect"]
    neg = ["terrible", "awful", "disappointing", "dreadful", "poor", "horrible", "bland"]
    neg += ["boring", "mediocre", "unpleasant", "awkward", "sloppy", "a mess"]
    adv = ["", "really ", "truly ", "absolutely ", "quite ", "very ", "simply "]
    pos_vp = ["exceeded every expectation", "made my whole week", "was worth every penny"]
    pos_vp += ["put a smile on my face", "impressed everyone I know"]
    neg_vp = ["ruined the whole evening", "was a waste of money", "let me down completely"]
    neg_vp += ["made me regret coming", "left a bad taste"]
    instructions = [
        "Is the sentiment of this review positive or negative?",
        "Decide whether the review below is positive or negative.",
        "Read the review. Answer positive or negative.",
    ]
    items = []
    for i in range(1500):
        good = i % 2 == 0
        dom = rng.choice(sorted(domains))
        a, b = rng.sample(domains[dom], 2)
        adj = pos if good else neg
        x, y = rng.sample(adj, 2)
        form = rng.randrange(7)
        if form == 0:
            text = f"{a.capitalize()} was {rng.choice(adv)}{x}."
        elif form == 1:
            text = f"I thought {a} was {x}, and {b} was {rng.choice(adv)}{y}."
        elif form == 2:
            text = f"Honestly, {a} {rng.choice(pos_vp if good else neg_vp)}."
        elif form == 3:
            verb = "would happily recommend" if good else "would never recommend"
            text = f"{a.capitalize()} was {x}. I {verb} this {dom} to a friend."
        elif form == 4:
            opener = rng.choice(["I was worried at first", "My expectations were low"])
            if not good:
                opener = rng.choice(["It looked promising", "Friends had praised it"])
            text = f"{opener}, but {a} turned out {rng.choice(adv)}{x}."
        elif form == 5:
            stars = rng.choice(["five stars", "ten out of ten"] if good else ["one star"])
            text = f"{x.capitalize()}! {a.capitalize()} was {y}. {stars.capitalize()}."
        else:
            feel = "loved" if good else "hated"
            text = f"We {feel} this {dom}: {a} was {x} and {b} was {y}."
        label = "positive" if good else "negative"
        items.append(
            _labelled(f"Review: {text}", ["positive", "negative"], label, rng.choice(instructions))
        )
    return items


def _topic(rng: random.Random) -> list[dict[str, Any]]:
    teams = ["the Rovers", "the Falcons", "City", "the Tigers", "United", "the Comets"]
    firms = ["Norland Foods", "Brightwave", "Halcyon Motors", "Pellar Bank", "Orrin Steel"]
    places = ["a lab in Oslo", "a university in Chile", "an institute in Kyoto", "a team in Ghana"]
    templates = {
        "sports": [
            "{t1} beat {t2} {g1}-{g2} in the final on {day}.",
            "The coach praised her players after {t1} won on {day}.",
            "A late goal gave {t1} a {g1}-{g2} draw against {t2}.",
            "The tennis champion lost in round {n} of the tournament.",
            "{t1} signed a new striker before the start of the season.",
            "The marathon runner set a course record on {day} morning.",
            "The goalkeeper of {t1} was injured during training.",
        ],
        "business": [
            "Shares of {firm} rose {n} percent after the quarterly report.",
            "{firm} plans to hire {n}00 workers at its new factory.",
            "Investors sold {firm} stock after profits fell for a third quarter.",
            "The central bank kept interest rates at {n} percent on {day}.",
            "{firm} agreed to buy a smaller rival for {n} million dollars.",
            "Sales at {firm} grew {n} percent thanks to exports.",
            "The company cut prices to win back customers from {firm}.",
        ],
        "science": [
            "Researchers at {place} discovered a new species of {animal}.",
            "A telescope recorded light from a galaxy {n} billion years old.",
            "Scientists at {place} measured how fast glaciers are melting.",
            "An experiment at {place} showed that cells repair their own DNA.",
            "Physicists at {place} built a more stable quantum chip.",
            "A study of {n}00 volcanoes explained how eruptions begin.",
            "Biologists at {place} tracked {n}0 whales across the ocean.",
            "A new vaccine against {disease} was tested on {n}00 volunteers at {place}.",
            "Astronomers at {place} found a planet that circles its star every {n} days.",
            "Chemists at {place} made a battery that charges in {n} minutes.",
            "Fossils found near {town} show that dinosaurs lived there {n}0 million years ago.",
        ],
        "food": [
            "Add the chopped onions to the pan and stir for {n} minutes.",
            "This soup recipe needs {n} carrots, garlic and fresh thyme.",
            "Knead the dough, then let it rise for {n}0 minutes before baking.",
            "On {day} the chef served grilled fish with lemon butter and rice.",
            "Whisk {n} eggs with sugar until the mixture turns pale.",
            "Roast the vegetables with olive oil for {n}0 minutes until golden.",
            "A good curry starts with {n} toasted spices and slow-cooked onions.",
            "Simmer the {ingredient} in the tomato sauce for {n} minutes.",
            "Serve the {dish} warm with a spoon of yogurt and fresh herbs.",
            "Mix {n} cups of flour with cold butter to make the {dish} crust.",
            "Season the {ingredient} with salt and pepper before frying them.",
        ],
    }
    days = ["Monday", "Tuesday", "Friday", "Saturday", "Sunday"]
    labels = sorted(templates)
    instructions = [
        "What is the topic of this news line: sports, business, science or food?",
        "Classify the sentence into one topic: business, food, science or sports.",
        "Which section does this text belong to? Choose sports, business, science or food.",
    ]
    items = []
    for i in range(1500):
        label = labels[i % len(labels)]
        t1, t2 = rng.sample(teams, 2)
        text = rng.choice(templates[label]).format(
            t1=t1,
            t2=t2,
            g1=rng.randint(1, 5),
            g2=rng.randint(0, 4),
            day=rng.choice(days),
            firm=rng.choice(firms),
            n=rng.randint(2, 9),
            place=rng.choice(places),
            animal=rng.choice(["frog", "beetle", "orchid", "moss", "spider"]),
            disease=rng.choice(["measles", "malaria", "flu", "cholera"]),
            town=rng.choice(["Tucson", "Leeds", "Lyon", "Perth"]),
            ingredient=rng.choice(["tomatoes", "mushrooms", "lentils", "potatoes", "beans"]),
            dish=rng.choice(["pie", "stew", "tart", "omelette", "risotto", "salad"]),
        )
        text = text[0].upper() + text[1:]
        items.append(_labelled(f"Text: {text}", labels, label, rng.choice(instructions)))
    return items


def _arithmetic(rng: random.Random) -> list[dict[str, Any]]:
    items = []
    for _ in range(1500):
        op = rng.choice("+-x")
        if op == "x":
            a, b = rng.randint(2, 9), rng.randint(2, 9)
            value = a * b
            q = rng.choice(
                [f"What is {a} times {b}?", f"How much is {a} x {b}?", f"Multiply {a} by {b}."]
            )
        elif op == "+":
            a, b = rng.randint(2, 49), rng.randint(2, 49)
            value = a + b
            q = rng.choice(
                [
                    f"What is {a} plus {b}?",
                    f"What is the sum of {a} and {b}?",
                    f"Tom has {a} marbles and finds {b} more. How many does he have now?",
                ]
            )
        else:
            a, b = rng.randint(10, 60), rng.randint(1, 9)
            value = a - b
            q = rng.choice(
                [
                    f"What is {a} minus {b}?",
                    f"Subtract {b} from {a}.",
                    f"A shelf holds {a} books and {b} are taken away. How many are left?",
                ]
            )
        wrong = set()
        while len(wrong) < 3:
            w = value + rng.choice([-10, -2, -1, 1, 2, 10])
            if w >= 0 and w != value:
                wrong.add(w)
        options = [value, *sorted(wrong)]
        rng.shuffle(options)
        items.append(
            {
                "question": q,
                "options": [str(o) for o in options],
                "answer": options.index(value),
            }
        )
    return items


def _compare(rng: random.Random) -> list[dict[str, Any]]:
    # Objects in increasing size: a bigger index means a bigger thing.
    sizes = ["an ant", "a coin", "a mouse", "a cat", "a horse", "a car", "an elephant"]
    sizes += ["a house", "a mountain", "the Moon", "the Sun"]
    instructions = [
        "Answer the question with yes or no.",
        "Reply yes or no.",
        "Is the statement in the question true? Answer yes or no.",
    ]
    items = []
    for i in range(1500):
        want_yes = i % 2 == 0
        if rng.random() < 0.5:
            a, b = rng.sample(range(1, 100), 2)
            word = rng.choice(["greater", "larger", "bigger", "smaller", "less"])
            truth = a > b if word in ("greater", "larger", "bigger") else a < b
            if truth != want_yes:
                a, b = b, a
            q = rng.choice(
                [f"Is {a} {word} than {b}?", f"Is the number {a} {word} than the number {b}?"]
            )
        else:
            x, y = rng.sample(range(len(sizes)), 2)
            word = rng.choice(["bigger", "larger", "smaller"])
            truth = x > y if word != "smaller" else x < y
            if truth != want_yes:
                x, y = y, x
            q = f"Is {sizes[x]} {word} than {sizes[y]}?"
        label = "yes" if want_yes else "no"
        items.append(_labelled(f"Question: {q}", ["yes", "no"], label, rng.choice(instructions)))
    return items


ANIMALS = {
    "mammal": "dog cat horse cow sheep goat pig lion tiger bear wolf fox rabbit mouse rat "
    "elephant giraffe zebra camel deer whale dolphin bat monkey gorilla kangaroo koala "
    "squirrel otter hedgehog",
    "bird": "eagle sparrow robin crow pigeon parrot owl penguin ostrich flamingo swan duck "
    "goose chicken turkey peacock hawk falcon pelican seagull woodpecker hummingbird "
    "canary crane heron stork vulture magpie finch",
    "fish": "salmon trout tuna cod shark goldfish carp herring sardine mackerel pike perch "
    "catfish halibut anchovy swordfish barracuda bass eel flounder haddock tilapia "
    "piranha minnow guppy stingray marlin sturgeon grouper",
    "insect": "ant bee wasp butterfly moth beetle ladybug fly mosquito grasshopper cricket "
    "dragonfly termite cockroach flea louse firefly cicada hornet aphid mantis "
    "weevil earwig gnat midge silverfish caterpillar bumblebee locust",
    "reptile": "snake lizard crocodile alligator turtle tortoise iguana gecko chameleon "
    "cobra python viper rattlesnake anaconda boa skink tuatara "
    "caiman gharial adder mamba terrapin copperhead sidewinder",
}


ANIMAL_INSTRUCTION = "Name the animal's class: mammal, bird, fish, insect or reptile."


def _animals(rng: random.Random) -> list[dict[str, Any]]:
    templates = [
        "What kind of animal is the {a}?",
        "Which group of animals does the {a} belong to?",
        "Biologists classify the {a} as which kind of animal?",
        "A {a} is an example of which kind of animal?",
    ]
    labels = sorted(ANIMALS)
    items = []
    for label in labels:
        for animal in ANIMALS[label].split():
            for t in rng.sample(templates, 3):
                text = f"Animal: {animal}. {t.format(a=animal)}"
                items.append(_labelled(text, labels, label, ANIMAL_INSTRUCTION))
    rng.shuffle(items)
    return items


GENERATORS = {
    "sentiment": _sentiment,
    "topic": _topic,
    "arithmetic": _arithmetic,
    "compare": _compare,
    "animals": _animals,
}


def _dedupe(items: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """Up to ``n`` distinct items (same text or question twice could sit in two splits),
    taken round-robin over the answers so the labels stay balanced."""
    seen, groups = set(), {}
    for x in items:
        key = x.get("text") or x.get("question")
        if key not in seen:
            seen.add(key)
            groups.setdefault(str(x.get("label", x.get("answer"))), []).append(x)
    out, queues = [], [list(reversed(g)) for _, g in sorted(groups.items())]
    while len(out) < n and any(queues):
        for q in queues:
            if q and len(out) < n:
                out.append(q.pop())
    return out


SIZES = {"sentiment": 600, "topic": 600, "arithmetic": 500, "compare": 600, "animals": 600}


def write_bundled(folder: str | os.PathLike) -> list[Path]:
    """(Re)generate the bundled task files into ``folder`` (deterministic)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i, (name, gen) in enumerate(sorted(GENERATORS.items())):
        items = _dedupe(gen(random.Random(1000 + i)), SIZES[name])
        random.Random(i).shuffle(items)
        path = folder / f"{name}.jsonl"
        path.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in items))
        out.append(path)
    return out


if __name__ == "__main__":
    import sys

    target = sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).parents[1] / "data" / "tasks")
    for p in write_bundled(target):
        print(p)
