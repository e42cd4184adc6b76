"""calcx's import layers, enforced: every import of src/python/calcx against the "may import"
column of docs/architecture.md's package table (the one copy of that rule).

A package may import the calcx packages its row names in backticks (`everything above`: those of
the earlier rows; `the parts`: all), its own modules and `calcx` itself. Imports inside functions
and `TYPE_CHECKING` blocks count: they are dependencies all the same.

`./pants lint ::` runs it (the `import-layers` linter of this plugin, register.py); standard
library only and Python 3.9 (Pants' own interpreter), so it also runs on its own:

    python3 pants-plugins/calcx_pants/import_layers.py [REPO_ROOT]   # exit 1, one line per wrong import
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath

DOC = "docs/architecture.md"
SOURCES = "src/python/calcx"
TABLE_HEADING = "## Python packages"
_PACKAGE = re.compile(r"`(calcx(?:\.\w+)?)`")


def read_rules(doc: str) -> dict[str, frozenset[str]]:
    """package -> the calcx packages it may import, from the table under TABLE_HEADING."""
    section = doc[doc.index(TABLE_HEADING):]
    rows = [line for line in section.splitlines() if line.startswith("| `calcx")]
    cells = [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]
    cells = [row for row in cells if _PACKAGE.fullmatch(row[0])]
    names = [row[0].strip("`") for row in cells]
    rules: dict[str, frozenset[str]] = {}
    for index, (name, row) in enumerate(zip(names, cells)):
        allowed = set(_PACKAGE.findall(row[-1]))
        if "everything above" in row[-1]:
            allowed.update(names[:index])
        if "the parts" in row[-1]:
            allowed.update(names)
        rules[name] = frozenset(allowed - {name})
    return rules


def package_of(relative: PurePosixPath) -> str:
    """calcx.<first part> of a path below src/python/calcx (calcx.cli for cli.py)."""
    first = relative.parts[0]
    if first == "__init__.py":
        return "calcx"
    return "calcx." + (first[: -len(".py")] if first.endswith(".py") else first)


def imported_modules(relative: PurePosixPath, text: str) -> Iterator[tuple[int, str]]:
    """(line, absolute module) of every calcx import in the file, relative ones resolved."""
    here = ("calcx", *relative.with_suffix("").parts)
    package = here if here[-1] == "__init__" else here[:-1]
    for node in ast.walk(ast.parse(text, str(relative))):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            if base and base[-1] == "__init__":
                base.pop()
            modules = [".".join([*base, *(node.module.split(".") if node.module else [])])]
        else:
            continue
        yield from ((node.lineno, m) for m in modules if m == "calcx" or m.startswith("calcx."))


def check(doc: str, sources: Mapping[str, str]) -> list[str]:
    """One line per import the table does not allow, and per package without a row.
    `sources`: path from the repository root (src/python/calcx/...) -> the file's text."""
    rules = read_rules(doc)
    found: list[str] = []
    for path in sorted(sources):
        relative = PurePosixPath(path).relative_to(SOURCES)
        source = package_of(relative)
        if source == "calcx":
            continue
        if source not in rules:
            found.append(f"{path}: package {source} has no row in {DOC}'s table")
            continue
        for line, module in imported_modules(relative, sources[path]):
            target = ".".join(module.split(".")[:2])
            if target in ("calcx", source) or target in rules[source]:
                continue
            allowed = ", ".join(sorted(rules[source])) or "no calcx package"
            found.append(f"{path}:{line}: {source} imports {module}; {DOC} lets it import {allowed}")
    return found


def violations(repo: Path) -> list[str]:
    """`check` of a checkout on disk."""
    sources = {p.relative_to(repo).as_posix(): p.read_text(encoding="utf-8") for p in (repo / SOURCES).rglob("*.py")}
    return check((repo / DOC).read_text(encoding="utf-8"), sources)


def report(found: list[str]) -> str:
    if not found:
        return f"imports of {SOURCES} follow {DOC}'s layers\n"
    return "".join(f"{line}\n" for line in found) + (
        f"{len(found)} import(s) against the layers of {DOC}: fix the import, or change the table first\n")


def main(argv: list[str]) -> int:
    repo = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[2]
    found = violations(repo)
    sys.stdout.write(report(found))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
