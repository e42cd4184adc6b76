"""Calculator launch commands the local runner puts into ``CALCX_CALCULATOR_CMD``.

The agent starts its MCP calculator as a subprocess (in a new session, so the agent's process
group does not include it). Two tiny ``python -S -c`` programs keep that cheap and contained:

- :data:`HANDOFF_SRC` (pre-forked mode): tie itself to the agent with PR_SET_PDEATHSIG, hand its
  stdin/stdout/stderr to the zygote over a UNIX socket (SCM_RIGHTS), wait for the calculator the
  zygote forked on those fds, and exit with its status. ~20 ms of CPU instead of ~0.5 s. When the
  agent dies, this process dies, its socket closes, and the zygote kills the calculator.
- :data:`EXEC_SRC` (plain-spawn mode): set PR_SET_PDEATHSIG, then exec the real calculator, so a
  calculator never outlives the agent that started it.
"""

from __future__ import annotations

import json
import sys

# Runs under `python -S -c`: standard library only, no site-packages, no calcx.
_PDEATHSIG = """
import os, sys
_ppid = os.getppid()
try:
    import ctypes
    _libc = ctypes.CDLL(None)
    _libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL
    _libc.prctl(15, b"calcx-calc-link", 0, 0, 0)  # PR_SET_NAME
except Exception:
    pass
if os.getppid() != _ppid:
    os._exit(1)
"""

HANDOFF_SRC = _PDEATHSIG + """
import json, socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(sys.argv[1])
    socket.send_fds(s, [b'{"op": "calc"}\\n'], [0, 1, 2])
except OSError as exc:
    sys.stderr.write("calcx-calculator-launcher: cannot reach the calculator worker at %s: %s\\n" % (sys.argv[1], exc))
    os._exit(71)
null = os.open(os.devnull, os.O_RDWR)
os.dup2(null, 0)
os.dup2(null, 1)
buf = b""
while b"\\n" not in buf or b'"exit"' not in buf:
    try:
        chunk = s.recv(4096)
    except InterruptedError:
        continue
    if not chunk:
        os._exit(75)
    buf += chunk
for line in buf.split(b"\\n"):
    if b'"exit"' in line:
        info = json.loads(line)["exit"]
        sig = info.get("signal")
        os._exit(128 + sig if sig else (info.get("code") or 0) & 255)
    if b'"error"' in line:
        sys.stderr.write("calcx-calculator-launcher: %s\\n" % json.loads(line)["error"])
        os._exit(71)
os._exit(75)
"""

EXEC_SRC = _PDEATHSIG + """
os.execvp(sys.argv[1], sys.argv[1:])
"""


def handoff_command(sock_path: str, python: str | None = None) -> list[str]:
    """Calculator command that asks the zygote at `sock_path` for a calculator process."""
    return [python or sys.executable, "-S", "-c", HANDOFF_SRC, sock_path]


def exec_command(calculator_cmd: list[str], python: str | None = None) -> list[str]:
    """`calculator_cmd`, wrapped so that it dies with the agent that started it."""
    return [python or sys.executable, "-S", "-c", EXEC_SRC, *calculator_cmd]


def as_env_value(cmd: list[str]) -> str:
    """The JSON list form ``CALCX_CALCULATOR_CMD`` takes."""
    return json.dumps(cmd)
