"""trl_ext.sandbox: results, the value exchange (reprs read with ast.literal_eval, hostile reprs and forged messages,
the bound on what the host parses), batching, determinism, no state shared between snippets, the isolation report,
the user-namespace and unisolated modes (run as uid 65534), the interpreter choice and bad limits."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

from trl_ext.sandbox import ExecutionResult, SandboxPool, execute, execute_many, isolation, sandbox_interpreter
from trl_ext.sandbox.interpreter import NOBODY, usable_as
from trl_ext.sandbox.pool import Limits


REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox needs Linux namespaces and rlimits")
PROGRAM = "def f(xs, k):\n    return sorted(xs)[:k]\nresult = f([5, 3, 9, 1], 2)\nprint('done')"


def test_value_and_stdout():
    result = execute(PROGRAM, result_var="result")
    assert result == ExecutionResult(
        ok=True, stdout="done\n", error=None, value=[1, 3], value_repr="[1, 3]", duration_s=result.duration_s
    )
    assert 0 < result.duration_s < 5


@pytest.mark.parametrize(
    "value",
    [0, -7, 2.5, "a'b\"c\n", b"\x00\xff", (1, (2, [3])), {"k": {1, 2}}, None, True, set(), [], 10**100, 1 + 2j],
)
def test_literal_values_round_trip(value):
    result = execute(f"result = {value!r}", result_var="result")
    assert result.ok and result.value == value and type(result.value) is type(value)


def test_no_result_var_reads_nothing():
    result = execute("result = object()")
    assert result.ok and result.value is None and result.value_repr is None


def test_exception_is_reported_with_type_and_message():
    result = execute("x = 1 / 0", result_var="x")
    assert not result.ok and result.error == "exception: ZeroDivisionError: division by zero"
    result = execute("def f(:\n  pass")
    assert result.error.startswith("exception: SyntaxError")


def test_output_before_a_failure_is_kept():
    result = execute("print('partial')\nraise ValueError('boom')")
    assert result.stdout == "partial\n" and result.error == "exception: ValueError: boom"


# -- hostile values in the exchange --------------------------------------------------------------------------------
def test_missing_result_var():
    result = execute("x = 1", result_var="result")
    assert not result.ok and "did not define 'result'" in result.error


def test_non_literal_value():
    result = execute("result = object()", result_var="result")
    assert not result.ok and result.error.startswith("unreadable result: not a Python literal")
    assert result.value is None and result.value_repr.startswith("<object object")


def test_repr_that_is_code_is_not_run():
    marker = Path(f"/tmp/trl-ext-repr-{os.getpid()}")
    result = execute(
        f"class Evil:\n    def __repr__(self):\n        return \"__import__('os').system('touch {marker}')\"\n"
        "result = Evil()",
        result_var="result",
    )
    assert not result.ok and result.error.startswith("unreadable result: not a Python literal")
    assert not marker.exists()


def test_repr_that_raises_or_is_not_a_string():
    result = execute(
        "class E:\n    def __repr__(self):\n        raise KeyError('no')\nresult = E()", result_var="result"
    )
    assert not result.ok and result.error == "unreadable result: repr raised KeyError: 'no'"
    result = execute("class E:\n    def __repr__(self):\n        return 42\nresult = E()", result_var="result")
    assert not result.ok and "repr raised TypeError" in result.error


def test_repr_that_never_returns():
    result = execute(
        "class E:\n    def __repr__(self):\n        while True: pass\nresult = E()", result_var="result", timeout_s=1.0
    )
    # The wall-clock timeout or the CPU-time rlimit, whichever fires first on the machine's load.
    assert not result.ok and result.error.startswith("timeout")


def test_repr_that_prints_a_fake_result():
    result = execute(
        "class E:\n    def __repr__(self):\n        print('42')\n        return '7'\nresult = E()", result_var="result"
    )
    assert result.ok and result.value == 7 and result.stdout == "42\n"


def test_huge_repr():
    result = execute("result = 'x' * (3 << 20)", result_var="result")
    assert not result.ok and "repr longer than" in result.error


def test_deeply_nested_repr():
    result = execute("result = []\nfor _ in range(10**5):\n    result = [result]", result_var="result")
    assert not result.ok and "unreadable result" in result.error
    result = execute(
        "result = '-' * 100000 + '1'\nclass E:\n    def __repr__(self):\n        return result\nresult = E()",
        result_var="result",
    )
    assert not result.ok and "unreadable result" in result.error


def test_forged_result_channel():
    # Writing a made-up result message on the result pipe and leaving: without the per-execution nonce the server
    # rejects it.
    result = execute(
        "import os, json\nos.write(3, b'0' * 32 + json.dumps({}).encode())\nos._exit(0)", result_var="result"
    )
    assert not result.ok and "before the end" in result.error
    result = execute('print(\'{"ok": true, "value_repr": "1"}\')\nimport os\nos._exit(0)', result_var="result")
    assert not result.ok and result.value is None


# A snippet can always find its own execution's nonce (it is in its own process): what it forges with it must only
# ever cost it its own result.
FIND_NONCE = (
    "import os, sys\nframe = sys._getframe()\nwhile 'nonce' not in frame.f_locals:\n    frame = frame.f_back\n"
    "nonce = frame.f_locals['nonce'].encode()\n"
)


def test_a_deeply_nested_forged_message_does_not_kill_the_server():
    pool = SandboxPool()
    try:
        assert pool.run("result = 1", "result", Limits()).value == 1
        servers = list(pool._servers)
        result = pool.run(FIND_NONCE + "os.write(3, nonce + b'[' * 100000)\nos._exit(0)", "result", Limits())
        assert not result.ok and "before the end" in result.error
        assert pool.run("result = 2", "result", Limits()).value == 2 and pool._servers == servers  # same server
    finally:
        pool.close()


def test_a_forged_value_repr_is_a_str_or_none():
    result = execute(
        FIND_NONCE + "import json\nos.write(3, nonce + json.dumps({'value_repr': [1]}).encode())\nos._exit(0)",
        result_var="result",
    )
    assert not result.ok and result.value_repr is None and result.value is None


def test_the_host_parses_no_value_beyond_max_value_bytes():
    # A set of ints with equal hashes: cheap for the snippet, quadratic for the host's literal_eval (seconds at a few
    # hundred KiB). The length is checked before anything is parsed.
    code = (
        "M = (1 << 61) - 1\nTEXT = '{' + ', '.join(str(k * M) for k in range(1, 15000)) + '}'\n"
        "class E:\n    def __repr__(self):\n        return TEXT\nresult = E()"
    )
    start = time.monotonic()
    result = execute(code, result_var="result")
    assert not result.ok and "65536 characters" in result.error and result.value_repr is None
    assert time.monotonic() - start < 2.0
    assert execute("result = 'x' * 90", result_var="result", max_value_bytes=100).ok
    result = execute("result = 'x' * 110", result_var="result", max_value_bytes=100)
    assert not result.ok and "100 characters" in result.error
    with pytest.raises(ValueError, match="max_value_bytes"):
        execute("x = 1", max_value_bytes=0)


def test_printing_a_result_never_raises():
    # A hex literal parses into an int too long for repr() (sys.get_int_max_str_digits()).
    result = execute(
        "class E:\n    def __repr__(self):\n        return '0x' + 'f' * 20000\nresult = E()", result_var="result"
    )
    assert not result.ok and result.error.startswith("unreadable result") and result.value is None
    assert repr(result) and str(result)


# -- batches, determinism, state -------------------------------------------------------------------------------------
def test_execute_many_keeps_order_and_isolates_failures():
    codes = [f"result = {i} * {i}" if i % 3 else "result = 1 / 0" for i in range(12)]
    results = execute_many(codes, result_var="result", max_workers=2)
    assert [r.value for r in results] == [None if i % 3 == 0 else i * i for i in range(12)]
    assert [r.ok for r in results] == [bool(i % 3) for i in range(12)]
    assert execute_many([], result_var="result") == []


def test_deterministic_across_runs_workers_and_servers():
    code = (
        "words = {'alpha', 'beta', 'gamma', 'delta', 'epsilon'}\n"
        "result = (list(words), hash('abc'), sorted({3: 1, 1: 2}.items()), 2 ** 0.5)"
    )
    values = [r.value for r in execute_many([code] * 8, result_var="result", max_workers=2)]
    fresh = SandboxPool()
    try:
        values.append(fresh.run(code, "result", Limits()).value)
    finally:
        fresh.close()
    assert all(v == values[0] for v in values)


def test_randomness_is_not_shared():
    # Each snippet seeds `random` from the OS, as a fresh interpreter would: nondeterministic programs show it.
    values = {r.value for r in execute_many(["import random\nresult = random.random()"] * 4, result_var="result")}
    assert len(values) == 4


def test_no_state_leaks_between_snippets():
    first = execute(
        "import math, builtins, sys\nmath.pi = 3\nbuiltins.abs = None\nsys.modules['leak'] = 1\n"
        "open('leftover', 'w').write('x')\nresult = math.pi",
        result_var="result",
    )
    assert first.value == 3
    second = execute(
        "import math, os, sys\nresult = (math.pi, abs(-2), 'leak' in sys.modules, "
        "os.path.exists('leftover'), os.listdir('.'))",
        result_var="result",
    )
    assert second.value == (3.141592653589793, 2, False, False, [])


def test_a_closed_pool_starts_new_servers():
    pool = SandboxPool()
    try:
        assert pool.run("result = 1", "result", Limits()).value == 1
        pool.close()
        assert pool.run("result = 2", "result", Limits()).value == 2
    finally:
        pool.close()


def running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("fault", ["hang", "crash"])
def test_a_failed_server_is_replaced(monkeypatch, fault):
    import trl_ext.sandbox.pool as pool_module

    monkeypatch.setattr(pool_module, "SERVER_GRACE_S", 0.5)
    pool = SandboxPool()
    try:
        assert pool.run("result = 1", "result", Limits()).value == 1
        (server,) = pool._servers
        tree = [psutil.Process(server.proc.pid), *psutil.Process(server.proc.pid).children(recursive=True)]
        for proc in tree:
            try:
                os.kill(proc.pid, signal.SIGSTOP if fault == "hang" else signal.SIGKILL)
            except ProcessLookupError:  # already killed with its parent
                pass
        start = time.monotonic()
        result = pool.run("result = 2", "result", Limits(timeout_s=1.0))
        assert result == ExecutionResult(ok=False, stdout="", error="sandbox server failed (replaced)")
        assert time.monotonic() - start < 10 and pool._servers == []
        assert server.proc.poll() is not None
        deadline = time.monotonic() + 5  # the rest of its tree is killed with it (PID namespace, parent-death signal)
        while any(running(proc) for proc in tree) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(running(proc) for proc in tree)
        assert pool.run("result = 3", "result", Limits()).value == 3  # a fresh server
    finally:
        pool.close()


# -- isolation report, interpreter, limits ---------------------------------------------------------------------------
def test_isolation_report():
    """The report matches what a snippet observes. (Whether every namespace must be in effect depends on the
    kernel: `test_sandbox_hostile.py` checks that against unshare(1).)"""
    info = isolation()
    assert set(info) >= {"namespaces", "uid", "privileges", "rlimits", "missing", "interpreter", "python"}
    assert {"RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_CORE"} <= set(
        info["rlimits"]
    )
    seen = execute(
        "import os, resource\nresult = (os.getuid(), os.getgid(), os.getgroups(), os.getcwd(), "
        "[p for p in os.listdir('/proc') if p.isdigit()], resource.getrlimit(resource.RLIMIT_NPROC), "
        "resource.getrlimit(resource.RLIMIT_CORE))",
        result_var="result",
    )
    uid, gid, groups, cwd, pids, nproc, core = seen.value
    assert uid == info["uid"] and nproc == (0, 0) and core == (0, 0) and cwd.startswith("/tmp")
    if os.getuid() == 0:
        assert (uid, gid, groups) == (NOBODY, NOBODY, [])
    if "pid" in info["namespaces"]:
        assert pids == ["1"] and cwd == "/tmp"


def test_without_libseccomp_no_run_unless_opted_in(monkeypatch):
    # libseccomp.so.2 missing (or too old): refused, unless opted in; then isolation() and a warning name every layer
    # the filter would have held, and the session keyring is replaced all the same (keyctl's number from a table).
    import trl_ext.sandbox.pool as pool_module
    import trl_ext.sandbox.syscall_filter as filter_module

    monkeypatch.setattr(
        filter_module, "compile_filter", lambda: (None, {}, "no system-call filter: libseccomp (test)")
    )
    monkeypatch.setattr(pool_module, "compile_filter", filter_module.compile_filter)
    pool_module.server_config.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="libseccomp \\(test\\)") as refused:
            SandboxPool(allow_unisolated=False).info()
        assert "TRL_EXT_SANDBOX_ALLOW_UNISOLATED=1" in str(refused.value)
        pool = SandboxPool(allow_unisolated=True)
        try:
            with pytest.warns(RuntimeWarning, match="libseccomp \\(test\\)"):
                info = pool.info()
            (line,) = [m for m in info["missing"] if "libseccomp (test)" in m]
            assert all(layer in line for layer in ("user namespaces", "keyrings", "memfd", "page-cache", "AF_VSOCK"))
            assert "seccomp" not in info["privileges"] and "a new session keyring" in info["privileges"]
            assert pool.run("result = 1", "result", Limits()).value == 1
        finally:
            pool.close()
    finally:
        pool_module.server_config.cache_clear()


@pytest.mark.skipif(os.getuid() != 0, reason="the interpreter check matters when the sandbox drops to uid 65534")
def test_interpreter_is_usable_by_the_dropped_uid():
    assert usable_as(sandbox_interpreter(), NOBODY)
    assert not usable_as("/nonexistent/python3", NOBODY)


@pytest.mark.skipif(os.getuid() != 0, reason="the interpreter check matters when the sandbox drops to uid 65534")
def test_no_usable_interpreter_says_what_to_do(monkeypatch, tmp_path):
    import trl_ext.sandbox.interpreter as interpreter_module

    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    os.symlink(sys.executable, private / "python3")  # runs for root, unreachable for uid 65534
    monkeypatch.setattr(interpreter_module, "_candidates", lambda: [str(private / "python3")])
    interpreter_module.sandbox_interpreter.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="TRL_EXT_SANDBOX_PYTHON") as raised:
            interpreter_module.sandbox_interpreter()
        assert str(private / "python3") in str(raised.value) and "chmod o+rx" in str(raised.value)
    finally:
        interpreter_module.sandbox_interpreter.cache_clear()


def test_interpreter_from_the_environment_comes_first(monkeypatch):
    import trl_ext.sandbox.interpreter as interpreter_module

    monkeypatch.setenv("TRL_EXT_SANDBOX_PYTHON", "/usr/bin/env")
    assert interpreter_module._candidates()[0] == "/usr/bin/env"


@pytest.fixture
def package_for_nobody():
    """A copy of the sandbox package and of its one dependency (pyseccomp, a single module) that uid 65534 can
    import, wherever the checkout lives (a clone in root's home or under `mktemp -d` is not reachable by that uid):
    the directory to put on its PYTHONPATH."""
    import pyseccomp

    base = tempfile.mkdtemp(prefix="trl-ext-sandbox-pkg-", dir="/tmp")
    shutil.copytree(REPO / "trl_ext" / "sandbox", Path(base) / "sandbox", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(pyseccomp.__file__, base)
    for parent, _dirs, files in os.walk(base):
        os.chmod(parent, 0o755)
        for name in files:
            os.chmod(os.path.join(parent, name), 0o644)
    yield base
    shutil.rmtree(base)


@pytest.fixture
def home_of_nobody():
    """A home directory for uid 65534 (its own is /nonexistent) holding a 0600 token, as a training user's has; in
    /srv, which the sandbox shows read-only like any host path (not /tmp, which each snippet gets empty)."""
    Path("/srv").mkdir(exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="trl-ext-home-", dir="/srv"))
    (home / ".cache").mkdir()
    (home / ".cache" / "token").write_text("hf_secret")
    for path in (home, home / ".cache", home / ".cache" / "token"):
        os.chown(path, NOBODY, NOBODY)
    os.chmod(home / ".cache" / "token", 0o600)
    os.chmod(home, 0o700)
    yield home
    shutil.rmtree(home)


@pytest.mark.skipif(os.getuid() != 0, reason="starts the non-root case as uid 65534")
def test_not_root_user_namespaces_or_a_refusal(package_for_nobody, home_of_nobody):
    """As an unprivileged user: user + network namespaces where the kernel allows them, and the home directory
    hidden (the snippet keeps the uid, so it could read the user's 0600 tokens); else a refusal that says how to opt
    in. The snippet cannot reach the network, write the project or read the token."""
    # The system interpreter lacks the project's dependencies: the sandbox package is imported as a top-level
    # package, from a copy that has its dependency next to it.
    token = home_of_nobody / ".cache" / "token"
    script = (
        "import json, warnings\nwarnings.simplefilter('always')\nfrom sandbox import execute, isolation\n"
        "try:\n    info = isolation()\nexcept RuntimeError as exc:\n    print(json.dumps(str(exc)))\n"
        "    raise SystemExit\n"
        "net = execute('import socket\\nsocket.create_connection((\"127.0.0.1\", 9), timeout=1)')\n"
        f'write = execute(\'open("{REPO}/pwned", "w")\')\n'
        f"read = execute('print(open(\"{token}\").read())')\n"
        "print(json.dumps([info, net.error, write.error, read.error, read.stdout]))"
    )
    done = subprocess.run(
        [sandbox_interpreter(), "-s", "-c", script],
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        env={"PYTHONPATH": package_for_nobody, "PATH": "/usr/bin:/bin", "HOME": str(home_of_nobody)},
        cwd="/",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout.splitlines()[-1])
    if isinstance(outcome, str):  # user namespaces refused here: no silent fallback
        assert "TRL_EXT_SANDBOX_ALLOW_UNISOLATED=1" in outcome and "allow_unisolated=True" in outcome
        return
    info, net_error, write_error, read_error, read_stdout = outcome
    assert read_error and "FileNotFoundError" in read_error and "hf_secret" not in read_stdout
    assert net_error and write_error and not (REPO / "pwned").exists()
    assert info["mode"] == "user namespace" and {"network", "mount", "pid"} <= set(info["namespaces"])
    assert info["missing"] == []


def can_make_a_mount_namespace() -> bool:
    try:
        return subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.mark.skipif(
    os.getuid() != 0 or not can_make_a_mount_namespace(),
    reason="sets up a chroot: needs root with CAP_SYS_ADMIN and util-linux unshare",
)
def test_no_namespaces_is_refused_unless_opted_in_then_hardened(package_for_nobody):
    """Where user namespaces are refused (here: inside a chroot, where the kernel refuses them) the sandbox refuses
    to run unless the caller opts in. Opted in, snippets still cannot read the host's environment (API keys) or
    memory, write into another fork server's reply pipe, or write outside their own directory."""
    script = (
        "import json, os, warnings\nwarnings.simplefilter('always')\n"
        "from sandbox import SandboxPool\nfrom sandbox.pool import Limits\n"
        "try:\n    SandboxPool().info()\n    refused = None\nexcept RuntimeError as exc:\n    refused = str(exc)\n"
        "pool = SandboxPool(allow_unisolated=True)\n"
        "with warnings.catch_warnings(record=True) as caught:\n    info = pool.info()\n"
        "pool.run_many(['result = 1'] * 4, 'result', Limits(), 2)\n"
        "other = pool._servers[-1].proc.pid\n"
        "run = lambda code, **kw: pool.run(code, 'result', Limits(**kw)).error\n"
        'errors = [run(f\'result = open("/proc/{os.getpid()}/environ", "rb").read()\'),\n'
        '          run(f\'result = open("/proc/{os.getpid()}/mem", "rb").read(1)\'),\n'
        '          run(f\'open("/proc/{other}/fd/1", "w").write("forged\\\\n")\'),\n'
        '          run(\'open("/tmp/trl-ext-pwned", "w").write("x")\'),\n'
        "          run('import os\\nos.fork()'), run('while True: pass', timeout_s=1)]\n"
        'ok = run(\'open("own", "w").write("x")\\nresult = open("own").read()\')\n'
        "print(json.dumps([refused, info, [str(w.message) for w in caught], errors, ok]))"
    )
    inner = f"{sandbox_interpreter()} -s -c {shlex.quote(script)}"
    shell = (
        "mount -t tmpfs none /mnt && mkdir /mnt/r && mount --rbind / /mnt/r && chroot /mnt/r setpriv "
        f"--reuid={NOBODY} --regid={NOBODY} --clear-groups env -i PYTHONPATH={package_for_nobody} "
        "PATH=/usr/bin:/bin TRL_EXT_TEST_SECRET=hunter2 " + inner
    )
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", shell],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    refused, info, warned, errors, ok = json.loads(done.stdout.splitlines()[-1])
    assert refused and "TRL_EXT_SANDBOX_ALLOW_UNISOLATED=1" in refused and "allow_unisolated=True" in refused
    assert info["mode"] == "unisolated (opted in)" and info["namespaces"] == [] and info["uid"] == NOBODY
    assert any("network" in m for m in info["missing"]) and any("file system" in m for m in info["missing"])
    assert len(warned) == 1 and "not fully isolated" in warned[0]
    environ, mem, pipe, outside, fork, cpu = errors
    assert environ and mem and pipe and outside  # PermissionError: not dumpable, Landlock
    assert "BlockingIOError" in fork and cpu.startswith("timeout")  # wall clock or CPU rlimit
    assert ok is None  # its own directory stays writable


def test_signal_scope_filter_lets_a_snippet_signal_only_itself():
    # Not root without a PID namespace, snippets share the caller's uid: where Landlock cannot scope signals (ABI < 6)
    # a second filter, built per child with its pid, does. Checked here on its own, in a forked process.
    import pyseccomp

    from trl_ext.sandbox.syscall_filter import SIGNAL_CALLS

    server = {"__name__": "forkserver"}
    exec(compile((REPO / "trl_ext" / "sandbox" / "forkserver.py").read_text(), "forkserver.py", "exec"), server)
    numbers = {name: pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name) for name in SIGNAL_CALLS}
    other = subprocess.Popen(["sleep", "60"])
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reports through the pipe
        outcome = []
        try:
            os.setsid()  # as a snippet's process: it leads its own group
            server["prctl"](server["PR_SET_NO_NEW_PRIVS"], 1)
            server["SyscallFilter"](server["signal_scope_filter"](os.getpid(), numbers), None).install()
            for target in (other.pid, -1, -other.pid, os.getpid(), 0, -os.getpid()):
                try:
                    os.kill(target, 0)
                    outcome.append("sent")
                except OSError as exc:
                    outcome.append(exc.errno)
            signal.pthread_kill(threading.get_ident(), 0)  # tgkill to itself
            for call in (
                lambda: os.pidfd_open(other.pid),
                lambda: signal.pidfd_send_signal(os.pidfd_open(os.getpid()), 0),
            ):
                try:
                    call()
                    outcome.append("done")
                except OSError as exc:
                    outcome.append(exc.errno)
        except BaseException as exc:
            outcome.append(repr(exc))
        os.write(write, json.dumps(outcome).encode())
        os._exit(0)
    os.close(write)
    try:
        outcome = json.loads(os.read(read, 4096))
    finally:
        os.waitpid(pid, 0)
        other.kill()
        other.wait()
    eperm = 1
    assert outcome == [eperm, eperm, eperm, "sent", "sent", "sent", eperm, eperm], outcome


@pytest.mark.parametrize(
    "kwargs, field",
    [({"timeout_s": 0}, "timeout_s"), ({"memory_mb": 8}, "memory_mb"), ({"max_output_bytes": 0}, "max_output_bytes")],
)
def test_bad_limits(kwargs, field):
    with pytest.raises(ValueError, match=field):
        execute("x = 1", **kwargs)


def test_bad_max_workers():
    with pytest.raises(ValueError, match="max_workers"):
        execute_many(["x = 1", "x = 2"], max_workers=0)
