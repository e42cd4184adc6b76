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
