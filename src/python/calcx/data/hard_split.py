"""What names a hard-arithmetic split and the range its factors are drawn from (calcx.data.hard):
apart from the rewriting, so that `calcx data`'s parser reads them without loading the calculator."""

from __future__ import annotations

import re

HARD_SOURCE = "gsm8k-hard"
FACTOR_RANGE = (101, 999)
# a split's source is gsm8k-<tag> and its ids <GSM8K id>-<tag>: a tag without a hyphen keeps two
# splits' ids apart, whatever the GSM8K ids are
_SOURCE_RE = re.compile(r"gsm8k-([a-z0-9_]+)")


def id_suffix(source: str) -> str:
    """The id suffix of a split's rows, from its source: `-hard` for gsm8k-hard, `-<tag>` for gsm8k-<tag>;
    ValueError for a source of another form."""
    match = _SOURCE_RE.fullmatch(source)
    if match is None:
        raise ValueError("must be gsm8k-<tag>, the tag of lowercase letters, digits and underscores (gsm8k-harder)")
    return f"-{match.group(1)}"


def check_factor_range(low: int, high: int) -> None:
    """ValueError unless each of `factors`' three kinds can be drawn from [low, high]."""
    if low < 2:
        raise ValueError("LOW must be at least 2: a factor of 1 leaves the numbers as they are")
    if high < low:
        raise ValueError("HIGH must be at least LOW")
    if -(-low // 100) > high // 100:
        raise ValueError("the range must hold a multiple of 100 (a factor that keeps percentages whole)")


def split_problem(factor_range: tuple[int, int], source: str) -> str | None:
    """What makes `--factor-range` and `--source` unable to name a split, as the flag's message, or
    None: a range `factors` cannot draw from, a source of another form, or a range of its own under
    the default split's source (its ids and source would be the default split's)."""
    low, high = factor_range
    try:
        check_factor_range(low, high)
    except ValueError as exc:
        return f"--factor-range {low} {high}: {exc}"
    try:
        id_suffix(source)
    except ValueError as exc:
        return f"--source {source}: {exc}"
    if (low, high) != FACTOR_RANGE and source == HARD_SOURCE:
        return (
            f"--factor-range {low} {high} needs a --source of its own (gsm8k-<tag>): "
            f"{HARD_SOURCE} names the split of the default range {FACTOR_RANGE[0]} {FACTOR_RANGE[1]}"
        )
    return None
