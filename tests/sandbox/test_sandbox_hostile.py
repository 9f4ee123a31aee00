"""Hostile snippets against `trl_ext.sandbox`: each one must fail with a reason and leave no trace outside.

Containment is checked from the outside, after every case, against targets set up before the first one: sentinel
files (a root-owned 0600 secret, a file in a world-writable directory, the project's own files) keep their bytes and
modes and gain no neighbours, listeners on 127.0.0.1, on a Unix socket and in the abstract namespace are never
contacted, a process of the sandbox's own uid running on the host survives every kill attempt, no process is left
running as that uid, and the caller (this test process) is alive.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from trl_ext.sandbox import SandboxPool, execute, isolation
from trl_ext.sandbox.pool import Limits, default_pool


ROOT = os.getuid() == 0
NOBODY = 65534
SANDBOX_UID = NOBODY if ROOT else os.getuid()  # the uid snippets run as
REPO = Path(__file__).resolve().parents[2]
# A checkout under a directory the sandbox replaces (its private /tmp) or hides is invisible to snippets: attacks on
# it then fail with FileNotFoundError, and the sentinels go to /srv, which snippets see read-only like any host path.
REPO_HIDDEN = any(REPO.is_relative_to(p) for p in ("/tmp", "/var/tmp", "/dev/shm", "/run"))
# A checkout below a private directory (e.g. `mktemp -d`'s 0700) is out of the snippets' reach when they run as
# another uid: sentinels put there could not be read even where the sandbox should allow it.
REPO_REACHABLE = SANDBOX_UID == os.getuid() or all(p.stat().st_mode & stat.S_IXOTH for p in (REPO, *REPO.parents))
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox needs Linux namespaces and rlimits")


def kernel_allows_namespaces() -> bool:
    """An oracle independent of the sandbox: can util-linux's unshare(1) create the namespaces here, directly or
    (not root, or root without CAP_SYS_ADMIN as in a default container) in a new user namespace? Where it can, the
    sandbox must use them."""
    cmd = ["unshare", "--net", "--mount", "--pid", "--ipc", "--fork"]
    try:
        return any(
            subprocess.run([*cmd, *user, "true"], capture_output=True, timeout=30).returncode == 0
            for user in ([[], ["--user", "--map-root-user"]] if ROOT else [["--user", "--map-root-user"]])
        )
    except FileNotFoundError:
        return True


NAMESPACES = kernel_allows_namespaces()
needs_namespaces = pytest.mark.skipif(
    not NAMESPACES, reason="the kernel refuses namespaces here: rlimits-only sandbox"
)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def file_state(base: Path) -> dict[str, tuple[int, str | None]]:
    """Mode and content hash of everything under the sentinel directory (new files included) and of the project files
    the snippets attack."""
    paths = [base, *base.rglob("*"), REPO / "README.md", REPO / "setup.cfg", Path(__file__)]
    state = {}
    for path in paths:
        mode = path.lstat().st_mode
        state[str(path)] = (mode, digest(path) if stat.S_ISREG(mode) else None)
    return state


def contacted(sockets: dict[str, socket.socket]) -> list[str]:
    """The listeners that got a connection or a datagram since the last look; what they got is consumed, so that
    one case's contact is not blamed on the next."""
    reached = []
    for name, sock in sockets.items():
        while True:
            try:
                sock.recv(65536) if name == "udp" else sock.accept()[0].close()
            except BlockingIOError:
                break
            reached.append(name)
    return reached


# The targets outside the sandbox are set up before the first case (autouse, module scope) and checked after every
# case (`contained`), so damage is caught whichever case does it.
@pytest.fixture(scope="module", autouse=True)
def sentinels():
    """Files the snippets attack. They live inside the project (visible to the sandbox, unlike /tmp; /srv when the
    project itself is under /tmp or below a directory the snippets' uid cannot enter): a root-owned 0600 secret, a
    world-readable file, and a world-writable directory with a world-writable file in it."""
    parent = Path("/srv") if REPO_HIDDEN or not REPO_REACHABLE else REPO
    parent.mkdir(exist_ok=True)
    base = parent / f".sandbox-sentinels-{uuid.uuid4().hex[:8]}"
    base.mkdir(mode=0o755)
    os.chmod(base, 0o755)
    (base / "secret.txt").write_text("TOP SECRET")
    os.chmod(base / "secret.txt", 0o600)
    (base / "public.txt").write_text("public")
    os.chmod(base / "public.txt", 0o644)
    (base / "open").mkdir()
    os.chmod(base / "open", 0o777)
    (base / "open" / "victim.txt").write_text("victim")
    os.chmod(base / "open" / "victim.txt", 0o666)
    yield base
    shutil.rmtree(base)


