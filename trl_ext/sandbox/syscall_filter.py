"""The system-call filter of every snippet process, compiled here (in the host) with libseccomp.

The fork server runs on an interpreter that may lack this project's dependencies, so it receives the compiled BPF
program as bytes and only installs it. It is installed once, in the zygote, and every snippet process inherits it
(a filter of its own per process would cost each execution ~0.1 ms of CPU to attach and free). Denied, with EPERM
(an ordinary `OSError` for the snippet): what needs no privilege and reaches kernel state beyond the snippet's own
process and limits. New user namespaces (in one, a snippet would hold every capability again and could mount a tmpfs
of any size), and every other new namespace but the three the zygote makes for each child; keyrings (the inherited
session keyring, the uid's user keyring, a channel between snippets) except joining a new anonymous session keyring,
which each child does first; `memfd_create` and System V / POSIX IPC (memory outside `RLIMIT_AS`); `ptrace`,
`process_vm_*` and the other calls that reach other processes; `bpf`, `perf_event_open`, `userfaultfd`,
`io_uring_*`; the mount calls the zygote does not need. `mount`, `setns` and `unshare` of mount, PID and IPC
namespaces (the zygote's own work) are left to the kernel's capability check: they need CAP_SYS_ADMIN, which a
snippet never has (uid 65534, or all capabilities dropped, with `no_new_privs`) and, without a new user namespace,
cannot get.
"""

from __future__ import annotations

import errno
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
ZYGOTE_NAMESPACES = ("CLONE_NEWNS", "CLONE_NEWIPC", "CLONE_NEWPID")  # unshared by the zygote for each child
KEYCTL_JOIN_SESSION_KEYRING = 1
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
    # keyrings (keyctl: see below)
    "add_key",
    "request_key",
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


def compile_filter() -> tuple[bytes | None, dict[str, int], str | None]:
    """(BPF program, the numbers of the `keyctl` and `seccomp` system calls, None), or (None, {}, why no filter can be
    built here)."""
    try:
        import pyseccomp as seccomp
    except (ImportError, OSError, RuntimeError) as exc:  # RuntimeError: libseccomp.so.2 not found
        return None, {}, f"no system-call filter: libseccomp unavailable ({exc})"
    try:
        program = _build(seccomp)
    except OSError as exc:
        return None, {}, f"no system-call filter: libseccomp failed ({exc})"
    return program, {name: seccomp.resolve_syscall(seccomp.Arch.NATIVE, name) for name in ("keyctl", "seccomp")}, None


def _build(seccomp) -> bytes:
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
    # keyctl only to join a new anonymous session keyring (a name would let processes of the uid share one).
    rules.add_rule(deny, "keyctl", seccomp.Arg(0, seccomp.NE, KEYCTL_JOIN_SESSION_KEYRING))
    rules.add_rule(deny, "keyctl", seccomp.Arg(1, seccomp.NE, 0))
    # clone3 passes its flags in memory, which a filter cannot read: ENOSYS makes the C library fall back to clone.
    if number("clone3") >= 0:
        rules.add_rule(seccomp.ERRNO(errno.ENOSYS), number("clone3"))
    with tempfile.TemporaryFile() as out:
        rules.export_bpf(out)
        out.seek(0)
        return out.read()
