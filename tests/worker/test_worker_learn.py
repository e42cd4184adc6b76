"""The worker's `learn` request (a finished agent's lazily imported modules, loaded so that later
forks find them) imports only submodules of packages the worker had loaded before it served: a
module an agent wrote onto the import path is never imported into the worker every agent forks from."""

from __future__ import annotations

import sys
import xml  # noqa: F401  (a package loaded before the worker below is made, as its preload's are)
from pathlib import Path

from calcx.worker.serve import ZygoteServer


def test_learn_imports_submodules_of_loaded_packages_and_nothing_new(tmp_path: Path, monkeypatch) -> None:
    canary = tmp_path / "ran"
    (tmp_path / "planted_by_an_agent.py").write_text(f"open({str(canary)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("planted_by_an_agent", "xml.dom.minidom"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    server = ZygoteServer(str(tmp_path / "worker.sock"), agent_entry=None, calc_module=None, control_fd=None)
    server._learn(["planted_by_an_agent", "xml.dom.minidom", "xml..dom", "xml.dom.minidom; import os"])
    assert "xml.dom.minidom" in sys.modules  # below a package the worker had: learned
    assert "planted_by_an_agent" not in sys.modules and not canary.exists()


def test_learn_never_runs_a_packages_main_module(tmp_path: Path, monkeypatch) -> None:
    # a package's __main__ is its script, run at import: mcp_server_calculator's serves MCP on the
    # worker's own stdin, and the worker would fork no agent again
    canary = tmp_path / "ran"
    package = tmp_path / "scripted_package"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(f"open({str(canary)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("scripted_package", "scripted_package.__main__"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    __import__("scripted_package")  # loaded before the worker serves, like its preload
    server = ZygoteServer(str(tmp_path / "worker.sock"), agent_entry=None, calc_module=None, control_fd=None)
    server._learn(["scripted_package.__main__"])
    assert "scripted_package.__main__" not in sys.modules and not canary.exists()
