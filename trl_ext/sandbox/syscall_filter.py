"""The system-call filter of every snippet process, compiled here (in the host) with libseccomp.

The fork server runs on an interpreter that may lack this project's dependencies, so it receives the compiled BPF
program as bytes and only installs it. It is installed once, in the zygote, and every snippet process inherits it (a
filter of its own per process would cost each execution ~0.1 ms of CPU to attach and free). Denied, with EPERM (an
ordinary `OSError` for the snippet): what needs no privilege and reaches kernel state beyond the snippet's own
process and limits. New user namespaces (in one, a snippet would hold every capability again and could mount a tmpfs
of any size), and every other new namespace but those the zygote and the child make (mount, PID, IPC, network);
every keyring call (the zygote joins the children's fresh session keyring before it installs the filter: a snippet
that could join more would use up its uid's key quota for the next one); `memfd_create` and System V / POSIX IPC
(memory outside `RLIMIT_AS`); `ptrace`, `process_vm_*` and the other calls that reach other processes; `bpf`,
`perf_event_open`, `userfaultfd`, `io_uring_*`; the mount calls the zygote does not need; what reads or evicts the
host's page cache (a register that outlives executions: `fadvise` with DONTNEED, `preadv2`/`pwritev2` with
RWF_NOWAIT, `readahead`, `mincore`, `cachestat`); sockets of any family but Unix, IPv4 and IPv6 (AF_VSOCK reaches
the hypervisor's host, which no network namespace covers), and in the mode without a network namespace every
`socket()` (only `socketpair(AF_UNIX)` stays). `mount`, `setns` and `unshare` of those namespaces are left to
the kernel's capability check: they need CAP_SYS_ADMIN, which a snippet never has (uid 65534, or all capabilities
dropped, with `no_new_privs`) and, without a new user namespace, cannot get.
"""

from __future__ import annotations

import errno
import os
import tempfile


