"""A seeded generator of Calc-X-style arithmetic word problems.

Each template plays one Calc-X source (gsm8k, ape210k, mawps, svamp, aqua_rat)
and produces a question, a chain of calculator steps in Calc-X's gadget markup
and the result. Arithmetic is exact (fractions); numbers that do not terminate
are written like Calc-X does, ``2/3 = around 0.666667``. The same seed always
gives the same rows, on any machine (``random.Random`` with a string seed).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

NAMES = [
    "Ava",
    "Ben",
    "Chen",
    "Dara",
    "Eli",
    "Fatima",
    "Gus",
    "Hana",
    "Ivan",
    "Jia",
    "Kofi",
    "Lena",
    "Mateo",
    "Nia",
    "Omar",
    "Priya",
    "Quinn",
    "Rosa",
    "Sami",
    "Tomas",
    "Uma",
    "Viktor",
    "Wen",
    "Yara",
    "Zane",
]
ITEMS = ["apples", "pencils", "stickers", "marbles", "books", "cookies", "cards", "shells", "stamps", "beads"]
MATERIALS = [
    ("rope", "meters"),
    ("ribbon", "meters"),
    ("flour", "kilograms"),
    ("juice", "liters"),
    ("fabric", "meters"),
    ("rice", "kilograms"),
]


def format_value(value: Fraction) -> str:
    """Calc-X style: ``12``, ``2.5``, or ``2/3 = around 0.666667``."""
    if value.denominator == 1:
        return str(value.numerator)
    denominator = value.denominator
    for prime in (2, 5):
        while denominator % prime == 0:
            denominator //= prime
    if denominator == 1:
        text = f"{float(value):.10f}".rstrip("0").rstrip(".")
        return text
    return f"{value.numerator}/{value.denominator} = around {float(value):.6f}"


def literal(value: Fraction) -> str:
    """How a value is written inside a calculator expression."""
    text = format_value(value)
    if " = around " in text:
        return f"({value.numerator}/{value.denominator})"
    return text if value >= 0 else f"({text})"


@dataclass
class Problem:
    question: str
    steps: list[tuple[str, Fraction]]  # (expression, exact value)
    result: str


class _Chain:
    """Collects calculator steps while a template computes its answer."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, Fraction]] = []

    def calc(self, a: Fraction | int, op: str, b: Fraction | int) -> Fraction:
        a, b = Fraction(a), Fraction(b)
        value = {"+": a + b, "-": a - b, "*": a * b, "/": a / b}[op]
        self.steps.append((f"{literal(a)} {op} {literal(b)}", value))
        return value


def render_chain(problem: Problem) -> str:
    parts = [
        f'<gadget id="calculator">{expr}</gadget>\n<output>{format_value(value)}</output>'
        for expr, value in problem.steps
    ]
    parts.append(f"Final result is <result>{problem.result}</result>")
    return "\n\n".join(parts)


def _gsm8k(rng: random.Random) -> Problem:
    chain = _Chain()
    name = rng.choice(NAMES)
    if rng.random() < 0.5:
        trays, per_tray = rng.randint(2, 12), rng.randint(6, 24)
        total = trays * per_tray
        sold = rng.randint(1, total - 1)
        made = chain.calc(trays, "*", per_tray)
        left = chain.calc(made, "-", sold)
        question = (
            f"{name} bakes {trays} trays of cookies with {per_tray} cookies on each tray. "
            f"{name} sells {sold} cookies at the market. How many cookies are left?"
        )
    else:
        wage, hours, weeks = rng.randint(9, 40), rng.randint(4, 40), rng.randint(2, 12)
        weekly = chain.calc(wage, "*", hours)
        left = chain.calc(weekly, "*", weeks)
        question = (
            f"{name} earns ${wage} an hour and works {hours} hours each week. "
            f"How much money does {name} earn in {weeks} weeks?"
        )
    return Problem(question, chain.steps, format_value(left))


def _ape210k(rng: random.Random) -> Problem:
    chain = _Chain()
    material, unit = rng.choice(MATERIALS)
    total = rng.randint(6, 120)
    q = rng.choice([3, 4, 5, 6, 7, 8, 9, 12])
    p = rng.randint(1, q - 1)
    part = Fraction(p, q)
    rest = chain.calc(1, "-", part)
    left = chain.calc(total, "*", rest)
    question = (
        f"A store has {total} {unit} of {material}. It sells {p}/{q} of it. " f"How many {unit} of {material} are left?"
    )
    return Problem(question, chain.steps, format_value(left))