@pytest.fixture(scope="module", autouse=True)
def sentinel_state(sentinels):
    """The sentinels' state before the first case; `contained` moves it on after a case that changed them, so that
    the next case is not blamed too."""
    return {"expected": file_state(sentinels)}


@pytest.fixture(scope="module", autouse=True)
def listener_sockets():
    """A TCP and a UDP listener on 127.0.0.1, a Unix socket in /tmp and one in the abstract namespace."""
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(8)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    unix_path = f"/tmp/trl-ext-sandbox-test-{uuid.uuid4().hex[:8]}.sock"
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(unix_path)
    os.chmod(unix_path, 0o777)
    unix.listen(8)
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract.bind(f"\0trl-ext-sandbox-test-{uuid.uuid4().hex[:8]}")
    abstract.listen(8)
    socks = {"tcp": tcp, "udp": udp, "unix": unix, "abstract": abstract}
    for sock in socks.values():
        sock.setblocking(False)
    yield socks
    for sock in socks.values():
        sock.close()
    os.unlink(unix_path)


@pytest.fixture(scope="module")
def listeners(listener_sockets):
    """Their addresses, as a snippet would use them."""
    return {
        name: sock.getsockname()[1] if name in ("tcp", "udp") else sock.getsockname()
        for name, sock in listener_sockets.items()
    }


@pytest.fixture(scope="module", autouse=True)
def bystander():
    """A host process running as the sandbox's uid (only root can start one): a snippet must not be able to signal
    it."""
    if not ROOT:
        yield None
        return
    proc = subprocess.Popen(["sleep", "300"], user=NOBODY, group=NOBODY, extra_groups=[])
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture(autouse=True)
def contained(sentinels, sentinel_state, listener_sockets, bystander):
    """After every case: no process of the snippets' uid is left running under the caller (other than the bystander;
    a zombie awaiting its reaping runs nothing), the bystander lives, the sentinel files are as they were, no listener
    was contacted, and the caller is alive (trivially, we run)."""
    yield
    if not ROOT:  # the fork servers run as our uid too: end them, then nothing of that uid may remain
        default_pool().close()
    deadline = time.monotonic() + 5.0
    while True:
        left = []
        for proc in psutil.Process().children(recursive=True):  # the fork servers and whatever runs under them
            try:
                if (
                    proc.uids().real == SANDBOX_UID
                    and proc.status() != psutil.STATUS_ZOMBIE
                    and proc.cmdline() != ["sleep", "300"]
                ):
                    left.append(proc.pid)
            except psutil.NoSuchProcess:
                pass
        if not left or time.monotonic() > deadline:  # a child killed after its reply may still be exiting
            break
        time.sleep(0.05)
    now, expected = file_state(sentinels), sentinel_state["expected"]
    sentinel_state["expected"] = now
    breaches = {
        "processes left running": left,
        "bystander killed": bystander is not None and bystander.poll() is not None,
        "sentinel files changed, added or removed": sorted(
            p for p in now.keys() | expected.keys() if now.get(p) != expected.get(p)
        ),
        "listeners reached": contacted(listener_sockets),
    }
    assert not any(breaches.values()), breaches


def fails(code: str, *reasons: str, timeout_s: float = 2.0, memory_mb: int = 256, **kwargs):
    result = execute(code, timeout_s=timeout_s, memory_mb=memory_mb, **kwargs)
    assert not result.ok, result
    assert result.error, result
    assert any(reason in result.error for reason in reasons), result
    return result


# -- processes ----------------------------------------------------------------------------------------------------
def test_fork_bomb():
    fails("import os\nwhile True:\n    os.fork()", "BlockingIOError", "Resource temporarily unavailable")


def test_fork_then_spin():
    fails("import os\nif os.fork() == 0:\n    while True: pass", "BlockingIOError")


def test_os_system():
    fails("import os\nassert os.system('touch /tmp/pwned; id') == 0, 'os.system failed'", "os.system failed")


def test_subprocess_run():
    fails("import subprocess\nsubprocess.run(['id'])", "BlockingIOError", "OSError")


def test_subprocess_shell_pipeline():
    fails("import subprocess\nsubprocess.Popen('yes | head', shell=True).wait()", "BlockingIOError", "OSError")


