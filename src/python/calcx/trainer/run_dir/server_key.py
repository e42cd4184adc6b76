"""The server key on the trainer's side: never in the composed config, which verl prints and
sends to its trackers (wandb, mlflow). `calcx train` writes the key to an owner-only file and
names that file in the config (`calcx.key_file`); the driver and the Ray workers read it there.
The file lives in the run's own report directory (`calcx.trainer.run_dir.names.KEY_DIR`, mode 0700), not in /tmp: a run
killed before its cleanup leaves it there, owner-only, where the next start of the run replaces it.
On a Ray cluster the driver's file is on its node alone: the config says `calcx.key_from_env`
instead, and each worker reads CALCX_KEY from its node's environment (KubeRay: the server-key Secret)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from calcx.contract.env import CALCX_KEY
from calcx.trainer.run_dir.names import KEY_DIR, KEY_FILE

#: the config key (`calcx.`) that sends workers to their node's CALCX_KEY instead of a key file
KEY_FROM_ENV = "key_from_env"


class NoServerKey(RuntimeError):
    """A Ray worker told to read the key from its node's environment finds none there."""


def key_dir(report_dir: Path) -> Path:
    """Where a run keeps its key file."""
    return Path(report_dir) / KEY_DIR


def write_key_file(key: str, directory: Path | None = None) -> Path:
    """The key in a new file only its owner can read, in ``directory`` (made mode 0700; a new
    temporary one when None), replacing a key file an earlier, killed run left there."""
    if directory is None:
        directory = Path(tempfile.mkdtemp(prefix="calcx-key-"))  # mode 0700
    else:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(directory, 0o700)
    path = directory / KEY_FILE
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(key)
    return path


def remove_key_file(path: Path) -> None:
    """Delete the key file and its directory (at the end of the run)."""
    shutil.rmtree(path.parent, ignore_errors=True)


def server_key(calcx: Any, environ: Mapping[str, str] | None = None) -> str:
    """The key of the config's `calcx` section: the contents of `calcx.key_file`, or with
    `calcx.key_from_env` this node's CALCX_KEY ('' when neither is configured)."""
    get = calcx.get if hasattr(calcx, "get") else (lambda _key, default=None: default)
    path = get("key_file")
    if path:
        return Path(str(path)).read_text(encoding="utf-8").strip()
    if not get(KEY_FROM_ENV, False):
        return ""
    key = (os.environ if environ is None else environ).get(CALCX_KEY, "").strip()
    if not key:
        import socket

        raise NoServerKey(
            f"calcx.{KEY_FROM_ENV}: {CALCX_KEY} is not set on this Ray node ({socket.gethostname()}); on a Ray "
            f"cluster every node needs the calcx server's key in {CALCX_KEY} when it starts (KubeRay: the "
            "server-key Secret, as ray/raycluster.yaml does; by hand: CALCX_KEY=... ray start ...)"
        )
    return key
