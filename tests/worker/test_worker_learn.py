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
