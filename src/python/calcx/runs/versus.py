"""Two validations of the same problems, paired problem by problem: the accuracy of each with its
standard error, and the change from one to the other with the paired standard error (the mean and
standard error of the per-problem differences, over the problems both hold).

Pairing is what makes two recipes' validations, or one run's validation against its previous one,
comparable at the sizes a GPU run validates on: most of the spread between problems cancels.
An outcome set maps a problem (its Calc-X row id) to its reward.
"""

from __future__ import annotations

from collections.abc import Mapping

from calcx.common.stats import mean_and_standard_error

Outcomes = Mapping[str, float]


def accuracy_cell(outcomes: Outcomes) -> str:
    """The accuracy with its standard error, as `0.520 (0.035)`."""
    mean, se = mean_and_standard_error(outcomes.values())
    return f"{mean:.3f} ({se:.3f})"


def paired_change(before: Outcomes, after: Outcomes) -> tuple[int, int, int, str]:
    """Over the problems both hold: how many, how many `after` scored higher, lower, and the change
    of accuracy with its paired standard error (`-` when they share no problem)."""
    shared = sorted(before.keys() & after.keys())
    diffs = [after[row] - before[row] for row in shared]
    if not diffs:
        return 0, 0, 0, "-"
    mean, se = mean_and_standard_error(diffs)
    return len(shared), sum(d > 0 for d in diffs), sum(d < 0 for d in diffs), f"{mean:+.3f} ({se:.3f})"


def versus_table(mine: Mapping[int, Outcomes], other: Mapping[int, Outcomes]) -> str:
    """At each step both runs validated: both accuracies and this run's change against the other's."""
    lines = [
        "| step | problems in both | this run (SE) | other run (SE) | better here | "
        "worse here | difference (paired SE) |",
        "|" + "---:|" * 7,
    ]
    for step in sorted(mine.keys() & other.keys()):
        shared, better, worse, change = paired_change(other[step], mine[step])
        lines.append(
            f"| {step} | {shared} | {accuracy_cell(mine[step])} | {accuracy_cell(other[step])} | "
            f"{better} | {worse} | {change} |"
        )
    return "\n".join(lines)
