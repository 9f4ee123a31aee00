"""The system-call filter of every snippet process, compiled here (in the host) with libseccomp.

The fork server runs on an interpreter that may lack this project's dependencies, so it receives the compiled BPF
program as bytes and only installs it (`prctl(PR_SET_SECCOMP)`). The filter allows everything except the calls that
reach kernel state beyond the snippet's own process and limits: namespaces and mounts (a nested user namespace
could mount a tmpfs of any size), keyrings (the inherited session keyring and the uid's user keyring, a channel
between snippets), `memfd_create` and System V / POSIX IPC (memory outside `RLIMIT_AS`), and the interfaces with a
history of kernel bugs or that reach other processes (`bpf`, `perf_event_open`, `userfaultfd`, `io_uring_*`,
`ptrace`, `process_vm_*`). Denied calls fail with EPERM, so the snippet sees an ordinary `OSError`.
"""

from __future__ import annotations

import errno
import tempfile


CLONE_NEW_FLAGS = {"CLONE_NEWTIME": 0x80, "CLONE_NEWNS": 0x20000, "CLONE_NEWCGROUP": 0x2000000,
                   "CLONE_NEWUTS": 0x4000000, "CLONE_NEWIPC": 0x8000000, "CLONE_NEWUSER": 0x10000000,
                   "CLONE_NEWPID": 0x20000000, "CLONE_NEWNET": 0x40000000}
DENIED = (
    # namespaces and mounts
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen", "fsconfig",
    "fsmount", "fspick", "mount_setattr",
    # keyrings
    "add_key", "request_key", "keyctl",
    # memory that RLIMIT_AS does not count
    "memfd_create", "memfd_secret", "shmget", "shmat", "msgget", "msgsnd", "semget", "mq_open",
    # other processes and large kernel interfaces
    "ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "pidfd_getfd", "kcmp", "bpf",
    "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register", "fanotify_init",
    "open_by_handle_at", "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "acct",
    "quotactl", "swapon", "swapoff", "syslog", "vhangup", "lookup_dcookie",
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
    for name in DENIED:
        if number(name) >= 0:
            rules.add_rule(seccomp.ERRNO(errno.EPERM), number(name))
    for flag in CLONE_NEW_FLAGS.values():
        rules.add_rule(seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    # clone3 passes its flags in memory, which a filter cannot read: ENOSYS makes the C library fall back to clone.
    if number("clone3") >= 0:
        rules.add_rule(seccomp.ERRNO(errno.ENOSYS), number("clone3"))
    with tempfile.TemporaryFile() as out:
        rules.export_bpf(out)
        out.seek(0)
        return out.read()