def test_posix_spawn():
    fails("import os\nos.posix_spawn('/bin/sh', ['sh', '-c', 'id'], {})", "BlockingIOError", "OSError")


def test_thread_bomb():
    fails(
        "import threading\nfor _ in range(100):\n    threading.Thread(target=lambda: None).start()",
        "can't start new thread",
    )


@needs_namespaces
def test_exec_replaces_the_interpreter_without_forging_a_result(sentinels):
    # exec() is not a new process. The kernel may refuse it (EAGAIN: the uid is over RLIMIT_NPROC); if the shell
    # runs, it runs as nobody in the namespaces, the result pipe is closed on exec so no value can come back, and its
    # writes land on the private tmpfs or fail.
    fails(
        f"import os\nos.execv('/bin/sh', ['sh', '-c', 'echo pwned > {sentinels}/open/victim.txt; echo x > /tmp/x'])",
        "before the end",
        "BlockingIOError",
    )


def test_setuid_binary_gains_nothing():
    # no_new_privs and nosuid mounts: a set-user-ID program does not run as root.
    fails("import os\nos.execv('/bin/su', ['su', '-c', 'id'])", "before the end", "BlockingIOError")


def test_daemon_double_fork():
    fails(
        "import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        import time\n"
        "        time.sleep(300)",
        "BlockingIOError",
    )


@needs_namespaces
def test_kill_every_process_it_can(bystander):
    if bystander is None:
        pytest.skip("needs root to start a process as uid 65534")
    # kill(-1) and a sweep over PIDs reach only the snippet's own PID namespace: the bystander (same uid) survives.
    fails(
        f"import os, signal\nos.kill(-1, signal.SIGKILL)\nfor pid in range(2, 4096):\n    try:\n"
        f"        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\nos.kill({bystander.pid}, 9)",
        "ProcessLookupError",
    )
    assert bystander.poll() is None


@needs_namespaces
def test_kill_the_parent():
    # The parent is outside the PID namespace (getppid() is 0): kill(0) signals the snippet's own group only, where
    # it is PID 1 and immune to its own signals.
    fails("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nraise RuntimeError('still here')", "still here")
    fails(f"import os\nos.kill({os.getpid()}, 9)", "ProcessLookupError")
    assert execute("x = 1").ok  # the fork server is still serving


def test_close_the_pipes_and_linger():
    # Nothing to read any more, but the snippet is still running: it is waited for until its deadline, then killed.
    result = fails(
        "import os, time\nfor fd in (1, 2, 3):\n    os.close(fd)\ntime.sleep(300)", "timeout", timeout_s=1.0
    )
    assert result.duration_s < 5.0  # killed at 1 s, not after 300


@needs_namespaces
def test_stop_itself():
    # SIGSTOP from inside its own PID namespace does not stop its init: the wall clock would catch it anyway.
    fails(
        "import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)\nraise RuntimeError('not stopped')",
        "not stopped",
        "timeout",
        timeout_s=1.0,
    )


# -- earlier executions ---------------------------------------------------------------------------------------------
# What a snippet can find in its own process: its call stack, and every readable byte of its memory (/proc/self/mem,
# after making itself dumpable again). Hex digits after the marker are what other executions would have left.
SCAN_MEMORY = """
import ctypes, re, sys
ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: /proc/self/mem readable by the snippet's own uid
pattern = re.compile(rb'trl-ext-' + rb'leak-([0-9a-f]{32})')
found = set()
frame = sys._getframe()
while frame is not None:
    found.update(m.decode() for m in pattern.findall(repr(frame.f_locals).encode()))
    frame = frame.f_back
with open('/proc/self/maps') as maps, open('/proc/self/mem', 'rb', 0) as mem:
    for line in maps:
        span, perms = line.split()[:2]
        if not perms.startswith('r') or '[v' in line:
            continue
        low, high = (int(x, 16) for x in span.split('-'))
        try:
            mem.seek(low)
            data = mem.read(high - low)
        except (OSError, OverflowError, MemoryError):
            continue
        found.update(m.decode() for m in pattern.findall(data))
        del data
result = sorted(found)
"""


def test_nothing_of_earlier_executions_is_in_memory():
    # A secret in the code, the output and the value of one execution; then 50 others, then the scan. The fork
    # server has held all of them; the process snippets are forked from never has.
    secret = uuid.uuid4().hex
    pool = SandboxPool()
    try:
        first = pool.run(f"token = 'trl-ext-leak-{secret}'\nprint(token)\nresult = token", "result", Limits())
        assert first.ok and secret in first.value
        for i in range(50):
            assert pool.run(f"result = {i}", "result", Limits()).ok
        for _ in range(2):  # the next execution, and the one after (its child was forked while the scan ran)
            scan = pool.run(SCAN_MEMORY, "result", Limits(timeout_s=20.0, memory_mb=2048))
            assert scan.ok, scan
            assert secret not in scan.value
    finally:
        pool.close()


