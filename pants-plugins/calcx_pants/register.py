"""calcx's Pants plugin: `slim_pex_binary`, a PEX that leaves named requirements out,
`image_archive` (image_archive.py: a container image's docker-archive as a package), and the
`import-layers` linter (`./pants lint`, import_layers_lint.py), which holds calcx's imports to
docs/architecture.md.

A GPU machine ships its own CUDA torch (several GB with the NVIDIA libraries). Pants 2.17's
`pex_binary` has no field for pex's `--exclude`, so the trainer PEX carried to such a machine
would hold a second, larger copy. `slim_pex_binary` builds the same PEX from the same lockfile
through Pants' own PEX machinery and adds `--exclude REQ` for each entry of `excludes`: pex drops
that distribution and the dependencies nothing else needs, and the PEX boots without checking
for them. At run time they come from the host Python (e.g. `PEX_EXTRA_SYS_PATH`, which a
venv-mode PEX appends after its own packages and hands on to its subprocesses).
"""

from __future__ import annotations

from dataclasses import dataclass

from pants.backend.python.target_types import (
    EntryPoint,
    PexArgsField,
    PexBinary,
    PexEntryPointField,
    PexEnvField,
    PexExecutionMode,
    PexExecutionModeField,
    PexIncludeToolsField,
    PexInheritPathField,
    PexLayout,
    PexLayoutField,
    PexScriptField,
    PexStripEnvField,
)
from pants.backend.python.util_rules.pex import Pex
from pants.backend.python.util_rules.pex_from_targets import PexFromTargetsRequest
from pants.core.goals.package import BuiltPackage, BuiltPackageArtifact, OutputPathField, PackageFieldSet
from pants.engine.rules import Get, collect_rules, rule
from pants.engine.target import StringField, StringSequenceField, Target
from pants.engine.unions import UnionRule

from calcx_pants import image_archive, import_layers_lint
from calcx_pants.pex_args import slim_pex_args


class SlimPexEntryPointField(StringField):
    alias = "entry_point"
    required = True
    help = "The module (and optional function) the PEX runs, e.g. `calcx.cli:main`."


class SlimPexExcludesField(StringSequenceField):
    alias = "excludes"
    required = True
    help = (
        "Requirements left out of the PEX (pex `--exclude`), with the dependencies only they need; "
        "the machine that runs the PEX provides them."
    )


#: `pex_binary` fields a slim PEX has not: its entry point is a plain string (no file-based
#: inference), and it runs no console script and bakes in no arguments or environment. Every
#: other field is `pex_binary`'s own, read from its public target type.
_NOT_SLIM = (PexEntryPointField, PexScriptField, PexArgsField, PexEnvField)


class SlimPexBinary(Target):
    alias = "slim_pex_binary"
    core_fields = (
        *(field for field in PexBinary.core_fields if field not in _NOT_SLIM),
        SlimPexEntryPointField,
        SlimPexExcludesField,
    )
    help = (
        "A `pex_binary` built from its resolve's lockfile with some requirements left out "
        "(pex --exclude), for a machine that already has them (a GPU image's CUDA torch)."
    )


@dataclass(frozen=True)
class SlimPexBinaryFieldSet(PackageFieldSet):
    required_fields = (SlimPexEntryPointField, SlimPexExcludesField)

    entry_point: SlimPexEntryPointField
    excludes: SlimPexExcludesField
    output_path: OutputPathField
    layout: PexLayoutField
    execution_mode: PexExecutionModeField
    inherit_path: PexInheritPathField
    include_tools: PexIncludeToolsField
    strip_env: PexStripEnvField

    def pex_args(self) -> tuple[str, ...]:
        return slim_pex_args(
            excludes=self.excludes.value or (),
            inherit_path=self.inherit_path.value,
            venv=PexExecutionMode(self.execution_mode.value) is PexExecutionMode.VENV,
            include_tools=bool(self.include_tools.value),
            strip_env=self.strip_env.value,
        )


@rule(desc="Build a slim PEX")
async def package_slim_pex_binary(field_set: SlimPexBinaryFieldSet) -> BuiltPackage:
    output_filename = field_set.output_path.value_or_default(file_ending="pex")
    pex = await Get(
        Pex,
        PexFromTargetsRequest(
            addresses=[field_set.address],
            internal_only=False,
            main=EntryPoint.parse(field_set.entry_point.value or "", provenance=f"for {field_set.address}"),
            output_filename=output_filename,
            layout=PexLayout(field_set.layout.value),
            additional_args=field_set.pex_args(),
            include_local_dists=True,
            warn_for_transitive_files_targets=True,
        ),
    )
    return BuiltPackage(pex.digest, (BuiltPackageArtifact(output_filename),))


def target_types():
    return [SlimPexBinary, *image_archive.target_types()]


def rules():
    return [
        *collect_rules(),
        UnionRule(PackageFieldSet, SlimPexBinaryFieldSet),
        *import_layers_lint.rules(),
        *image_archive.rules(),
    ]
