"""Totals of a test run from its JUnit reports, and a check that the skipped tests are exactly
the ones .ci/expected-skips.txt names: a skip counted as coverage is a defect, so CI fails when a
test starts skipping (or an expected skip starts running) until that file says why.

Usage: python3 .ci/skips.py REPORT_DIR EXPECTED_FILE   (exit 1 on a mismatch)
"""

from __future__ import annotations

import glob
import os
import sys
import xml.etree.ElementTree as ET


def expected_skips(path: str, env: dict[str, str]) -> dict[str, str]:
    """`module::test` -> reason, for the lines whose condition holds in `env`."""
    out: dict[str, str] = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            test_id, reason, condition = (part.strip() for part in (line.split("|") + ["", ""])[:3])
            if condition.startswith("unless=") and env.get(condition[len("unless=") :]):
                continue
            out[test_id] = reason
    return out


def read_reports(report_dir: str) -> tuple[int, int, list[str]]:
    """(tests, failed, ids of the skipped tests) over every JUnit file under `report_dir`."""
    tests = failed = 0
    skipped: list[str] = []
    for path in glob.glob(os.path.join(report_dir, "**", "*.xml"), recursive=True):
        for case in ET.parse(path).getroot().iter("testcase"):
            tests += 1
            module = (case.get("classname") or "").split(".")[-1]
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
            elif case.find("skipped") is not None:
                skipped.append(f"{module}::{case.get('name')}")
    return tests, failed, skipped


def main(argv: list[str]) -> int:
    report_dir, expected_file = argv
    tests, failed, skipped = read_reports(report_dir)
    expected = expected_skips(expected_file, dict(os.environ))
    print(
        f"{tests - failed - len(skipped)} passed, {failed} failed, {len(skipped)} skipped "
        f"({len(expected)} expected)"
    )
    unexpected = sorted(set(skipped) - set(expected))
    missing = sorted(set(expected) - set(skipped))
    for test_id in unexpected:
        print(f"skipped but not named in {expected_file}: {test_id}")
    for test_id in missing:
        print(f"named in {expected_file} but not skipped: {test_id} ({expected[test_id]})")
    return 1 if unexpected or missing or len(skipped) != len(expected) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