# -- kernel objects shared beyond the snippet (system-call filter) ------------------------------------------------
def syscall_number(name: str) -> int:
    import pyseccomp

    return pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name)


def test_the_callers_session_keyring_is_out_of_reach():
    # A secret in this process's session keyring (Kerberos caches, keyctl secrets live there): a snippet inherits
    # possession of it unless it gets a keyring of its own, and possession grants access whatever the uid.
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    description = f"trl-ext-test-{uuid.uuid4().hex[:8]}".encode()
    key = libc.syscall(syscall_number("add_key"), b"user", description, b"hunter2", 7, -3)  # KEY_SPEC_SESSION_KEYRING
    if key < 0:
        pytest.skip(f"no session keyring here ({os.strerror(ctypes.get_errno())})")
    pool = SandboxPool()  # started after the key, as a trainer's sandbox starts after login gave it its keyring
    try:
        keyctl = syscall_number("keyctl")
        result = pool.run(
            f"import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            f"buf = ctypes.create_string_buffer(64)\n"
            f"found = libc.syscall({keyctl}, 10, -3, b'user', {description!r}, 0)\n"  # KEYCTL_SEARCH
            f"n = libc.syscall({keyctl}, 11, {key}, buf, 64)\n"  # KEYCTL_READ
            f"result = (found, buf.raw[:max(n, 0)])",
            "result",
            Limits(),
        )
        assert result.ok and result.value[0] < 0 and b"hunter2" not in result.value[1], result
    finally:
        pool.close()
        libc.syscall(syscall_number("keyctl"), 3, key)  # KEYCTL_REVOKE


def test_the_uids_user_keyring_is_not_a_channel():
    # Every process of the uid shares its user keyring: a program that writes there can behave differently on its
    # next run (pass a two-run determinism check, then grade 1, 0, 1, 0).
    add_key, keyctl = syscall_number("add_key"), syscall_number("keyctl")
    fails(
        f"import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        f"assert libc.syscall({add_key}, b'user', b'trl-ext-counter', b'1', 1, -4) >= 0, 'add_key refused'",
        "add_key refused",
    )  # KEY_SPEC_USER_KEYRING
    # Nor a named session keyring, which every process of the uid could join.
    fails(
        f"import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        f"assert libc.syscall({keyctl}, 1, b'trl-ext-channel') >= 0, 'join refused'",
        "join refused",
    )


