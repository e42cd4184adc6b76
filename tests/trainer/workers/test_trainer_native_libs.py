"""calcx train puts the directories of packages whose native library tvm_ffi looks up by RECORD on
LD_LIBRARY_PATH (inside a PEX venv RECORD lists no `.so`), and leaves everything else as it was."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from calcx.trainer.workers.native_libs import expose_native_libraries


@pytest.fixture
def fake_xgrammar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    package = tmp_path / "site" / "xgrammar"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "xgrammar", raising=False)
    return package


def test_adds_the_package_directory_that_holds_the_library(fake_xgrammar: Path) -> None:
    (fake_xgrammar / "libxgrammar_bindings.so").write_bytes(b"\x7fELF")
    env = {"LD_LIBRARY_PATH": "/usr/local/nvidia/lib64"}
    assert expose_native_libraries(env) == [str(fake_xgrammar)]
    assert env["LD_LIBRARY_PATH"] == f"{fake_xgrammar}:/usr/local/nvidia/lib64"
    assert "xgrammar" not in sys.modules  # located, never imported
    assert expose_native_libraries(env) == []  # a second call adds nothing twice
    assert env["LD_LIBRARY_PATH"].count(str(fake_xgrammar)) == 1


def test_leaves_the_environment_alone_without_the_library(fake_xgrammar: Path) -> None:
    env: dict[str, str] = {}
    assert expose_native_libraries(env) == []
    assert env == {}
