"""`image_archive`: `./pants package` writes the docker-archive file its dependency makes.

Pants 2.17 packages an `adhoc_tool`'s outputs only inside an `archive` (a tar of files), and a
docker-archive inside a tar is not something `docker load -i` reads. The image is made by an
`adhoc_tool` over calcx.image (src/docker/BUILD); this target hands that tool's one `.tar`
output to `package` as it is, at the path the tool wrote it (under dist/).
"""

from __future__ import annotations

from dataclasses import dataclass

from pants.core.goals.package import BuiltPackage, BuiltPackageArtifact, PackageFieldSet
from pants.core.target_types import FileSourceField
from pants.engine.fs import MergeDigests, Snapshot
from pants.engine.rules import Get, MultiGet, collect_rules, rule
from pants.engine.target import (
    COMMON_TARGET_FIELDS,
    Dependencies,
    DependenciesRequest,
    HydratedSources,
    HydrateSourcesRequest,
    SourcesField,
    Target,
    Targets,
)
from pants.engine.unions import UnionRule


class ImageArchiveDependenciesField(Dependencies):
    help = "The target that writes the docker-archive (an `adhoc_tool` with one `.tar` output)."


class ImageArchive(Target):
    alias = "image_archive"
    core_fields = (*COMMON_TARGET_FIELDS, ImageArchiveDependenciesField)
    help = "A container image as a docker-archive file (`docker load -i`), written by its dependency."


@dataclass(frozen=True)
class ImageArchiveFieldSet(PackageFieldSet):
    required_fields = (ImageArchiveDependenciesField,)

    dependencies: ImageArchiveDependenciesField


@rule(desc="Package a docker-archive")
async def package_image_archive(field_set: ImageArchiveFieldSet) -> BuiltPackage:
    targets = await Get(Targets, DependenciesRequest(field_set.dependencies))
    hydrated = await MultiGet(
        Get(
            HydratedSources,
            HydrateSourcesRequest(tgt[SourcesField], for_sources_types=(FileSourceField,), enable_codegen=True),
        )
        for tgt in targets
        if tgt.has_field(SourcesField)
    )
    snapshot = await Get(Snapshot, MergeDigests(sources.snapshot.digest for sources in hydrated))
    archives = [path for path in snapshot.files if path.endswith(".tar")]
    if len(archives) != 1:
        raise ValueError(
            f"{field_set.address}: its dependencies write {len(archives)} .tar files "
            f"({', '.join(archives) or 'none'}); an image_archive needs exactly one"
        )
    return BuiltPackage(snapshot.digest, (BuiltPackageArtifact(archives[0]),))


def target_types():
    return [ImageArchive]


def rules():
    return [*collect_rules(), UnionRule(PackageFieldSet, ImageArchiveFieldSet)]
