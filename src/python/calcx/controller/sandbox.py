"""``--sandbox namespace``: each local agent in a user, mount, PID, IPC and UTS namespace of its own.

What an agent (and its calculator, its child) then gets:

- a fresh ``/proc`` of its own PID namespace: the controller, the server and other agents are
  not there to see, signal or read (``/proc/<pid>/environ``);
- the whole file system read-only: it cannot write into the user's files or into the Python
  installation it imports from;
- an empty private tmpfs over ``/tmp``, ``/dev/shm``, ``$HOME``, ``$TMPDIR`` and its working
  directory (the controller's, or ``/tmp`` when that is ``/``): the user's files there are hidden,
  and what it writes there is its own and goes with it. What it needs from under those
  directories (its interpreter, its import path, the files its command names) is bound back
  read-only at the same path;
- no capability: the uid it has inside (0, mapped to the controller's uid) owns nothing it could
  not own before, and no exec gives a capability back;
- the network of the host: the gateway is on loopback.

User namespaces need no privilege where the kernel allows them to unprivileged users; the
controller checks that an agent can be sealed this way before it claims work, and refuses to
start otherwise (:class:`SandboxUnavailable`, naming why). The pre-forked worker cannot fork into
namespaces of its own per agent, so the sandbox spawns each agent, as ``--no-prefork`` does.
The in-namespace steps are :mod:`calcx.controller.sandbox_init`.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

NONE = "none"
NAMESPACE = "namespace"
SANDBOX_MODES = (NONE, NAMESPACE)

#: util-linux unshare: a user namespace (the uid mapped to 0 inside), and in it the mount, PID,
#: IPC and UTS namespaces. The launcher forks the agent into the PID namespace itself, so that
#: it can pass on the agent's death by a signal (util-linux 2.38's `--fork` loses it).
UNSHARE_ARGS = ("--user", "--map-root-user", "--mount", "--pid", "--ipc", "--uts")
#: Directories always covered by a private tmpfs, beside $HOME, $TMPDIR and the working directory.
HIDDEN_ALWAYS = ("/tmp", "/dev/shm")
#: Path-list variables of the agent's environment whose entries the agent needs to see.
PATH_VARIABLES = ("PYTHONPATH", "PEX_EXTRA_SYS_PATH")
#: Single-path variables of the agent's environment whose target the agent needs to see.
PATH_VARIABLE = ("PYTHONHOME", "VIRTUAL_ENV", "PEX_ROOT")
PROBE_TIMEOUT_S = 30.0


class SandboxUnavailable(RuntimeError):
    """This machine cannot seal an agent; the message says why."""


@functools.lru_cache(maxsize=1)
def _launcher_source() -> str:
    from calcx.controller import sandbox_init

    return inspect.getsource(sandbox_init)


@dataclass(frozen=True)
class NamespaceSandbox:
    """What the agents of one runner see: the directories hidden, the paths bound back under them."""

    hide: tuple[str, ...]
    expose: tuple[str, ...]
    cwd: str
    unshare: str
    python: str

    @classmethod
    def plan(
        cls,
        agent_cmd: Sequence[str],
        env: Mapping[str, str],
        *,
        default_agent: bool,
        cwd: str | None = None,
        python: str = sys.executable,
    ) -> NamespaceSandbox:
        """The sandbox for `agent_cmd` run with `env` from `cwd`. `default_agent`: the command is
        this interpreter's `-m calcx.agent`, which imports what this process imports."""
        unshare = shutil.which("unshare")
        if unshare is None:
            raise SandboxUnavailable("`unshare` (util-linux) is not on PATH")
        cwd = os.path.realpath(cwd or os.getcwd())
        hide = _hidden(env, cwd)
        wanted = list(_named_paths(agent_cmd, env, cwd)) + list(_interpreter_paths(python))
        for path in wanted:
            for hidden in hide:
                if _within(hidden, path):
                    raise SandboxUnavailable(
                        f"the agent needs {path}, which holds {hidden}, a directory the sandbox hides "
                        "(run the controller from another directory, or name a narrower path)"
                    )
        if default_agent:  # this interpreter's import path, but never what holds a hidden directory
            wanted += [p for p in _import_path() if not any(_within(h, p) for h in hide)]
        agent_cwd = cwd if cwd != "/" else "/tmp"
        return cls(hide=tuple(hide), expose=tuple(_outermost(wanted)), cwd=agent_cwd, unshare=unshare, python=python)

    def command(self, cmd: Sequence[str], nice: int = 0) -> list[str]:
        """`cmd`, to run sealed."""
        spec = {"hide": list(self.hide), "expose": list(self.expose), "cwd": self.cwd, "nice": nice, "cmd": list(cmd)}
        return [self.unshare, *UNSHARE_ARGS, "--", self.python, "-I", "-S", "-c", _launcher_source(), json.dumps(spec)]

    def check(self) -> None:
        """Seal one process the way an agent will be, or raise SandboxUnavailable with what failed."""
        probe = self.command([self.python, "-I", "-S", "-c", "pass"])
        try:
            done = subprocess.run(
                probe,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=PROBE_TIMEOUT_S,
                env={"PATH": os.environ.get("PATH", os.defpath)},
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SandboxUnavailable(f"cannot run {self.unshare}: {exc}") from exc
        if done.returncode != 0:
            said = " ".join((done.stderr or done.stdout).split()) or f"exit status {done.returncode}"
            raise SandboxUnavailable(f"namespaces are not available here: {said}")


def _hidden(env: Mapping[str, str], cwd: str) -> list[str]:
    hide = list(HIDDEN_ALWAYS)
    for path in (env.get("HOME"), env.get("TMPDIR"), cwd):
        if path and os.path.isabs(path):
            real = os.path.realpath(path)
            if real != "/" and real not in hide:
                hide.append(real)
    return hide


def _named_paths(cmd: Sequence[str], env: Mapping[str, str], cwd: str) -> Iterable[str]:
    """Paths the command and the environment name: arguments that are paths (an `env NAME=VALUE`
    argument is a variable), the entries of the import-path variables, and the prefix of each
    executable found among them (a `bin/` directory's parent: its venv or installation)."""
    variables = dict(env)
    candidates: list[str] = []
    for i, arg in enumerate(cmd):
        name, eq, value = arg.partition("=")
        if eq and name.isidentifier() and not arg.startswith(("/", ".")):
            variables[name] = value
        elif i == 0 and "/" not in arg:
            found = shutil.which(arg, path=env.get("PATH"))
            candidates += [found] if found else []
        elif "/" in arg:
            candidates.append(arg)
    for name in PATH_VARIABLES:
        candidates += [p for p in variables.get(name, "").split(os.pathsep) if p]
    for name in PATH_VARIABLE:
        candidates += [variables[name]] if variables.get(name) else []
    for candidate in candidates:
        path = os.path.join(cwd, candidate)
        if not os.path.exists(path):
            continue
        for form in (os.path.abspath(path), os.path.realpath(path)):
            yield form
            if os.path.isfile(form) and os.access(form, os.X_OK):
                yield from _prefix(form)


def _interpreter_paths(python: str) -> Iterable[str]:
    """The launcher's interpreter: it runs before the tmpfs goes on, but the probe runs it after."""
    for form in (os.path.abspath(python), os.path.realpath(python)):
        yield form
        yield from _prefix(form)


def _prefix(executable: str) -> Iterable[str]:
    """The installation an executable in a `bin/` directory belongs to (a venv, a pyenv version),
    unless that is the root itself."""
    parent = os.path.dirname(executable)
    if os.path.basename(parent) == "bin" and os.path.dirname(parent) != "/":
        yield os.path.dirname(parent)


def _import_path() -> list[str]:
    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path]
    return [os.path.realpath(p) for p in paths if p and os.path.exists(p)]


def _within(inner: str, outer: str) -> bool:
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def _outermost(paths: Iterable[str]) -> list[str]:
    """Each path once, none under another (binding the outer one shows the inner)."""
    kept: list[str] = []
    for path in sorted(set(paths), key=len):
        if not any(_within(path, k) for k in kept):
            kept.append(path)
    return kept
