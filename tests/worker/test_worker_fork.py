"""A child the worker forks runs its agent or calculator as a fresh interpreter would: a write to a
pipe whose reader died fails with EPIPE (BrokenPipeError), which the agent's code handles (a killed
calculator then fails the rollout as calculator_failed), instead of killing the child with SIGPIPE
(an unexplained `crash`)."""

from __future__ import annotations

import os
import selectors
import signal
import socket

from calcx.worker.fork import Forking


def _bare_worker() -> Forking:
    """The attributes the forking half reads in a child, as the worker sets them."""
    worker = Forking()
    worker.pid, worker.child_nice = os.getpid(), 0
    worker.conns, worker.spares = {}, {}
    worker.sel = selectors.DefaultSelector()
    worker.stats = {"fork_s": 0.0}
    worker.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    worker.wake_r, worker.wake_w = os.pipe()
    worker.control_fd = None
    return worker


def test_a_forked_child_gets_a_broken_pipe_error_not_sigpipe() -> None:
    worker, parent = _bare_worker(), os.getpid()
    code = 70
    try:
        pid = worker._fork()
        if pid == 0:  # the child
            read_end, write_end = os.pipe()
            os.close(read_end)
            try:
                os.write(write_end, b"tool call")
            except BrokenPipeError:
                code = 0
    finally:
        if os.getpid() != parent:  # the child never returns into the test runner
            os._exit(code)
        worker.listener.close()
        worker.sel.close()
        os.close(worker.wake_r)
        os.close(worker.wake_w)
    assert pid is not None
    _, status = os.waitpid(pid, 0)
    assert not os.WIFSIGNALED(status), f"the child died of {signal.Signals(os.WTERMSIG(status)).name}"
    assert os.WEXITSTATUS(status) == 0
