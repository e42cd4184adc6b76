"""calcx's import layers, enforced: every import of src/python/calcx against the "may import"
column of docs/architecture.md's package table (the one copy of that rule).

A package may import the calcx packages its row names in backticks (`everything above`: those of
the earlier rows; `the parts`: all), its own modules and `calcx` itself. A row may be a
sub-package (`calcx.trainer.rollouts`): a module belongs to the longest row its name begins with,
and so does what it imports. A row's "never a, b" names the outside packages it must not import
(their top-level names: `never verl, torch, ray`). Imports inside functions and `TYPE_CHECKING`
blocks count: they are dependencies all the same. The rows are the layers in order: a row that
may import a later row (by name, or `the parts` before the last row) fails too, since the later
row may import it back and the table would allow a package loop.

`./pants lint ::` runs it (the `import-layers` linter of this plugin, register.py); standard
library only and Python 3.9 (Pants' own interpreter), so it also runs on its own:

    python3 pants-plugins/calcx_pants/import_layers.py [REPO_ROOT]   # exit 1, one line per problem
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path, PurePosixPath

DOC = "docs/architecture.md"
SOURCES = "src/python/calcx"
TABLE_HEADING = "## Python packages"
_PACKAGE = re.compile(r"`(calcx(?:\.\w+)*)`")
_NEVER = re.compile(r"\bnever ([\w.]+(?:,\s*[\w.]+)*)")


def read_rows(doc: str) -> list[tuple[int, str, str]]:
    """(line number in the doc, package, its "may import" cell) of each row of the table under
    TABLE_HEADING, in the table's order."""
    start = doc.index(TABLE_HEADING)
    first = doc.count("\n", 0, start) + 1
    rows: list[tuple[int, str, str]] = []
    for number, line in enumerate(doc[start:].splitlines(), first):
        if line.startswith("| `calcx"):
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            if _PACKAGE.fullmatch(cells[0]):
                rows.append((number, cells[0].strip("`"), cells[-1]))
    return rows


def read_rules(doc: str) -> dict[str, frozenset[str]]:
    """package -> the calcx packages it may import, from the table under TABLE_HEADING."""
    rows = read_rows(doc)
    names = [name for _, name, _ in rows]
    rules: dict[str, frozenset[str]] = {}
    for index, (_, name, may_import) in enumerate(rows):
        allowed = set(_PACKAGE.findall(may_import))
        if "everything above" in may_import:
            allowed.update(names[:index])
        if "the parts" in may_import:
            allowed.update(names)
        rules[name] = frozenset(allowed - {name})
    return rules


def read_forbidden(doc: str) -> dict[str, frozenset[str]]:
    """package -> the outside packages (top-level names) its row says it must never import."""
    forbidden: dict[str, frozenset[str]] = {}
    for _, name, may_import in read_rows(doc):
        found = {part.strip() for match in _NEVER.findall(may_import) for part in match.split(",")}
        forbidden[name] = frozenset(found)
    return forbidden


def forward_references(doc: str) -> list[str]:
    """One line per row that may import a later row: the table's order is its layering, and a
    row that reaches down the table lets a package loop through (`everything above` never does)."""
    rows = read_rows(doc)
    found: list[str] = []
    for index, (line, name, may_import) in enumerate(rows):
        later = {later_name: later_line for later_line, later_name, _ in rows[index + 1 :]}
        for target in _PACKAGE.findall(may_import):
            if target in later:
                found.append(
                    f"{DOC}:{line}: row {name} may import {target}, whose row (line {later[target]}) "
                    f"is below it: a row may name only packages of the rows above it"
                )
        if "the parts" in may_import and later:
            found.append(
                f"{DOC}:{line}: row {name} may import `the parts`, which reaches the rows below it "
                f"({', '.join(later)}): only the last row may"
            )
    return found


def row_of(module: str, rows: Iterable[str]) -> str:
    """The longest row `module` is or lies in; else calcx.<its first part> (a package without a
    row), or `calcx` itself."""
    parts = module.split(".")
    names = set(rows)
    for end in range(len(parts), 1, -1):
        if ".".join(parts[:end]) in names:
            return ".".join(parts[:end])
    return ".".join(parts[:2])


def package_of(relative: PurePosixPath, rows: Iterable[str] = ()) -> str:
    """The row of a path below src/python/calcx (calcx.cli for cli.py, calcx.trainer.run for
    trainer/run/launch.py where that row exists, else calcx.trainer)."""
    parts = list(relative.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return row_of(".".join(["calcx", *parts]), rows) if parts else "calcx"


def imported_modules(relative: PurePosixPath, text: str, rows: Iterable[str] = ()) -> Iterator[tuple[int, str]]:
    """(line, absolute module) of every calcx import in the file, relative ones resolved (`from
    calcx.trainer import run` is calcx.trainer.run where that is a row)."""
    yield from ((line, m) for line, m in all_imports(relative, text, rows) if m == "calcx" or m.startswith("calcx."))


def all_imports(relative: PurePosixPath, text: str, rows: Iterable[str] = ()) -> Iterator[tuple[int, str]]:
    """(line, absolute module) of every import in the file, relative ones resolved."""
    names = set(rows)
    here = ("calcx", *relative.with_suffix("").parts)
    package = here if here[-1] == "__init__" else here[:-1]
    for node in ast.walk(ast.parse(text, str(relative))):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            if base and base[-1] == "__init__":
                base.pop()
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            modules = [f"{module}.{a.name}" if f"{module}.{a.name}" in names else module for a in node.names]
        else:
            continue
        yield from ((node.lineno, m) for m in modules)


def check(doc: str, sources: Mapping[str, str]) -> list[str]:
    """One line per row that may import a later row, per import the table does not allow, and per
    package without a row. `sources`: path from the repository root (src/python/calcx/...) -> the
    file's text."""
    rules = read_rules(doc)
    forbidden = read_forbidden(doc)
    found = forward_references(doc)
    for path in sorted(sources):
        relative = PurePosixPath(path).relative_to(SOURCES)
        source = package_of(relative, rules)
        if source == "calcx":
            continue
        if source not in rules:
            found.append(f"{path}: package {source} has no row in {DOC}'s table")
            continue
        for line, module in all_imports(relative, sources[path], rules):
            if module != "calcx" and not module.startswith("calcx."):
                if module.split(".")[0] in forbidden[source]:
                    found.append(
                        f"{path}:{line}: {source} imports {module}; {DOC} says it never imports "
                        f"{', '.join(sorted(forbidden[source]))}"
                    )
                continue
            target = row_of(module, rules) if module != "calcx" else "calcx"
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
        f"{len(found)} problem(s) with the layers of {DOC}: fix the import, or change the table first "
        f"(its rows in layer order)\n"
    )


def main(argv: list[str]) -> int:
    repo = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[2]
    found = violations(repo)
    sys.stdout.write(report(found))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
