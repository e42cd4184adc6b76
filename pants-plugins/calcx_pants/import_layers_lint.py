"""`./pants lint`'s `import-layers` linter: calcx's imports against docs/architecture.md's table.

A files linter (as Pants' own regex-lint): whenever lint covers a file of src/python/calcx or the
table, it reads the whole tree and the table (a layer rule needs both) and reports the wrong
imports of the files linted, and the table's rows out of layer order when the table is linted.
The check itself is import_layers.py (standard library).
"""

from __future__ import annotations

from pants.core.goals.lint import LintFilesRequest, LintResult, Partitions
from pants.engine.fs import DigestContents, PathGlobs
from pants.engine.rules import Get, collect_rules, rule
from pants.option.option_types import SkipOption
from pants.option.subsystem import Subsystem

from calcx_pants import import_layers


class ImportLayers(Subsystem):
    options_scope = "import-layers"
    name = "import-layers"
    help = (
        "Checks every import of src/python/calcx against the 'may import' column of "
        "docs/architecture.md's package table (calcx_pants/import_layers.py)."
    )

    skip = SkipOption("lint")


class ImportLayersRequest(LintFilesRequest):
    tool_subsystem = ImportLayers


def _checked(path: str) -> bool:
    return path == import_layers.DOC or (path.startswith(import_layers.SOURCES + "/") and path.endswith(".py"))


@rule
async def partition_import_layers(request: ImportLayersRequest.PartitionRequest, subsystem: ImportLayers) -> Partitions:
    if subsystem.skip:
        return Partitions()
    return Partitions.single_partition(sorted(path for path in request.files if _checked(path)))


@rule(desc="Check calcx's import layers")
async def lint_import_layers(request: ImportLayersRequest.Batch) -> LintResult:
    # The rule needs the whole tree and the table; it reports on the files of this batch (all of
    # them when the table itself is linted).
    contents = await Get(DigestContents, PathGlobs([import_layers.DOC, f"{import_layers.SOURCES}/**/*.py"]))
    texts = {item.path: item.content.decode("utf-8") for item in contents}
    doc = texts.pop(import_layers.DOC)
    found = import_layers.check(doc, texts)
    if import_layers.DOC not in request.elements:
        batch = set(request.elements)
        found = [line for line in found if line.split(":", 1)[0] in batch]
    return LintResult(1 if found else 0, import_layers.report(found), "", ImportLayers.options_scope)


def rules():
    return [*collect_rules(), *ImportLayersRequest.rules()]