def test_no_nested_namespaces_or_memory_outside_the_limit():
    # A nested user namespace may mount a tmpfs of any size; memfd and System V shared memory are not counted by
    # RLIMIT_AS either.
    fails(
        "import ctypes\nlibc = ctypes.CDLL('libc.so.6', use_errno=True)\n"
        "assert libc.unshare(0x10000000 | 0x00020000) == 0, 'unshare refused'",
        "unshare refused",
    )
    fails("import os\nos.memfd_create('x')", "PermissionError")
    fails(
        "import ctypes\nlibc = ctypes.CDLL('libc.so.6', use_errno=True)\n"
        "assert libc.shmget(0, 1 << 30, 0o1600) >= 0, 'shmget refused'",
        "shmget refused",
    )
    for name in ("bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "ptrace", "process_vm_readv"):
        fails(
            f"import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall({syscall_number(name)}, 0, 0, 0, 0, 0)\n"
            f"assert ctypes.get_errno() != 1, 'EPERM'",
            "EPERM",
        )


STDLIB_PROGRAMS = [
    "import json\nresult = json.loads(json.dumps({'a': [1, 2.5, None, True], 'b': 'é'}))",
    "import re\nresult = re.findall(r'(\\w+)@(\\w+)', 'a@b c@d') + [re.sub('[aeiou]', '', 'sandbox')]",
    "import itertools\nresult = list(itertools.permutations('abc', 2)) + list(itertools.accumulate(range(6)))",
    "import collections\nresult = collections.Counter('mississippi').most_common(2) + list(collections.deque([1, 2], 2))",
    "import math\nresult = (math.gcd(84, 36), math.comb(20, 7), math.isqrt(10**20 + 1), math.factorial(30))",
    "import dataclasses\n@dataclasses.dataclass(order=True)\nclass P:\n    x: int\n    y: int = 0\n"
    "result = sorted(dataclasses.astuple(p) for p in [P(2, 1), P(1, 5)])",
    "import functools\n@functools.lru_cache(None)\ndef fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"
    "result = (fib(90), functools.reduce(lambda a, b: a * b, range(1, 15)))",
    "import heapq\nh = [5, 1, 8, 3, 2]\nheapq.heapify(h)\nresult = [heapq.heappop(h) for _ in range(3)] + heapq.nlargest(2, h)",
    "import decimal\ndecimal.getcontext().prec = 40\nresult = str(decimal.Decimal(2).sqrt())",
    "import fractions\nresult = str(sum(fractions.Fraction(1, n) for n in range(1, 20)))",
    "import datetime\nd = datetime.date(2024, 2, 28) + datetime.timedelta(days=2)\n"
    "result = (d.isoformat(), d.weekday(), datetime.datetime(2024, 1, 1, 12).strftime('%A %H:%M'))",
    "result = ('%5.2f|%-4s|%x' % (3.14159, 'ab', 255), '{:>8,}'.format(1234567), f'{0.5:.1%}', format(7, '08b'))",
    "import sys\nsys.setrecursionlimit(5000)\ndef depth(n):\n    return 0 if n == 0 else 1 + depth(n - 1)\n"
    "result = depth(3000)",
    "import random\nrandom.seed(3)\nresult = (random.randint(1, 100), random.sample(range(50), 3))",
    "import string, textwrap, bisect, operator, copy, typing, statistics\n"
    "result = (string.ascii_lowercase[:5], textwrap.wrap('a b c d e f', 5), bisect.bisect([1, 3, 5], 4), "
    "statistics.median([3, 1, 2]))",
]


@pytest.mark.parametrize("code", STDLIB_PROGRAMS)
def test_standard_library_behaves_as_without_the_filter(code):
    scope = {"__name__": "__main__"}
    exec(compile(code, "<snippet>", "exec"), scope)
    result = execute(code, result_var="result", timeout_s=10.0)
    assert result.ok, result
    assert result.value == scope["result"]


def test_joining_session_keyrings_cannot_use_up_the_uids_key_quota():
    # Each anonymous join creates a keyring charged to the uid's key quota (200 keys for a non-root uid): 200 joins in
    # one execution would leave the next one with none. Only the zygote joins (before its filter is installed).
    keyctl = syscall_number("keyctl")
    fails(
        f"import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        f"joined = sum(libc.syscall({keyctl}, 1, None) >= 0 for _ in range(200))\n"
        f"assert joined == 200, f'{{joined}} joins'",
        "AssertionError: 0 joins",
    )
    fails(
        f"import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        f"assert libc.syscall({keyctl}, 1, None) >= 0, 'join refused'",
        "join refused",
    )


# -- the page cache: a register between executions ------------------------------------------------------------------
def page_cached(path: Path) -> bool:
    """Whether the first page of `path` is in the page cache (a read that must not wait for the disk)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.preadv(fd, [bytearray(1)], 0, os.RWF_NOWAIT)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_the_page_cache_is_not_a_register(sentinels):
    # Evicting a page of any world-readable file (fadvise DONTNEED) writes a bit that a later execution, another
    # pool or another server reads back (a read with RWF_NOWAIT fails on a page that is not cached): a program
    # passes the two-run determinism check, then answers differently.
    public = sentinels / "public.txt"
    public.read_bytes()
    try:
        assert page_cached(public)
    except OSError as exc:  # EOPNOTSUPP: this file system cannot read without waiting
        pytest.skip(f"RWF_NOWAIT reads are not supported on the sentinels' file system ({exc})")
    write = fails(
        f"import os\nfd = os.open({str(public)!r}, os.O_RDONLY)\nos.pread(fd, 1, 0)\n"
        f"os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)",
        "PermissionError",
    )
    assert page_cached(public), write  # the bit was not written
    fd = os.open(public, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # the host clears the bit itself: can a snippet read it?
    os.close(fd)
    fails(
        f"import os\nfd = os.open({str(public)!r}, os.O_RDONLY)\n"
        f"try:\n    os.preadv(fd, [bytearray(1)], 0, os.RWF_NOWAIT)\n    result = 'cached'\n"
        f"except BlockingIOError:\n    result = 'evicted'",
        "PermissionError",
        result_var="result",
    )


def test_no_other_call_reads_or_evicts_the_page_cache(sentinels):
    public = str(sentinels / "public.txt")
    calls = {
        "readahead": "ret = libc.syscall(nr, fd, ctypes.c_long(0), ctypes.c_size_t(4096))",
        "mincore": "m = mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)\n"
        "vec = ctypes.create_string_buffer(1)\n"
        "ret = libc.syscall(nr, ctypes.c_void_p(ctypes.addressof(ctypes.c_char.from_buffer(m))), len(m), vec)",
        "cachestat": "ret = libc.syscall(nr, fd, ctypes.create_string_buffer(16), ctypes.create_string_buffer(64), 0)",
        "pwritev2": "out = os.open('own', os.O_WRONLY | os.O_CREAT)\n"
        "ret = libc.syscall(nr, out, ctypes.create_string_buffer(16), 0, 0, 0, 8)",  # RWF_NOWAIT
    }
    for name, call in calls.items():
        number = syscall_number(name) if name != "cachestat" else 451  # the same number on every architecture
        fails(
            f"import ctypes, mmap, os\nlibc = ctypes.CDLL(None, use_errno=True)\nnr = {number}\n"
            f"fd = os.open({public!r}, os.O_RDONLY)\n{call}\n"
            f"assert ret == -1 and ctypes.get_errno() == 1, '{name}: %d, errno %d' % (ret, ctypes.get_errno())\n"
            f"raise PermissionError('{name} refused')",
            f"PermissionError: {name} refused",
        )
    # Other advice stays allowed (what programs use posix_fadvise for).
    result = execute(
        f"import os\nfd = os.open({public!r}, os.O_RDONLY)\nos.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)\n"
        f"os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)\nresult = os.preadv(fd, [bytearray(2)], 0)",
        result_var="result",
    )
    assert result.ok and result.value == 2, result


# -- network ------------------------------------------------------------------------------------------------------
@needs_namespaces
def test_tcp_to_local_listener(listeners):
    fails(f"import socket\nsocket.create_connection(('127.0.0.1', {listeners['tcp']}), timeout=1)", "OSError")


@needs_namespaces
def test_udp_to_local_listener(listeners):
    fails(
        f"import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        f"s.sendto(b'hello', ('127.0.0.1', {listeners['udp']}))",
        "OSError",
    )


@needs_namespaces
def test_unix_socket_in_tmp(listeners):
    fails(f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({listeners['unix']!r})", "FileNotFoundError")


@needs_namespaces
def test_abstract_unix_socket(listeners):
    fails(
        f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({listeners['abstract']!r})",
        "ConnectionRefusedError",
    )


@needs_namespaces
def test_internet_and_dns():
    fails("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)", "OSError")
    fails("import socket\nsocket.getaddrinfo('pypi.org', 443)", "gaierror", "OSError")


@needs_namespaces
def test_ipv6_loopback():
    fails("import socket\ns = socket.socket(socket.AF_INET6)\ns.settimeout(1)\ns.connect(('::1', 22))", "OSError")


def test_only_unix_and_ip_sockets():
    # AF_VSOCK is not covered by a network namespace: in a VM (Firecracker, Kata, WSL2) it reaches the host side.
    fails("import socket\nsocket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)", "[Errno 97]")
    fails("import socket\nsocket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 15)", "[Errno 97]")  # kernel uevents
    fails("import socket\nsocket.socketpair(socket.AF_VSOCK)", "[Errno 97]")
    # The family is an int: high bits set in the register must not pass the filter (the kernel ignores them).
    fails(
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        f"fd = libc.syscall({syscall_number('socket')}, ctypes.c_long((1 << 32) | 40), 1, 0)\n"
        "assert fd >= 0, 'vsock refused'",
        "vsock refused",
    )
    result = execute(
        "import socket\nresult = [socket.socket(f, socket.SOCK_STREAM).family.name "
        "for f in (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6)] + [len(socket.socketpair())]",
        result_var="result",
    )
    assert result.ok and result.value == ["AF_UNIX", "AF_INET", "AF_INET6", 2], result


@needs_namespaces
def test_nothing_bound_outlives_its_snippet():
    # An abstract Unix socket that sends itself over itself (SCM_RIGHTS) stays alive after its process ends, until the
    # kernel's garbage collector finds the cycle: seconds, during which the next execution could reach it. Each child
    # has a network namespace of its own, so the next one, on the same server at once, finds the name free.
    name = f"\\0trl-ext-cycle-{uuid.uuid4().hex[:8]}"
    bind = f"import array, socket\ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\ns.bind('{name}')\n"
    cycle = (
        bind + f"s.sendmsg([b'x'], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array('i', [s.fileno()]))], 0, "
        f"'{name}')\nresult = 'bound'"
    )
    pool = SandboxPool()
    try:
        assert pool.run(cycle, "result", Limits()).value == "bound"
        result = pool.run(bind + "result = 'free'", "result", Limits())
        assert result.ok and result.value == "free", result
    finally:
        pool.close()


# -- files ------------------------------------------------------------------------------------------------------
@pytest.mark.skipif(not ROOT, reason="not root, snippets keep the caller's uid and can read the caller's files")
def test_read_private_file(sentinels):
    fails(f"print(open('{sentinels}/secret.txt').read())", "PermissionError")
    assert execute(f"print(open('{sentinels}/public.txt').read())").stdout == "public\n"  # it is visible


def test_read_shadow_and_root_home():
    fails("print(open('/etc/shadow').read())", "PermissionError")
    fails("import os\nprint(os.listdir('/root'))", "PermissionError")


@needs_namespaces
def test_host_processes_invisible():
    fails(f"print(open('/proc/{os.getpid()}/cmdline').read())", "FileNotFoundError")


def test_environment_not_inherited(monkeypatch):
    monkeypatch.setenv("TRL_EXT_TEST_SECRET", "hunter2")
    fails(
        "import os\nassert 'TRL_EXT_TEST_SECRET' not in os.environ\nraise SystemExit(os.environ.get('HOME'))", "exit"
    )


@needs_namespaces
def test_write_into_world_writable_directory(sentinels):
    fails(f"open('{sentinels}/open/victim.txt', 'w').write('pwned')", "Read-only file system")
    fails(f"open('{sentinels}/open/new.txt', 'w').write('pwned')", "Read-only file system")
    assert not (sentinels / "open" / "new.txt").exists()


def test_write_into_project():
    reasons = ("Read-only file system", "PermissionError") + (("FileNotFoundError",) if REPO_HIDDEN else ())
    fails(f"open('{REPO}/README.md', 'a').write('pwned')", *reasons)
    fails(f"open('{REPO}/trl_ext/pwned.py', 'w').write('import os')", *reasons)
    assert not (REPO / "trl_ext" / "pwned.py").exists()


@needs_namespaces
def test_write_to_shared_memory_and_var_tmp():
    name = f"trl-ext-pwned-{uuid.uuid4().hex[:8]}"
    fails(f"open('/dev/shm/{name}', 'w').write('x')", "Read-only file system", "PermissionError")
    fails(f"open('/var/tmp/{name}', 'w').write('x')", "Read-only file system", "PermissionError")
    assert not Path(f"/dev/shm/{name}").exists() and not Path(f"/var/tmp/{name}").exists()


@needs_namespaces
def test_tmp_is_private():
    # Writing to /tmp works, on the snippet's own tmpfs: the host's /tmp never sees it, nor does the next snippet.
    name = f"trl-ext-pwned-{uuid.uuid4().hex[:8]}"
    fails(f"open('/tmp/{name}', 'w').write('x')\nraise RuntimeError('written')", "written")
    assert not Path(f"/tmp/{name}").exists()
    fails(f"open('/tmp/{name}').read()", "FileNotFoundError")


@needs_namespaces
def test_delete_files(sentinels):
    fails(f"import os\nos.remove('{sentinels}/open/victim.txt')", "Read-only file system")
    fails(f"import shutil\nshutil.rmtree('{sentinels}')", "Read-only file system", "PermissionError")
    fails(
        f"import os\nos.chmod('{REPO}/README.md', 0o777)",
        "Read-only file system",
        "PermissionError",
        *(("FileNotFoundError",) if REPO_HIDDEN else ()),
    )
    assert (sentinels / "open" / "victim.txt").read_text() == "victim"


@needs_namespaces
@pytest.mark.skipif(not ROOT, reason="mounts a file system on the host")
def test_mount_point_with_a_non_ascii_name_is_read_only():
    # mountinfo shows UTF-8 names as they are (only space, tab, newline and backslash are escaped): such a mount
    # must be found and made read-only like any other, not left writable and shared between snippets.
    point = Path("/srv") / f"sandbox-mnt-\u00e9\u6f22 {uuid.uuid4().hex[:8]}"
    point.mkdir(parents=True)
    try:
        if (
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=1m,mode=1777", "none", str(point)], capture_output=True
            ).returncode
            != 0
        ):
            pytest.skip("cannot mount a tmpfs here")
        pool = SandboxPool()  # a new server, which sees the new mount
        try:
            assert pool.info()["missing"] == []
            result = pool.run(f"open({str(point / 'x')!r}, 'w').write('x')", None, Limits(timeout_s=2.0))
            assert not result.ok and "Read-only file system" in result.error
            assert not (point / "x").exists()
        finally:
            pool.close()
    finally:
        subprocess.run(["umount", str(point)], capture_output=True)
        point.rmdir()


def test_file_size_and_descriptor_limits():
    fails("open('/tmp/big', 'wb').write(b'x' * (64 << 20))", "OSError", "memory")
    fails("fs = [open('/dev/null') for _ in range(10000)]", "Too many open files")


# -- resources ----------------------------------------------------------------------------------------------------
def test_memory_bomb():
    fails("x = bytearray(8 << 30)", "memory")


def test_memory_creep():
    fails("x = []\nwhile True:\n    x.append(' ' * 4096)", "memory", timeout_s=5.0)


def test_cpu_bomb():
    fails("while True:\n    pass", "timeout", timeout_s=1.0)


def test_sleep_forever():
    result = fails("import time\ntime.sleep(300)", "timeout", timeout_s=1.0)
    assert result.duration_s < 5.0  # killed at 1 s, not after 300


def test_signal_tampering():
    fails(
        "import signal\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGXCPU, signal.SIGALRM, signal.SIGHUP):\n"
        "    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass",
        "timeout",
        timeout_s=1.0,
    )


def test_rlimit_tampering():
    fails("import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))", "ValueError", "PermissionError")
    fails("import resource\nresource.setrlimit(resource.RLIMIT_NPROC, (100, 100))", "ValueError", "PermissionError")
    fails("import resource\nresource.setrlimit(resource.RLIMIT_CPU, (-1, -1))", "ValueError", "PermissionError")


def test_endless_output():
    result = fails("while True:\n    print('spam' * 100)", "output too large", max_output_bytes=4096)
    assert len(result.stdout) <= 4096


def test_endless_non_utf8_output():
    result = fails(
        "import sys\nwhile True:\n    sys.stdout.buffer.write(b'\\xff\\xfe\\x80 ')",
        "output too large",
        max_output_bytes=4096,
    )
    assert "\ufffd" in result.stdout


def test_deep_recursion():
    fails("def f(n):\n    return f(n + 1)\nf(0)", "RecursionError")
    fails(
        "import sys\nsys.setrecursionlimit(10**8)\ndef f(n):\n    return f(n + 1)\nf(0)",
        # CPython's own C-stack guard may answer with a SystemError instead of a crash: still a contained failure.
        "killed by signal",
        "memory",
        "RecursionError",
        "SystemError",
        "timeout",
    )


def test_stdin_is_empty():
    fails("input()", "EOFError")


# -- privileges -----------------------------------------------------------------------------------------------------
def test_setuid_root():
    fails("import os\nos.setuid(0)", "PermissionError", "Invalid argument")  # EINVAL: uid 0 is not mapped
    fails("import os\nos.setgroups([0])", "PermissionError")


def test_ctypes_syscalls():
    fails(
        "import ctypes\nlibc = ctypes.CDLL('libc.so.6', use_errno=True)\nassert libc.setuid(0) == 0, 'setuid'",
        "setuid",
    )
    fails(
        "import ctypes\nlibc = ctypes.CDLL('libc.so.6', use_errno=True)\n"
        "assert libc.unshare(0x40000000 | 0x00020000) == 0, 'unshare'",
        "unshare",
    )
    fails(
        "import ctypes\nlibc = ctypes.CDLL('libc.so.6', use_errno=True)\n"
        "assert libc.mount(b'none', b'/', None, 32, None) == 0, 'remount'",
        "remount",
    )


def test_ctypes_crash():
    fails("import ctypes\nctypes.string_at(0)", "killed by signal 11")


def test_exits():
    fails("import sys\nsys.exit(0)", "exit")
    fails("import os\nos._exit(0)", "before the end")
    # PID 1 of a namespace ignores its own SIGABRT; abort() then ends it with a fault.
    fails("import os\nos.abort()", "killed by signal")


def test_isolation_in_effect_for_this_suite():
    info = isolation()
    if NAMESPACES:
        assert info["missing"] == []
    if ROOT:
        assert info["uid"] == NOBODY
        assert {"network", "mount", "pid", "ipc"} <= set(info["namespaces"])