def _mawps(rng: random.Random) -> Problem:
    chain = _Chain()
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(3, 500), rng.randint(2, 400)
    if rng.random() < 0.5:
        value = chain.calc(a, "+", b)
        question = f"{name} had {a} {item} and got {b} more. How many {item} does {name} have now?"
    else:
        a, b = max(a, b) + 1, min(a, b)
        value = chain.calc(a, "-", b)
        question = f"{name} had {a} {item} and gave away {b}. How many {item} does {name} have left?"
    return Problem(question, chain.steps, format_value(value))


def _svamp(rng: random.Random) -> Problem:
    chain = _Chain()
    groups, each = rng.randint(2, 15), rng.randint(2, 30)
    item = rng.choice(ITEMS)
    total = groups * each
    if rng.random() < 0.5:
        value = chain.calc(total, "/", groups)
        question = f"There are {total} {item} shared equally among {groups} boxes. How many {item} are in each box?"
    else:
        extra = rng.randint(1, 9)
        value = chain.calc(chain.calc(total, "/", groups), "+", extra)
        question = (
            f"{total} {item} are packed equally into {groups} bags, then {extra} more {item} are added "
            f"to one bag. How many {item} are in that bag now?"
        )
    return Problem(question, chain.steps, format_value(value))


def _aqua_rat(rng: random.Random) -> Problem:
    chain = _Chain()
    price, percent = rng.randint(20, 400), rng.choice([5, 10, 15, 20, 25, 30, 40, 50])
    discount = chain.calc(chain.calc(price, "*", percent), "/", 100)
    final = chain.calc(price, "-", discount)
    options = {final}
    while len(options) < 5:
        candidate = final + rng.choice([-3, -2, -1, 1, 2, 3]) * rng.randint(1, 5)
        if candidate > 0:
            options.add(candidate)
    ordered = sorted(options)
    letters = "ABCDE"
    answer = letters[ordered.index(final)]
    shown = " ".join(f"{letter}) {format_value(value)}" for letter, value in zip(letters, ordered))
    question = (
        f"A jacket costs ${price}. It is sold at a {percent}% discount. What is the sale price? "
        f"Answer Choices: {shown}"
    )
    return Problem(question, chain.steps, answer)


TEMPLATES: dict[str, Callable[[random.Random], Problem]] = {
    "gsm8k": _gsm8k,
    "ape210k": _ape210k,
    "mawps": _mawps,
    "svamp": _svamp,
    "aqua_rat": _aqua_rat,
}
WEIGHTS = {"gsm8k": 3, "ape210k": 3, "mawps": 2, "svamp": 2, "aqua_rat": 1}


def generate_split(split: str, count: int, seed: int = 0, seen: set[str] | None = None) -> list[dict[str, str]]:
    """``count`` rows for ``split``; questions already in ``seen`` are skipped (and added)."""
    if count < 0:
        raise ValueError(f"row count must be >= 0, got {count}")
    rng = random.Random(f"calcx-data:{seed}:{split}")
    seen = set() if seen is None else seen
    sources = list(WEIGHTS)
    weights = [WEIGHTS[s] for s in sources]
    rows: list[dict[str, str]] = []
    attempts = 0
    while len(rows) < count:
        attempts += 1
        if attempts > count * 20 + 100:
            raise RuntimeError(f"could not make {count} distinct questions for split {split!r}")
        source = rng.choices(sources, weights)[0]
        problem = TEMPLATES[source](rng)
        if problem.question in seen:
            continue
        seen.add(problem.question)
        rows.append(
            {
                "id": f"{source}-{split}-{len(rows):05d}",
                "question": problem.question,
                "chain": render_chain(problem),
                "result": problem.result,
                "source": source,
            }
        )
    return rows


def generate_dataset(
    seed: int = 0, train_size: int = 2000, test_size: int = 200, mini_size: int = 50
) -> dict[str, list[dict[str, str]]]:
    """train/test with no question in common; test_mini is the head of test."""
    if mini_size > test_size:
        raise ValueError(f"test_mini size ({mini_size}) cannot exceed the test size ({test_size})")
    seen: set[str] = set()
    test = generate_split("test", test_size, seed, seen)
    train = generate_split("train", train_size, seed, seen)
    return {"train": train, "test": test, "test_mini": test[:mini_size]}
