"""Let packages that look up their native libraries by RECORD find them inside a PEX venv.

tvm_ffi (through which xgrammar, vLLM's structured-output backend, loads
`libxgrammar_bindings.so`) finds a package's library by reading the RECORD file of its
installed distribution. A PEX venv's RECORD files list only the `.dist-info` files, so that lookup
fails and tvm_ffi falls back to the directories on LD_LIBRARY_PATH. Adding each such package's
own directory there, before Ray and vLLM start (their processes inherit the environment), makes
the fallback find the library that is already there. Outside a PEX this changes nothing that
matters: the RECORD lookup succeeds first.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import MutableMapping
from pathlib import Path

# package -> the library tvm_ffi looks for in it
TVM_FFI_LIBRARIES = {"xgrammar": "libxgrammar_bindings.so"}


def expose_native_libraries(env: MutableMapping[str, str] | None = None) -> list[str]:
    """Prepend the directories holding TVM_FFI_LIBRARIES to LD_LIBRARY_PATH; returns those added."""
    env = os.environ if env is None else env
    current = [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    added: list[str] = []
    for package, library in TVM_FFI_LIBRARIES.items():
        try:
            spec = importlib.util.find_spec(package)  # locates the package without importing it
        except (ImportError, ValueError):
            continue
        for directory in (spec.submodule_search_locations or []) if spec else []:
            if (Path(directory) / library).is_file() and directory not in current + added:
                added.append(directory)
    if added:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(added + current)
    return added
