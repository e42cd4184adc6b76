"""An agent that tries to leave its sandbox: run by tests/controller/test_controller_sandbox.py as
`python hostile_agent.py CONTROL_DIR` (the local runner's --agent-cmd), standard library only.

Its QUESTION is a JSON plan. Role `holder`: write a secret into each place an agent may write
(/tmp, $HOME, its working directory), print `holding`, and stay until CONTROL_DIR/release-<rid>
appears (then remove what it wrote). Role `probe`: try every escape of the plan and print one
`report: {...}` line with what each try got; exit 0 either way (the test reads the report).
"""

from __future__ import annotations

import json
import os
import sys
import time

SECRET_NAME = "calcx-peer-secret"
RELEASE_WAIT_S = 120.0


def _places() -> list[str]:
    return [os.path.join(d, SECRET_NAME) for d in ("/tmp", os.path.expanduser("~"), os.getcwd())]


def _try(action) -> str:
    """'ok: ...' when the action worked, else the error it met."""
    try:
        return "ok: " + str(action())
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror}"


def _write(path: str) -> str:
    with open(path, "w") as f:
        f.write("written by a sandboxed agent\n")
    return path


def _read(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read(200)


def hold(control_dir: str, rid: str) -> int:
    secret = f"secret-of-{rid}"
    written = []
    for path in _places():
        try:
            with open(path, "w") as f:
                f.write(secret)
            written.append(path)
        except OSError:
            pass
    print("holding " + json.dumps(written), flush=True)
    release = os.path.join(control_dir, f"release-{rid}")
    deadline = time.monotonic() + RELEASE_WAIT_S
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.05)
    for path in written:
        os.unlink(path)
    return 0


def _processes() -> dict[str, str]:
    seen = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                seen[entry] = _read(f"/proc/{entry}/cmdline").replace("\0", " ").strip()
            except OSError:
                seen[entry] = "?"
    return seen


def _peer_secrets() -> dict[str, str]:
    """The holder's secret, looked for where it wrote it and through every /proc/<pid>/root and cwd."""
    found = {}
    candidates = list(_places())
    for entry in os.listdir("/proc"):
        if entry.isdigit() and entry != str(os.getpid()):
            candidates += [f"/proc/{entry}/root/tmp/{SECRET_NAME}", f"/proc/{entry}/cwd/{SECRET_NAME}"]
    for path in candidates:
        got = _try(lambda p=path: _read(p))
        if "secret-of-" in got:
            found[path] = got
    return found


def _syscall(name: str, *args) -> str:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return name


def _unseal(plan: dict) -> dict[str, str]:
    """Undo the seal from inside: uncover $HOME, make the root file system writable again."""
    home = os.path.dirname(plan["home_file"]).encode()
    ms_remount, ms_bind, ms_relatime, mnt_detach = 0x20, 0x1000, 0x200000, 2
    return {
        "umount home": _try(lambda: _syscall("umount2", home, mnt_detach)),
        "remount / writable": _try(
            lambda: _syscall("mount", None, b"/", None, ms_remount | ms_bind | ms_relatime, None)
        ),
    }


def probe(plan: dict) -> int:
    report = {
        "pid": os.getpid(),
        "unseal": _unseal(plan),  # first: what follows then shows what an undone seal gives
        "writes": {d: _try(lambda d=d: _write(os.path.join(d, plan["file_name"]))) for d in plan["write_into"]},
        "home_file": _try(lambda: _read(plan["home_file"])),
        "processes": _processes(),
        # whether it could, never what it read: the environment of a process outside may hold secrets
        "environ": {
            pid: _try(lambda pid=pid: f"{len(_read(f'/proc/{pid}/environ'))} characters") for pid in plan["pids"]
        },
        "peer_secrets": _peer_secrets(),
    }
    print("report: " + json.dumps(report), flush=True)
    return 0


def main() -> int:
    plan = json.loads(os.environ["QUESTION"])
    if plan["role"] == "holder":
        return hold(sys.argv[1], os.environ["CALCX_ROLLOUT_ID"])
    return probe(plan)


if __name__ == "__main__":
    sys.exit(main())