CLONE_NEW_FLAGS = {
    "CLONE_NEWTIME": 0x80,
    "CLONE_NEWNS": 0x20000,
    "CLONE_NEWCGROUP": 0x2000000,
    "CLONE_NEWUTS": 0x4000000,
    "CLONE_NEWIPC": 0x8000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
ZYGOTE_NAMESPACES = ("CLONE_NEWNS", "CLONE_NEWIPC", "CLONE_NEWPID", "CLONE_NEWNET")  # the zygote's, per child
# keyctl's number per architecture (`uname -m`), so that the fork server replaces the inherited session keyring even
# where libseccomp (which knows every number) is missing.
KEYCTL_NUMBERS = {
    "x86_64": 250,
    "aarch64": 219,
    "riscv64": 219,
    "loongarch64": 219,
    "i386": 288,
    "i686": 288,
    "armv7l": 311,
    "armv6l": 311,
    "ppc64le": 271,
    "ppc64": 271,
    "s390x": 280,
}
# The calls that signal a process: the fork server scopes them per child where nothing else does.
SIGNAL_CALLS = ("kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "pidfd_open", "pidfd_send_signal")
AF_UNIX, AF_INET, AF_INET6 = 1, 2, 10
SOCKET_FAMILIES = (AF_UNIX, AF_INET, AF_INET6)  # what a snippet may create (no AF_VSOCK, AF_NETLINK, AF_PACKET...)
RWF_NOWAIT = 0x8
# posix_fadvise's DONTNEED (6 on s390x); fadvise64's advice is its fourth argument on 64-bit architectures.
FADV_DONTNEED = 6 if os.uname().machine == "s390x" else 4
DENIED = (
    # mounts (beyond the zygote's own)
    "umount2",
    "pivot_root",
    "chroot",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    # keyrings
    "add_key",
    "request_key",
    "keyctl",
    # the page cache as a register between executions (fadvise64 and preadv2/pwritev2: see _build)
    "readahead",
    "mincore",
    "cachestat",
    # memory that RLIMIT_AS does not count
    "memfd_create",
    "memfd_secret",
    "shmget",
    "shmat",
    "msgget",
    "msgsnd",
    "semget",
    "mq_open",
    # other processes and large kernel interfaces
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "process_madvise",
    "pidfd_getfd",
    "kcmp",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "fanotify_init",
    "open_by_handle_at",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "acct",
    "quotactl",
    "swapon",
    "swapoff",
    "syslog",
    "vhangup",
    "lookup_dcookie",
)


def keyctl_number() -> int | None:
    """keyctl's number on this machine: from the table, else from libseccomp, else None."""
    if os.uname().machine in KEYCTL_NUMBERS:
        return KEYCTL_NUMBERS[os.uname().machine]
    try:
        import pyseccomp as seccomp

        number = seccomp.resolve_syscall(seccomp.Arch.NATIVE, "keyctl")
    except (ImportError, OSError, RuntimeError):
        return None
    return number if number >= 0 else None


def compile_filter() -> tuple[dict[str, bytes] | None, dict[str, int], str | None]:
    """({"network": BPF program, "no network": BPF program}, the numbers of `seccomp` and the signal calls, None), or
    (None, {}, why no filter can be built here). "no network" is for fork servers without a network namespace: it
    also denies `socket()`."""
    try:
        import pyseccomp as seccomp
    except (ImportError, OSError, RuntimeError) as exc:  # RuntimeError: libseccomp.so.2 not found
        return None, {}, f"no system-call filter: libseccomp unavailable ({exc})"
    try:
        programs = {"network": _build(seccomp, network=True), "no network": _build(seccomp, network=False)}
    except OSError as exc:
        return None, {}, f"no system-call filter: libseccomp failed ({exc})"
    number = lambda name: seccomp.resolve_syscall(seccomp.Arch.NATIVE, name)  # noqa: E731
    signal_calls = {name: number(name) for name in SIGNAL_CALLS}
    return programs, {"seccomp": number("seccomp"), "signal_calls": signal_calls}, None


def _build(seccomp, network: bool) -> bytes:
    rules = seccomp.SyscallFilter(seccomp.ALLOW)
    try:  # a binary tree: each allowed call passes a few tests, not all (libseccomp >= 2.5)
        rules.set_attr(seccomp.Attr.CTL_OPTIMIZE, 2)
    except OSError:
        pass
    number = lambda name: seccomp.resolve_syscall(seccomp.Arch.NATIVE, name)  # noqa: E731 - negative: not here
    deny = seccomp.ERRNO(errno.EPERM)
    for name in DENIED:
        if number(name) >= 0:
            rules.add_rule(deny, number(name))
    for name, flag in CLONE_NEW_FLAGS.items():
        rules.add_rule(deny, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
        if name not in ZYGOTE_NAMESPACES:
            rules.add_rule(deny, "unshare", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    # clone3 passes its flags in memory, which a filter cannot read: ENOSYS makes the C library fall back to clone.
    if number("clone3") >= 0:
        rules.add_rule(seccomp.ERRNO(errno.ENOSYS), number("clone3"))
    # Evicting a page of a world-readable file writes a bit that later executions read back (RWF_NOWAIT fails with
    # EAGAIN on a page that is not cached); an int argument is compared on its low 32 bits, as the kernel reads it.
    low = 0xFFFFFFFF
    if os.uname().machine in ("x86_64", "aarch64", "riscv64", "loongarch64", "ppc64le", "ppc64", "s390x"):
        rules.add_rule(deny, "fadvise64", seccomp.Arg(3, seccomp.MASKED_EQ, low, FADV_DONTNEED))
    else:  # 32-bit: the advice moves with the split offsets; the whole call goes
        for name in ("fadvise64", "fadvise64_64", "arm_fadvise64_64"):
            if number(name) >= 0:
                rules.add_rule(deny, number(name))
    for name in ("preadv2", "pwritev2"):
        rules.add_rule(deny, name, seccomp.Arg(5, seccomp.MASKED_EQ, RWF_NOWAIT, RWF_NOWAIT))
    # Socket families by an allow list: every family number outside it is denied (a value above the largest allowed
    # one, high bits set included, or one of the gaps below it).
    no_family = seccomp.ERRNO(errno.EAFNOSUPPORT)
    families = {"socketpair": SOCKET_FAMILIES if network else (AF_UNIX,)}
    if network:
        families["socket"] = SOCKET_FAMILIES
    else:
        rules.add_rule(deny, "socket")
    for name, allowed in families.items():
        rules.add_rule(no_family, name, seccomp.Arg(0, seccomp.GT, max(allowed)))
        for family in range(max(allowed)):
            if family not in allowed:
                rules.add_rule(no_family, name, seccomp.Arg(0, seccomp.EQ, family))
    with tempfile.TemporaryFile() as out:
        rules.export_bpf(out)
        out.seek(0)
        return out.read()
