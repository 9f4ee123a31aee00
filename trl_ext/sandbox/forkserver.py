"""The sandbox's fork server: a standalone program (standard library only) that the host starts as a separate
interpreter and drives over its stdin/stdout, one JSON request and one JSON reply per line.

This file is never imported by the host: `trl_ext.sandbox.pool` reads its text and runs it with `python -c`, so it
must not import anything from `trl_ext` and must run on whichever interpreter executes the snippets.

At start the server isolates itself once: a private mount namespace in which every mount is read-only (nosuid,
nodev), and a new network namespace with no usable interface; as a non-root user, or as root without CAP_SYS_ADMIN,
it first enters a new user namespace to be allowed to do so. Without them (or without the filter) it refuses unless
the caller opted in. It never runs snippet code itself, and it never forks snippet processes either: before it reads
its first request it forks a zygote, which from then on receives nothing but orders to fork, so the memory every
snippet process inherits holds nothing of any earlier request, output or value. For each request the zygote forks a
fresh child, which enters new mount and PID namespaces (IPC too without a filter) and a network namespace, gets a
private tmpfs on /tmp as its empty working directory and a fresh /proc, reads its own request, sets its rlimits,
drops to an unprivileged uid/gid (or, in a user namespace, drops all capabilities), forbids new privileges, and only
then executes the snippet. The child is PID 1 of its PID namespace, so killing it (wall-clock timeout, output cap)
kills anything it started; with the process limit at 0 it cannot start anything anyway.

The snippet's value travels back as `repr()` text on a separate pipe, framed with a per-execution random nonce, so
printing cannot forge it; the host reads it with `ast.literal_eval`, never with pickle.
"""

import array
import ctypes
import errno
import gc
import json
import math
import os
import re
import resource
import select
import signal
import socket
import struct
import sys
import time


CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER = 0x00020000, 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
MS_NOATIME, MS_NODIRATIME, MS_RELATIME, MS_STRICTATIME = 1024, 2048, 1 << 21, 1 << 24
PR_SET_PDEATHSIG, PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS = 1, 22, 38
SECCOMP_MODE_FILTER, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_SPEC_ALLOW = 2, 1, 4
KEYCTL_JOIN_SESSION_KEYRING = 1
MOUNT_FLAGS = {
    "ro": MS_RDONLY,
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
    "strictatime": MS_STRICTATIME,
}
NOBODY = 65534
# Shared, world-writable places (where Unix sockets and shared memory of other programs live): covered by an empty
# read-only tmpfs. A read-only mount does not stop connect() to a Unix socket; not seeing it does.
HIDDEN = ("/run", "/var/run", "/var/tmp", "/dev/shm", "/dev/mqueue", "/var/lock")
RESULT_FD = 3
REQUEST_FD = 255  # where a child keeps its request pipe until the request is read (out of the snippet's way)
TMP_KB = 16 << 10  # size of each snippet's private /tmp
# Modules imported once here so that children start with them loaded (the common ones of AZR programs). `random`
# is deliberately absent: a child imports it fresh and seeds it from the OS, as a fresh interpreter would.
PRELOAD = ("collections", "itertools", "functools", "heapq", "bisect", "string", "re", "operator", "typing", "copy")

libc = ctypes.CDLL("libc.so.6", use_errno=True)
libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, "%s: %s" % (what, os.strerror(err)))


def unshare(flags):
    _check(libc.unshare(flags), "unshare")


def mount(source, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else os.fsencode(s)  # noqa: E731
    _check(libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), "mount %s" % target)


def prctl(option, arg):
    _check(libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), "prctl %d" % option)


class SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


class SyscallFilter:
    """The BPF program the host compiled with libseccomp (see `trl_ext.sandbox.syscall_filter`). The zygote installs
    it on itself, once: every child inherits it (sharing one filter costs a child nothing; a filter of its own would
    cost it ~0.1 ms to attach and free)."""

    def __init__(self, program, seccomp_nr):
        self.buffer = ctypes.create_string_buffer(program, len(program))
        self.fprog = SockFprog(len(program) // 8, ctypes.addressof(self.buffer))
        self.seccomp_nr = seccomp_nr

    def install(self):
        # SPEC_ALLOW: no speculative-store-bypass mitigation forced on the snippets (which costs every execution
        # time): it guards a process's own memory against code running in it, and a snippet's process holds
        # nothing but its own request (see Zygote).
        if (
            self.seccomp_nr is None
            or libc.syscall(
                ctypes.c_long(self.seccomp_nr),
                SECCOMP_SET_MODE_FILTER,
                SECCOMP_FILTER_FLAG_SPEC_ALLOW,
                ctypes.byref(self.fprog),
            )
            != 0
        ):
            _check(
                libc.prctl(
                    PR_SET_SECCOMP,
                    ctypes.c_ulong(SECCOMP_MODE_FILTER),
                    ctypes.byref(self.fprog),
                    ctypes.c_ulong(0),
                    ctypes.c_ulong(0),
                ),
                "seccomp",
            )


def join_new_session_keyring(keyctl):
    """Leave the inherited session keyring (the trainer's: Kerberos caches, secrets) for a new, empty one. Where the
    call is refused (a container's own filter) the keyring calls are refused to the snippet as well."""
    if keyctl is not None:
        libc.syscall(ctypes.c_long(keyctl), ctypes.c_long(KEYCTL_JOIN_SESSION_KEYRING), None)


def drop_capabilities():
    """capset(2) with empty sets: what a user-namespace root keeps after its setup."""
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)()
    _check(libc.capset(header, data), "capset")


