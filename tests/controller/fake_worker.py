"""A stand-in for the pre-forked worker (``python -m calcx.worker``) that holds its answer to an
agent request until the test says so, so that a test can put a cancel at any moment of the start.

It speaks the worker's protocol (ready line on stdout, ``ping``, ``agent`` with one output fd,
``kill``, a ``{"exit": ...}`` line when the agent ends, the agent killed when its connection closes,
exit when stdin closes) and forks no agent: each "agent" is ``sleep`` in its own process group,
which ends only when it is killed. Handshake through files in ``--dir``: it writes ``request-N``
(the agent's pid) when request N arrived, waits for ``go-N``, answers, then writes ``replied-N``.
Standard library only: it runs with the test's interpreter, whatever its path.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def _send(sock: socket.socket, msg: dict) -> None:
    try:
        sock.sendall((json.dumps(msg) + "\n").encode())
    except OSError:
        pass


def _end(child: subprocess.Popen, sock: socket.socket | None) -> None:
    """Kill an agent's group, reap it and, while its caller listens, say how it ended."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    child.wait()
    if sock is not None:
        _send(sock, {"exit": {"code": None, "signal": signal.SIGKILL, "wall_s": 0.0, "cpu_s": 0.0}})


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--ready-line", required=True)
    parser.add_argument("--dir", required=True)
    args = parser.parse_args()
    handshake = Path(args.dir)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(args.socket)
    listener.listen(16)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "listen")
    sel.register(sys.stdin.fileno(), selectors.EVENT_READ, "control")
    agents: dict[socket.socket, subprocess.Popen] = {}
    requests = 0
    print(args.ready_line, flush=True)
    running = True
    while running:
        for key, _ in sel.select():
            if key.data == "listen":
                sock, _ = listener.accept()
                sel.register(sock, selectors.EVENT_READ, "conn")
                continue
            if key.data == "control":
                running = bool(os.read(sys.stdin.fileno(), 4096))
                continue
            conn = key.fileobj
            assert isinstance(conn, socket.socket)  # registered as "conn": an accepted socket
            sock = conn
            try:
                data, fds, _, _ = socket.recv_fds(sock, 1 << 16, 4)
            except OSError:
                data, fds = b"", []
            if not data:  # the caller went away: its agent must not outlive it
                sel.unregister(sock)
                if sock in agents:
                    _end(agents.pop(sock), None)
                sock.close()
                continue
            msg = json.loads(data.splitlines()[0])
            if msg.get("op") == "ping":
                _send(sock, {"pong": os.getpid(), "calc": False, "agent": True})
            elif msg.get("op") == "agent":
                child = subprocess.Popen(["sleep", "600"], stdout=fds[0], stderr=fds[0], start_new_session=True)
                os.close(fds[0])
                agents[sock] = child
                requests += 1
                (handshake / "request.tmp").write_text(str(child.pid))
                os.replace(handshake / "request.tmp", handshake / f"request-{requests}")
                while not (handshake / f"go-{requests}").exists():
                    time.sleep(0.001)
                _send(sock, {"pid": child.pid})
                (handshake / f"replied-{requests}").write_text("")
            elif msg.get("op") == "kill" and sock in agents:
                _end(agents.pop(sock), sock)
    for child in agents.values():
        _end(child, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
