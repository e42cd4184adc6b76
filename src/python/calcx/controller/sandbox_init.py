"""The first program of an agent's namespaces: it seals the mounts, drops every capability and
execs the agent (``--sandbox namespace``; the controller's side is :mod:`calcx.controller.sandbox`).

It runs as ``python -I -S -c <this file's source> SPEC`` under ``unshare --user --map-root-user
--mount --pid --fork --mount-proc --ipc --uts``, so it is uid 0 of a user namespace of its own
(the controller's uid outside), PID 1 of a fresh PID namespace with its own /proc, in a private
copy of the mount table. SPEC is JSON: ``hide`` (directories an empty tmpfs covers: /tmp, $HOME,
the working directory), ``expose`` (paths under those the agent needs, bound back read-only: its
interpreter, its import path), ``cwd``, ``nice`` and ``cmd``. Standard library only: it runs
before any import path exists. Every step that fails ends it with status 71 and a line naming
the step; nothing runs unsealed.
"""

import ctypes
import errno
import json
import os
import signal
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 0x20, 0x400, 0x800, 0x1000, 0x4000
MS_RELATIME = 0x200000
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 1, 24, 38, 47, 4
#: a remount's errors that mean the agent has no path to that mount either
UNREACHABLE = (errno.ENOENT, errno.EINVAL, errno.EACCES)
SETUP_FAILED = 71  # EX_OSERR: the agent never started
TMPFS_SIZE = "64m"  # each private tmpfs: memory, so bounded
#: statvfs flags that a remount must keep (a user namespace may not clear them) -> mount flags
KEPT_FLAGS = (
    (os.ST_NOSUID, MS_NOSUID),
    (os.ST_NODEV, MS_NODEV),
    (os.ST_NOEXEC, MS_NOEXEC),
    (os.ST_NOATIME, MS_NOATIME),
    (os.ST_NODIRATIME, MS_NODIRATIME),
    (os.ST_RELATIME, MS_RELATIME),
)

libc = ctypes.CDLL(None, use_errno=True)


def fail(step, detail=""):
    sys.stderr.write("calcx-sandbox: {}{}\n".format(step, ": " + detail if detail else ""))
    os._exit(SETUP_FAILED)


def mount(source, target, fstype, flags, data, step):
    try:
        try_mount(source, target, fstype, flags, data)
    except OSError as exc:
        fail(step, f"{target}: {exc.strerror}")


def try_mount(source, target, fstype, flags, data):
    args = [None if a is None else os.fsencode(a) for a in (source, target, fstype)]
    if libc.mount(args[0], args[1], args[2], flags, None if data is None else data.encode()) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), target)


def mount_points():
    """Every mount point of this namespace (octal escapes of /proc/self/mountinfo decoded)."""
    with open("/proc/self/mountinfo", "rb") as f:
        lines = f.read().splitlines()
    points = []
    for line in lines:
        raw = line.split(b" ")[4]
        points.append(
            os.fsdecode(
                raw.replace(b"\\040", b" ").replace(b"\\011", b"\t").replace(b"\\012", b"\n").replace(b"\\134", b"\\")
            )
        )
    return points


def is_read_only(path):
    return bool(os.statvfs(path).f_flag & os.ST_RDONLY)


def remount_read_only(path):
    st = os.statvfs(path)
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY
    for st_flag, ms_flag in KEPT_FLAGS:
        if st.f_flag & st_flag:
            flags |= ms_flag
    try_mount(None, path, None, flags, None)


def under(path, roots):
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def seal(spec):
    hide = sorted(spec["hide"], key=len)
    expose = sorted(spec["expose"], key=len)
    points = mount_points()
    # Handles on what the agent needs, taken before the tmpfs covers them.
    handles = {}
    for path in expose:
        try:
            handles[path] = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError as exc:
            fail("cannot open %s, which the agent needs" % path, exc.strerror)
    # 1. Every mount read-only. A mount that another covers has no path to it (its path is gone,
    # or names no mount point now): what covers it is remounted in its turn. One below a directory
    # the user may not enter is out of the agent's reach as well. Step 4 checks.
    for path in points:
        try:
            remount_read_only(path)
        except OSError as exc:
            if exc.errno not in UNREACHABLE:
                fail("remount read-only", f"{path}: {exc.strerror}")
    # 2. An empty, private, writable tmpfs over each hidden directory.
    for path in hide:
        mode = "1777" if path in ("/tmp", "/dev/shm") else "0700"
        if not os.path.isdir(path):
            if not under(path, hide[: hide.index(path)]):
                continue  # nothing there to hide
            os.makedirs(path, exist_ok=True)
        mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"mode={mode},size={TMPFS_SIZE}", "cover with a tmpfs")
    # 3. What the agent needs from under them, bound back read-only at the same path.
    for path in expose:
        if not under(path, hide):
            continue
        if os.path.isdir("/proc/self/fd/%d" % handles[path]):
            os.makedirs(path, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, "ab").close()
        mount("/proc/self/fd/%d" % handles[path], path, None, MS_BIND | MS_REC, None, "bind back")
        try:
            remount_read_only(path)
        except OSError as exc:
            fail("remount the bound path read-only", f"{path}: {exc.strerror}")
    # 4. Check, not assume: every path outside the tmpfs mounts answers read-only.
    for path in points + expose:
        if under(path, hide) and not under(path, expose):
            continue
        try:
            writable = not is_read_only(path)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.EACCES):
                continue
            fail("cannot check", f"{path}: {exc.strerror}")
        if writable:
            fail("still writable after sealing", path)
    for path in hide:
        if os.path.isdir(path) and is_read_only(path):
            fail("the private tmpfs is not writable", path)


def drop_privileges():
    """No capability survives the exec (bounding, ambient, inheritable sets emptied), and no
    exec can grant one back (no_new_privs)."""
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            fail("drop capability %d" % cap, os.strerror(ctypes.get_errno()))
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable: all zero, twice (64 bits)
    if libc.capset(header, data) != 0:
        fail("clear capabilities", os.strerror(ctypes.get_errno()))
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        fail("set no_new_privs", os.strerror(ctypes.get_errno()))


def run_agent(spec):
    """PID 1 of the new PID namespace: when it ends, the kernel ends every process left in it
    (the calculator among them)."""
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        fail("tie the agent to its launcher", os.strerror(ctypes.get_errno()))
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None, "mount a fresh /proc")
    seal(spec)
    if spec.get("nice"):
        os.nice(spec["nice"])
    drop_privileges()
    os.chdir(spec["cwd"])
    cmd = spec["cmd"]
    try:
        os.execvp(cmd[0], cmd)
    except OSError as exc:
        fail("cannot start the agent command %s" % cmd[0], exc.strerror)


def main():
    """Fork the agent into the PID namespace and end as it ended: its exit status, or death by
    the same signal (a PID 1 cannot pass on its own death by a signal; its parent can)."""
    spec = json.loads(sys.argv[1])
    try:
        pid = os.fork()
    except OSError as exc:
        fail("fork the agent", exc.strerror)
    if pid == 0:
        try:
            run_agent(spec)
        finally:
            os._exit(SETUP_FAILED)
    for forwarded in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(forwarded, lambda signum, frame: os.kill(pid, signal.SIGKILL))
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig != signal.SIGKILL:
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


if __name__ == "__main__":  # `python -c`; importing it (to read its source) runs nothing
    main()