def mount_points():
    """(mount point as bytes, options) from mountinfo, which escapes space, tab, newline and backslash as octal and
    leaves every other byte (UTF-8 names included) as it is."""
    points = []
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            fields = line.split(b" ")
            point = re.sub(rb"\\([0-7]{3})", lambda m: bytes((int(m.group(1), 8),)), fields[4])
            points.append((point, fields[5].decode("ascii", "replace").split(",")))
    return points


def memory_cgroup_delegated():
    """Whether a cgroup v2 memory controller (which would also count kernel memory) is delegated to this process:
    reported by `isolation()`, not used (the address-space limit is)."""
    delegated = False
    try:
        with open("/proc/self/cgroup") as f:
            path = next((line[3:].strip() for line in f if line.startswith("0::")), None)
        mounts = [line.split(b" ") for line in open("/proc/self/mountinfo", "rb")]
        roots = [fields[4].decode() for fields in mounts if fields[fields.index(b"-") + 1] == b"cgroup2"]
        for root in roots if path else ():
            with open(os.path.join(root, path.lstrip("/"), "cgroup.controllers")) as f:
                delegated = delegated or "memory" in f.read().split()
    except (OSError, ValueError, StopIteration):
        pass
    return delegated


def has_cap_sys_admin():
    with open("/proc/self/status") as f:
        caps = next(line.split()[1] for line in f if line.startswith("CapEff:"))
    return bool(int(caps, 16) >> 21 & 1)  # CAP_SYS_ADMIN


def enter_user_namespace(config):
    """A new user namespace in which this process holds every capability. Not root: the caller's uid mapped to
    itself. Root without CAP_SYS_ADMIN (a container's default root): root and NOBODY mapped to themselves, so the
    children still drop to uid 65534 (a child keeping uid 0 would read every file of root's). Only a process outside
    the namespace with CAP_SETUID and CAP_SETGID may write a mapping of more than its own uid: a helper forked
    before the unshare writes it."""
    uid, gid = os.getuid(), os.getgid()
    if not config["root"]:
        unshare(CLONE_NEWUSER)
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write("%d %d 1" % (uid, uid))
        with open("/proc/self/gid_map", "w") as f:
            f.write("%d %d 1" % (gid, gid))
        return
    ready_r, ready_w = os.pipe()
    helper = os.fork()
    if helper == 0:
        os.close(ready_w)
        code = 1
        try:
            if os.read(ready_r, 1) == b"u":  # the server is in its new namespace
                for name in ("uid_map", "gid_map"):
                    with open("/proc/%d/%s" % (os.getppid(), name), "w") as f:
                        f.write("0 0 1\n%d %d 1\n" % (NOBODY, NOBODY))
                code = 0
        finally:
            os._exit(code)
    os.close(ready_r)
    try:
        unshare(CLONE_NEWUSER)
        os.write(ready_w, b"u")
    finally:
        os.close(ready_w)
        status = os.waitpid(helper, 0)[1]
    if status != 0:
        raise OSError(errno.EPERM, "mapping root and uid %d needs CAP_SETUID and CAP_SETGID" % NOBODY)


def isolate_server(config):
    """Once, in the server: a user namespace when not root or root without CAP_SYS_ADMIN, then a read-only private
    view of the file systems and an empty network namespace. Returns (namespaces entered, what could not be
    isolated)."""
    namespaces, missing = [], []
    if not (config["root"] and has_cap_sys_admin()):
        try:
            enter_user_namespace(config)
            namespaces.append("user")
        except OSError as exc:  # what else is missing then depends on Landlock and the filter (see Server)
            return namespaces, ["user namespace refused (%s): no mount, PID or network namespace" % exc.strerror]
    try:
        unshare(CLONE_NEWNET)
        namespaces.append("network")
    except OSError as exc:
        missing.append("network namespace (%s): sockets can reach the network" % exc.strerror)
    # The server continues as PID 1 of new PID and IPC namespaces: it returns to them after each fork (setns, which
    # a user-namespace root may only do for namespaces its user namespace owns), and when the process the host
    # started is killed, this one is too (parent-death signal), taking every snippet process with it.
    try:
        unshare(CLONE_NEWPID | CLONE_NEWIPC)
    except OSError as exc:
        missing.append("PID namespace (%s): no mount/PID isolation, snippets run in a host directory" % exc.strerror)
        return namespaces, missing
    child = os.fork()
    if child:
        os.close(0), os.close(1)
        status = os.waitpid(child, 0)[1]
        os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    namespaces.append("pid")
    try:
        unshare(CLONE_NEWNS)
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        namespaces.append("mount")
    except OSError as exc:
        missing.append("mount namespace (%s): the file system is writable where the uid may write" % exc.strerror)
        return namespaces, missing
    failed = []
    for point, options in mount_points():
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID
        flags |= sum(MOUNT_FLAGS[o] for o in options if o in MOUNT_FLAGS and o != "ro")
        try:
            mount(None, point, None, flags)
        except OSError:
            failed.append(os.fsdecode(point))
    for point in HIDDEN:
        if os.path.isdir(point) and not os.path.islink(point):
            try:
                mount("tmpfs", point, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=0755")
            except OSError:
                failed.append(point)
    if not config["root"] and config.get("home") not in (None, "/"):
        # The snippet keeps the caller's uid here: without this it reads every file of the caller's home directory
        # (tokens, keys, caches), mode 0600 included.
        try:
            hide(config["home"], [sys.prefix, sys.base_prefix, sys.exec_prefix] + sys.path)
        except OSError:
            failed.append(config["home"])
    if failed:
        missing.append("read-only remount or hiding failed for: %s" % ", ".join(failed))
    return namespaces, missing


def hide(directory, keep):
    """Cover `directory` with an empty read-only tmpfs, except the directories of `keep` inside it (the
    interpreter's own files), which are bound back in place, read-only."""
    directory = os.path.realpath(directory)
    keep = {os.path.realpath(k) for k in keep if k and os.path.isdir(k)}
    if any((directory + "/").startswith(k.rstrip("/") + "/") for k in keep):  # it is the interpreter's, or in it
        raise OSError(errno.EINVAL, "%s is inside the interpreter's directories" % directory)
    inside = sorted(k for k in keep if k.startswith(directory + "/"))
    inside = [k for k in inside if not any(k.startswith(other + "/") for other in inside)]
    handles = [(k, os.open(k, os.O_PATH | os.O_CLOEXEC)) for k in inside]
    mounted = False
    try:
        mount("tmpfs", directory, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,nr_inodes=256,mode=0755")
        mounted = True
        for path, fd in handles:
            os.makedirs(path, exist_ok=True)
            mount("/proc/self/fd/%d" % fd, path, None, MS_BIND | MS_REC)
            mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        mount(None, directory, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    except OSError:
        if mounted:  # not left half done: a writable tmpfs here would be shared by every snippet of this server
            libc.umount2(os.fsencode(directory), MNT_DETACH)
        raise
    finally:
        for _, fd in handles:
            os.close(fd)


# Landlock (unprivileged file-system, network and scope rules), for the opted-in mode without namespaces.
LANDLOCK_CREATE_RULESET, LANDLOCK_ADD_RULE, LANDLOCK_RESTRICT_SELF = 444, 445, 446  # the same on every architecture
LL_EXECUTE, LL_WRITE_FILE, LL_READ_FILE, LL_READ_DIR, LL_TRUNCATE, LL_IOCTL_DEV = 1, 2, 4, 8, 1 << 14, 1 << 15
LL_READ = LL_EXECUTE | LL_READ_FILE | LL_READ_DIR
SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc")
PR_SET_DUMPABLE = 4


class LandlockRulesetAttr(ctypes.Structure):
    _fields_ = (
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    )


class LandlockPathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


def landlock_abi():
    return max(0, libc.syscall(ctypes.c_long(LANDLOCK_CREATE_RULESET), None, ctypes.c_size_t(0), ctypes.c_uint32(1)))


def landlock(abi, readable, writable):
    """Restrict this process (and what it starts) to reading `readable`, reading and writing `writable`, no TCP
    (ABI 4), and no signals or abstract Unix sockets beyond its own domain (ABI 6)."""
    fs = (
        (1 << 13) - 1
        | (1 << 13 if abi >= 2 else 0)
        | (LL_TRUNCATE if abi >= 3 else 0)
        | (LL_IOCTL_DEV if abi >= 5 else 0)
    )
    attr = LandlockRulesetAttr(fs, 3 if abi >= 4 else 0, 3 if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    ruleset = libc.syscall(
        ctypes.c_long(LANDLOCK_CREATE_RULESET), ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0)
    )
    if ruleset < 0:
        _check(ruleset, "landlock_create_ruleset")
    try:
        file_rights = LL_EXECUTE | LL_WRITE_FILE | LL_READ_FILE | (fs & (LL_TRUNCATE | LL_IOCTL_DEV))
        for path, access in [(p, LL_READ) for p in readable] + [(p, fs) for p in writable]:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                rule = LandlockPathBeneath(access & fs if os.path.isdir(path) else access & file_rights, fd)
                _check(
                    libc.syscall(ctypes.c_long(LANDLOCK_ADD_RULE), ruleset, 1, ctypes.byref(rule), 0),
                    "landlock_add_rule %s" % path,
                )
            finally:
                os.close(fd)
        _check(libc.syscall(ctypes.c_long(LANDLOCK_RESTRICT_SELF), ruleset, 0), "landlock_restrict_self")
    finally:
        os.close(ruleset)


# What no filter leaves denied (named in `isolation()["missing"]` when libseccomp is missing).
UNFILTERED = (
    "new user namespaces, keyrings, memfd and shared memory, ptrace and process_vm_*, bpf, io_uring, the page-cache "
    "calls (fadvise DONTNEED, RWF_NOWAIT, mincore) and every socket family (AF_VSOCK included) are allowed"
)
# Root without namespaces (opted in): each execution runs as a uid of its own, drawn from this range, so it can
# signal no other snippet (nor a process of uid 65534) and finds no file of an earlier one it could write.
SNIPPET_UIDS = (0x7E000000, 1 << 24)


SECCOMP_RET_ALLOW, SECCOMP_RET_EPERM = 0x7FFF0000, 0x00050000 | errno.EPERM
# The calls that signal a process, and whom each may target when signals are scoped by `signal_scope_filter`.
SIGNAL_CALLS = {
    "kill": "own group",
    "tkill": "itself",
    "tgkill": "itself",
    "rt_sigqueueinfo": "itself",
    "rt_tgsigqueueinfo": "itself",
    "pidfd_open": "itself",
    "pidfd_send_signal": "none",
}


def signal_scope_filter(pid, numbers):
    """A BPF program that lets process `pid` signal only itself (and its own process group, which it leads alone):
    for snippets that share the caller's uid without a PID namespace or Landlock's signal scoping. Installed on top
    of the system-call filter, whose architecture check it relies on. A pid is an int: its low 32 bits are
    compared, as the kernel reads it."""
    own, group = pid & 0xFFFFFFFF, -pid & 0xFFFFFFFF
    arg0 = 16 if sys.byteorder == "little" else 20  # offsetof(struct seccomp_data, args[0]), its low half
    blocks = {
        "own group": [("ld", arg0), ("jeq", 0, "allow"), ("jeq", group, "allow"), ("jeq", own, "allow")],
        "itself": [("ld", arg0), ("jeq", own, "allow")],
        "none": [],
    }
    code = [("ld", 0)]  # the call's number
    code += [("jeq", numbers[name], target) for name, target in SIGNAL_CALLS.items() if numbers.get(name, -1) >= 0]
    code.append(("ret", SECCOMP_RET_ALLOW))
    labels = {}
    for name, block in blocks.items():
        labels[name] = len(code)
        code += block + [("ret", SECCOMP_RET_EPERM)]
    labels["allow"] = len(code)
    code.append(("ret", SECCOMP_RET_ALLOW))
    program = b""
    for i, (op, k, *target) in enumerate(code):
        opcode = {"ld": 0x20, "jeq": 0x15, "ret": 0x06}[op]  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_RET
        program += struct.pack("=HBBI", opcode, labels[target[0]] - i - 1 if target else 0, 0, k)
    return program


def ids_mapped(first, count):
    """Whether uids and gids first..first+count-1 exist here (in a container's user namespace only some do)."""
    for name in ("uid_map", "gid_map"):
        with open("/proc/self/" + name) as f:
            ranges = [tuple(int(x) for x in line.split()) for line in f if line.strip()]
        if not any(inside <= first and first + count <= inside + n for inside, _, n in ranges):
            return False
    return True


class Server:
    def __init__(self, config):
        self.root = os.getuid() == 0
        self.config = dict(config, root=self.root, uid=os.getuid())
        allowed = config.get("allow_unisolated")
        join_new_session_keyring(config.get("keyctl"))
        self.memory_cgroup = memory_cgroup_delegated()
        self.namespaces, self.missing = isolate_server(self.config)
        if config.get("keyctl") is None:
            self.missing.append("session keyring: keyctl's number is unknown here, the caller's keyring is inherited")
        if config.get("filters"):
            program = config["filters"]["network" if "network" in self.namespaces else "no network"]
            self.filter = SyscallFilter(bytes.fromhex(program), config.get("seccomp"))
        else:
            self.filter = None
            self.missing.append("%s: %s" % (config.get("filter_missing") or "no system-call filter", UNFILTERED))
        # The namespaces the zygote makes for each child; the child makes its own network namespace (see `child`).
        # An IPC namespace only without the filter (see Zygote.start), which denies creating any IPC object.
        self.per_child_ns = CLONE_NEWNS | CLONE_NEWPID if "mount" in self.namespaces else 0
        self.per_child_ns |= CLONE_NEWIPC if self.per_child_ns and not self.filter else 0
        self.per_child_net = bool(self.per_child_ns) and "network" in self.namespaces
        self.refused, self.landlock, self.snippet_uids, self.scope_signals = None, 0, None, False
        # No mount or network namespace, or no filter: refused unless the caller opted in (see `harden`).
        if not (self.per_child_net and self.filter):
            if not allowed:
                self.refused = "; ".join(self.missing) or "isolation incomplete"
                return
            if not self.per_child_ns:
                self.harden()
        self.ordered, self.forked = False, None
        self.exits = {}  # pid -> exit status, as the zygote reported it when asked
        for name in PRELOAD:
            __import__(name)
        # The first compile() of a process creates the interpreter's AST node types (~100 classes): ~1 ms of CPU,
        # which every child paid for its snippet's compile. Done once here, on an empty text, they are inherited.
        compile("", "<warm-up>", "exec")
        # Everything allocated so far is never freed: keep it out of the children's garbage collections, which would
        # otherwise walk (and copy, page by page) the whole inherited heap.
        gc.collect()
        gc.freeze()
        # Before the first request is read: the zygote never holds request or reply data, so neither do children.
        self.zygote = Zygote.start(self)
        failed = json.loads(self.zygote.recv(4096) or b'{"filter_failed": "the zygote exited"}')["filter_failed"]
        if failed:
            self.filter = None
            self.missing.append("%s: %s" % (failed, UNFILTERED))
            if not allowed:
                self.refused = "; ".join(self.missing)

    def harden(self):
        """Without namespaces a snippet runs next to the host's processes: as the caller's uid when not root (it
        could read their memory and environment, /proc/<pid>/mem and environ, and write into another fork server's
        pipes). Opted in, it gets what works without namespaces: the host and the servers not dumpable (no /proc
        access, no ptrace by the same uid), Landlock, as root a uid of its own per execution (where that range of uids
        exists), and with the filter no socket() at all and, otherwise, a second filter per child that lets it
        signal only itself."""
        prctl(PR_SET_DUMPABLE, 0)
        self.landlock = landlock_abi()
        uid = self.config["uid"]
        if self.root and ids_mapped(*SNIPPET_UIDS):
            self.snippet_uids = SNIPPET_UIDS
        else:  # a second filter per child, with its own pid (Landlock ABI 6 scopes signals too, where there)
            self.scope_signals = self.filter is not None
        if self.landlock:
            self.readable = [
                p
                for p in SYSTEM_DIRS
                + (sys.prefix, sys.base_prefix, sys.exec_prefix)
                + tuple(sys.path)
                + ("/dev/urandom", "/dev/zero")
                if p
            ]
            self.missing.append(
                "file system: Landlock (ABI %d) limits reads to the system and interpreter "
                "directories and writes to the snippet's own directory" % self.landlock
            )
        else:
            self.missing += [
                "Landlock unavailable",
                "file system: readable and writable wherever the snippet's uid may, /tmp shared",
            ]
        if "network" not in self.namespaces:
            self.missing.append(
                "network: no network namespace; the filter denies socket() (socketpair(AF_UNIX) only)"
                if self.filter
                else "network: UDP and Unix sockets can reach the host (Landlock denies TCP)"
                if self.landlock >= 4
                else "network: sockets can reach the network"
            )
        if self.snippet_uids:
            self.missing.append(
                "processes: no PID namespace; each execution runs as a uid of its own (%d + a random offset below "
                "%d), so it can signal no other process" % SNIPPET_UIDS
            )
        elif self.scope_signals or self.landlock >= 6:
            self.missing.append(
                "processes: no PID namespace; signals scoped to the snippet itself (%s)"
                % ("the filter" if self.scope_signals else "Landlock")
            )
        else:
            self.missing.append(
                "processes: snippets see and may signal the other processes of uid %d" % (NOBODY if self.root else uid)
            )

    def describe(self):
        if self.refused:
            return {"refused": self.refused}
        rlimits = ["RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_CORE"]
        namespaces = list(self.namespaces) + ["ipc"] * bool(self.per_child_ns)
        if self.snippet_uids:
            uid = "%d..%d (a random one per execution)" % (self.snippet_uids[0], sum(self.snippet_uids) - 1)
            privileges = "setuid/setgid to a uid of its own, no supplementary groups, no_new_privs"
        elif self.root:
            uid, privileges = NOBODY, "setuid/setgid to %d, no supplementary groups, no_new_privs" % NOBODY
        elif "user" in self.namespaces:
            uid, privileges = self.config["uid"], "all capabilities dropped, no_new_privs"
        else:
            uid, privileges = self.config["uid"], "unchanged (the caller's uid), no_new_privs"
        if self.filter is not None:
            privileges += ", system-call filter (seccomp)"
        if self.config.get("keyctl") is not None:
            privileges += ", a new session keyring"
        if self.landlock:
            privileges += ", Landlock, fork servers and host not dumpable"
        memory = "RLIMIT_AS per snippet; outside its address space it can hold %s%s; %s" % (
            "the 16 MiB of its /tmp" if self.per_child_ns else "files in its directory (file_kb each)",
            " (the system-call filter denies memfd, System V and POSIX shared memory, keyrings, new user namespaces)"
            if self.filter
            else " and whatever memfd, shared memory, keyrings or mounts hold",
            "a cgroup v2 memory controller is delegated here but not used"
            if self.memory_cgroup
            else "no cgroup v2 memory controller is delegated here",
        )
        if not self.per_child_ns:
            mode = "unisolated (opted in)"
        elif self.root:
            mode = "root (user namespace)" if "user" in self.namespaces else "root"
        else:
            mode = "user namespace"
        return {
            "mode": mode,
            "namespaces": namespaces,
            "uid": uid,
            "privileges": privileges,
            "rlimits": rlimits,
            "missing": self.missing,
            "memory": memory,
            "interpreter": sys.executable,
            "python": "%d.%d.%d" % sys.version_info[:3],
            "root": self.root,
        }

    # -- one execution -------------------------------------------------------------------------------------------
    # The next child is ordered from the zygote ahead of time (`order`, while the current snippet runs): it waits,
    # privileged but running nothing else, for its request on a pipe; then it sets the request's rlimits, drops
    # privileges and runs the snippet. So each snippet still gets a fresh child, and the forks and namespace setup
    # overlap with the previous execution instead of adding to each one's latency.
    def order(self):
        if not self.ordered:
            self.zygote.send(b"f")
            self.ordered = True

    def from_zygote(self, timeout=None):
        """Read the zygote's next message: an exit status goes to `exits`, a new child to `forked`. False on timeout;
        SystemExit when the zygote is gone (the host then replaces this server)."""
        if timeout is not None and not select.select([self.zygote], [], [], max(0.0, timeout))[0]:
            return False
        message, fds, _, _ = socket.recv_fds(self.zygote, 256, 3)
        if not message:
            raise SystemExit("the zygote exited")
        reply = json.loads(message)
        if "exited" in reply:
            self.exits[reply["exited"]] = reply["status"]
        else:
            self.forked = (reply, fds)
        return True

    def receive(self):
        """The ordered child: (pid, request pipe, output pipe, result pipe); OSError when the zygote could not make
        it."""
        self.order()
        while self.forked is None:
            self.from_zygote()
        (reply, fds), self.forked, self.ordered = self.forked, None, False
        self.exits.clear()  # late answers about children killed at their deadline
        if "errno" in reply:
            for fd in fds:
                os.close(fd)
            raise OSError(reply["errno"], reply["error"])
        return (reply["pid"], *fds)

    def run(self, req):
        try:
            pid, req_w, out_r, res_r = self.receive()
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.ENOMEM):
                raise
            return {
                "ok": False,
                "stdout": "",
                "error": "sandbox setup failed: %s" % exc,
                "value_repr": None,
                "duration_s": 0.0,
            }
        workdir, uid = None, NOBODY
        if self.snippet_uids:
            uid = self.snippet_uids[0] + int.from_bytes(os.urandom(4), "little") % self.snippet_uids[1]
        if not self.per_child_ns:  # no private tmpfs: a fresh directory of our own, removed afterwards
            workdir = "/tmp/trl-ext-sandbox-%s" % os.urandom(16).hex()
            os.mkdir(workdir, 0o700)
            if self.root:
                os.chown(workdir, uid, uid)
        req["nonce"], req["workdir"], req["uid"] = os.urandom(16).hex(), workdir, uid
        start = time.monotonic()
        try:
            write_all(req_w, json.dumps(req).encode())
        except OSError:  # the child died while waiting: its exit status tells why
            pass
        os.close(req_w)
        self.order()  # the next child, while this one runs
        try:
            return self.collect(pid, out_r, res_r, req["nonce"], req, start)
        finally:
            if workdir:
                remove_tree(workdir)

    def collect(self, pid, out_r, res_r, nonce, req, start):
        """Read the child's output (capped) and its result until it closes both pipes; kill it on the wall-clock
        timeout. A child that delivered its result is killed and reaped later (by the zygote): its namespaces are
        torn down while the reply is already on its way."""
        deadline = start + req["timeout_s"]
        out, res, error = bytearray(), bytearray(), None
        cap = req["max_output_bytes"]
        open_fds = [out_r, res_r]
        while open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                error = "timeout"
                break
            ready, _, _ = select.select(open_fds, [], [], left)
            for fd in ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    open_fds.remove(fd)
                    os.close(fd)
                elif fd == out_r:
                    out += chunk
                    if len(out) > cap:
                        error = "output too large (over %d bytes)" % cap
                else:
                    res += chunk
                    if len(res) > 6 * req["max_value_bytes"] + 4096:  # JSON escapes a character in <= 6
                        error = "result too large"
            if error:
                break
        for fd in open_fds:
            os.close(fd)
        reply = {
            "ok": False,
            "stdout": bytes(out[:cap]).decode("utf-8", "replace"),
            "error": error,
            "value_repr": None,
        }
        message = None if error else read_message(bytes(res), nonce, req["max_value_bytes"])
        if message is not None:
            reply.update(message)
        elif error is None:  # pipes closed without a result: its exit status says why (within the deadline)
            status = self.wait(pid, deadline)
            if status is None:
                reply["error"] = "timeout"
            else:
                reply.update(self.verdict(status))
                pid = None
        if pid is not None:
            self.kill(pid)
        reply["duration_s"] = time.monotonic() - start
        return reply

    def wait(self, pid, deadline):
        """The child's exit status (asked of the zygote, which reaps it), or None at the deadline."""
        self.zygote.send(b"w%d" % pid)
        while pid not in self.exits:
            if not self.from_zygote(deadline - time.monotonic()):
                return None
        return self.exits.pop(pid)

    @staticmethod
    def verdict(status):
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            if sig == signal.SIGXCPU:
                return {"error": "timeout (CPU time limit)"}
            return {"error": "killed by signal %d" % sig}
        return {"error": "exited with code %d before the end of the snippet" % os.WEXITSTATUS(status)}

    def kill(self, pid):
        """SIGKILL the child: as PID 1 of its namespace its death takes everything it started with it; without a
        PID namespace, its process group."""
        for target in (pid,) if self.per_child_ns else (-pid, pid):
            try:
                os.kill(target, signal.SIGKILL)
            except OSError:
                pass


class Zygote:
    """The process every snippet process is forked from. It is forked from the server before the server reads its
    first request and then receives nothing but one-byte orders, so its memory (which each snippet inherits) holds
    no request, code, output or value of any execution. Per order it forks a child into new mount and PID
    namespaces (and IPC without a filter; the child adds a network namespace itself) with a private tmpfs on /tmp
    (entering them with `unshare` and returning with `setns`, so one fork suffices and the child is PID 1 there)
    and passes the child's pipes to the server over the control socket; the child reads its own request from one of
    them. The zygote reaps its children; the server asks it for an exit status when it needs one (a child that
    ended without a result)."""

    def __init__(self, sock, server):
        self.sock, self.per_child_ns, self.root = sock, server.per_child_ns, server.root
        self.per_child_net = server.per_child_net
        self.filter, self.keyctl = server.filter, server.config.get("keyctl")
        self.scope_signals, self.signal_calls = server.scope_signals, server.config.get("signal_calls", {})
        self.landlock, self.readable = server.landlock, getattr(server, "readable", None)
        self.statuses = {}
        if self.per_child_ns:
            self.own_namespaces = [
                (kind, os.open("/proc/self/ns/" + name, os.O_RDONLY))
                for kind, name in ((CLONE_NEWNS, "mnt"), (CLONE_NEWIPC, "ipc"), (CLONE_NEWPID, "pid"))
            ]

    @classmethod
    def start(cls, server):
        server_end, zygote_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        if os.fork():
            zygote_end.close()
            return server_end
        server_end.close()
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        devnull = os.open("/dev/null", os.O_RDWR)
        os.dup2(devnull, 0), os.dup2(devnull, 1)  # the server's request and reply streams
        os.close(devnull)
        try:
            zygote = cls(zygote_end, server)
            prctl(PR_SET_NO_NEW_PRIVS, 1)  # needed to install a filter without CAP_SYS_ADMIN; the zygote never execs
            # The children's session keyring, fresh and empty, joined here because the filter denies every keyring
            # call: a snippet cannot join more (each join would take a key of its uid's quota) nor use this one.
            join_new_session_keyring(zygote.keyctl)
            failed = None
            if zygote.filter is not None:
                try:
                    zygote.filter.install()
                except OSError as exc:
                    zygote.filter = None
                    zygote.per_child_ns |= CLONE_NEWIPC if zygote.per_child_ns else 0
                    failed = "system-call filter not installed (%s)" % exc.strerror
            zygote_end.send(json.dumps({"filter_failed": failed}).encode())
            zygote.serve()
        finally:
            os._exit(0)

    def serve(self):
        while True:
            order = self.sock.recv(16)
            if not order:  # the server is gone
                return
            if order == b"f":
                self.reap()
                self.spawn()
            else:  # b"w<pid>": the exit status of that child, once it has exited (the server kills it at its deadline)
                pid = int(order[1:])
                status = self.statuses.pop(pid, None)
                if status is None:
                    status = os.waitpid(pid, 0)[1]
                self.sock.send(json.dumps({"exited": pid, "status": status}).encode())

    def reap(self):
        """Collect the children that have exited, keeping the latest statuses: the server asks for at most the one
        of the child it is collecting."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if not pid:
                return
            self.statuses[pid] = status
            if len(self.statuses) > 16:
                del self.statuses[next(iter(self.statuses))]

    def spawn(self):
        fds = []
        try:
            for _ in range(3):
                fds += os.pipe()
            out_r, out_w, res_r, res_w, req_r, req_w = fds
            pid = self.fork_isolated()
        except OSError as exc:
            for fd in fds:
                os.close(fd)
            self.sock.send(json.dumps({"errno": exc.errno, "error": str(exc)}).encode())
            return
        if pid == 0:
            os.close(out_r), os.close(res_r), os.close(req_w)
            self.sock.close()
            child(req_r, out_w, res_w, self)  # never returns
        self.sock.sendmsg(
            [json.dumps({"pid": pid}).encode()],
            [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [req_w, out_r, res_r]))],
        )
        for fd in fds:
            os.close(fd)

    def fork_isolated(self):
        if not self.per_child_ns:
            return os.fork()
        unshare(self.per_child_ns)
        try:
            mount(
                "tmpfs",
                "/tmp",
                "tmpfs",
                MS_NOSUID | MS_NODEV,
                "size=%dk,nr_inodes=1024,mode=0700%s"
                % (TMP_KB, ",uid=%d,gid=%d" % (NOBODY, NOBODY) if self.root else ""),
            )
            pid = os.fork()
        except BaseException:
            self.restore_namespaces()
            raise
        if pid:
            self.restore_namespaces()
        return pid

    def restore_namespaces(self):
        """Back to the zygote's own namespaces; one that cannot return must not fork again (the server, then the
        host, replace it when it exits)."""
        for kind, fd in self.own_namespaces:
            if self.per_child_ns & kind and libc.setns(fd, kind) != 0:
                os._exit(1)


def child(req_r, out_w, res_w, zygote):
    """The snippet's process, in its new namespaces. What does not depend on the request is done before it arrives
    (while the previous snippet runs): /proc, the keyring (without a filter), the descriptors (the system-call
    filter and `no_new_privs` come with the fork). Then it reads its request, sets its limits, drops its privileges
    and runs the snippet."""
    early = None
    try:
        os.setsid()
        if zygote.filter is None:  # one of its own (the filter would deny this: see Zygote.start)
            join_new_session_keyring(zygote.keyctl)
        if zygote.per_child_ns:
            mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        if zygote.per_child_net:
            # A network namespace of its own, so nothing an earlier snippet bound (an abstract Unix socket kept
            # alive by an SCM_RIGHTS cycle) is visible. Made here, not in the zygote: it takes ~0.5 ms, which
            # overlaps with the previous snippet instead of delaying the zygote's next fork.
            unshare(CLONE_NEWNET)
        os.dup2(req_r, REQUEST_FD, inheritable=False)
        devnull = os.open("/dev/null", os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_w, 1)
        os.dup2(out_w, 2)
        os.dup2(res_w, RESULT_FD, inheritable=False)  # not passed on if the snippet exec()s another program
        os.closerange(RESULT_FD + 1, REQUEST_FD)
        os.closerange(REQUEST_FD + 1, 1 << 16)
        req_r, res_w = REQUEST_FD, RESULT_FD
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a too-large file write raises instead of killing
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
        sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
        if "random" in sys.modules:  # loaded by the server's own imports: reseed from the OS, as a fresh run would
            sys.modules["random"].seed()
    except BaseException as exc:
        early = exc
    chunks = []
    while True:
        chunk = os.read(req_r, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    if not chunks:  # the server went away without a request
        os._exit(1)
    req = json.loads(b"".join(chunks))
    nonce = req["nonce"]
    try:
        if early is not None:
            raise early
        os.close(req_r)
        os.chdir(req["workdir"] or "/tmp")
        limit = lambda r, soft, hard=None: resource.setrlimit(r, (soft, soft if hard is None else hard))  # noqa
        cpu = max(1, math.ceil(req["timeout_s"]))
        limit(resource.RLIMIT_CPU, cpu, cpu + 1)
        limit(resource.RLIMIT_AS, req["memory_mb"] << 20)
        limit(resource.RLIMIT_FSIZE, req["file_kb"] << 10)
        limit(resource.RLIMIT_NOFILE, 64)
        limit(resource.RLIMIT_CORE, 0)
        limit(resource.RLIMIT_NPROC, 0)
        limit(resource.RLIMIT_MEMLOCK, 0)
        if zygote.root:  # not before the request: a child waiting for one is not yet a process of that uid
            uid = req["uid"]
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        elif zygote.per_child_ns:
            drop_capabilities()
        os.environ.clear()
        os.environ.update({"HOME": os.getcwd(), "TMPDIR": os.getcwd(), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
        if zygote.landlock:
            landlock(zygote.landlock, zygote.readable, [os.getcwd(), "/dev/null"])
        if zygote.scope_signals and zygote.filter is not None:
            SyscallFilter(signal_scope_filter(os.getpid(), zygote.signal_calls), zygote.filter.seccomp_nr).install()
    except BaseException as exc:
        write_all(res_w, (nonce + json.dumps({"error": "sandbox setup failed: %s" % exc})).encode())
        os._exit(0)
    run_snippet(req["code"], req["result_var"], nonce, req["max_value_bytes"])


def read_message(res, nonce, max_value_bytes):
    """The child's own report (`ok` or its error), or None when it sent none that carries this execution's nonce."""
    if not res.startswith(nonce.encode()):
        return None
    try:
        message = json.loads(res[len(nonce) :].decode())
    except (ValueError, RecursionError):  # the snippet knows its nonce: a deeply nested forgery must not kill us
        return None
    if not isinstance(message, dict):
        return None
    if message.get("error"):
        return {"error": str(message["error"])[:1000]}
    value_repr = message.get("value_repr")
    if value_repr is not None and not (isinstance(value_repr, str) and len(value_repr) <= max_value_bytes):
        return {"error": "unreadable result: not a repr within %d characters" % max_value_bytes}
    return {"ok": True, "error": None, "value_repr": value_repr}


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def remove_tree(path):
    for parent, dirs, files in os.walk(path, topdown=False):
        for name in files:
            os.unlink(os.path.join(parent, name))
        for name in dirs:
            target = os.path.join(parent, name)
            os.unlink(target) if os.path.islink(target) else os.rmdir(target)
    os.rmdir(path)


def run_snippet(code, result_var, nonce, max_value_bytes):
    """Runs in the unprivileged child: execute, then report the error or the value's repr on the result pipe."""
    message = {}
    scope = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(compile(code, "<snippet>", "exec"), scope)
        if result_var is not None:
            if result_var not in scope:
                raise NameError("the snippet did not define %r" % result_var)
            try:
                text = repr(scope[result_var])
                if not isinstance(text, str):
                    raise TypeError("__repr__ returned %s" % type(text).__name__)
            except Exception as exc:
                message["error"] = "unreadable result: repr raised %s: %s" % (type(exc).__name__, exc)
            else:
                if len(text) > max_value_bytes:
                    message["error"] = "unreadable result: repr longer than %d characters" % max_value_bytes
                else:
                    message["value_repr"] = text
    except MemoryError:
        message["error"] = "memory"
    except SystemExit as exc:
        message["error"] = "exit: the snippet called exit(%r)" % (exc.code,)
    except BaseException as exc:
        message["error"] = ("exception: %s: %s" % (type(exc).__name__, exc))[:1000]
    try:
        sys.stdout.flush()
    except BaseException:
        pass
    try:
        payload = (nonce + json.dumps(message)).encode("utf-8", "backslashreplace")
    except BaseException as exc:
        payload = (nonce + json.dumps({"error": "unreadable result: %s" % type(exc).__name__})).encode()
    write_all(RESULT_FD, payload)
    # The server replies once both pipes are closed: closing them here, not at exit, keeps the teardown of this
    # process's memory off the execution's latency.
    os.closerange(0, RESULT_FD + 1)
    os._exit(0)


def main():
    # Started with `-c`: drop the working directory from the import path, as `-I` would.
    sys.path[:] = [p for p in sys.path if p not in ("", ".")]
    server = Server(json.loads(sys.argv[1]) if len(sys.argv) > 1 else {})
    requests, replies = sys.stdin.buffer, sys.stdout
    replies.write(json.dumps(server.describe()) + "\n")
    replies.flush()
    if server.refused:
        return
    server.order()
    for line in requests:
        req = json.loads(line)
        try:
            reply = server.run(req)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.ENOMEM):
                raise
            reply = {
                "ok": False,
                "stdout": "",
                "error": "sandbox could not fork: %s" % exc.strerror,
                "value_repr": None,
                "duration_s": 0.0,
            }
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
