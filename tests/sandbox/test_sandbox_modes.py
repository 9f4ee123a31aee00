"""The sandbox in every mode a machine can put it in, each set up here as a subprocess: root (with CAP_SYS_ADMIN),
root without CAP_SYS_ADMIN (a container's default root, `capsh --drop=cap_sys_admin`), root without any namespace
(that, inside a chroot, where the kernel refuses user namespaces), not root with user namespaces and without
(`setpriv` to uid 65534, in a chroot for the latter), and without libseccomp (its import made to fail). In each: the
sandbox refuses to run unless fully isolated or opted in, and, opted in, nothing is isolated less than
`isolation()["missing"]` says: the host's TCP, UDP and abstract Unix listeners are not reached, a process of uid
65534 on the host and a snippet running at the same time survive `kill(-1, SIGKILL)`, the host's /tmp is not
written, the caller's session keyring is out of reach, and AF_VSOCK is denied where there is a filter."""

from __future__ import annotations

import json
import os
import platform
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from trl_ext.sandbox import sandbox_interpreter
from trl_ext.sandbox.interpreter import NOBODY


REPO = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="the sandbox needs Linux namespaces and rlimits"),
    pytest.mark.skipif(os.getuid() != 0, reason="sets up every mode from root (capsh, setpriv, chroot)"),
]
# add_key's and keyctl's numbers, for the probe's secret in its session keyring (None: that check is skipped here).
ADD_KEY, KEYCTL = {"x86_64": (248, 250), "aarch64": (217, 219), "riscv64": (217, 219)}.get(
    platform.machine(), (None, None)
)

# Runs in the mode under test, with the sandbox package copied as a top-level `sandbox` (uid 65534 must import it).
PROBE = """
import ctypes, json, os, sys, warnings
if os.environ.get("PROBE_NO_LIBSECCOMP"):
    sys.modules["pyseccomp"] = None  # libseccomp missing: the import fails
warnings.simplefilter("ignore")
from sandbox import SandboxPool
from sandbox.pool import Limits
tcp, udp, abstract, bystander, add_key, keyctl, marker = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
secret = None
if add_key is not None:  # a secret in this process's session keyring, as a trainer's (Kerberos, keyctl) would be
    if libc.syscall(add_key, b"user", b"trl-ext-modes", b"hunter2", 7, -3) >= 0:
        secret = "trl-ext-modes"
try:
    SandboxPool(allow_unisolated=False).info()
    refused = None
except RuntimeError as exc:
    refused = str(exc)
pool = SandboxPool(allow_unisolated=True)
info = pool.info()
def error(code, **limits):
    result = pool.run(code, "result", Limits(**limits))
    return result.error if not result.ok else None
attacks = {
    "tcp": error("import socket\\nsocket.create_connection(('127.0.0.1', %d), timeout=1)\\nresult = 1" % tcp),
    "udp": error("import socket\\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\\n"
                 "s.sendto(b'x', ('127.0.0.1', %d))\\nresult = 1" % udp),
    "abstract": error("import socket\\ns = socket.socket(socket.AF_UNIX)\\ns.connect(%r)\\nresult = 1" % abstract),
    "vsock": error("import socket\\nsocket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)\\nresult = 1"),
    "bystander": error("import os\\nos.kill(%d, 9)\\nresult = 1" % bystander),
    "host tmp": error("open(%r, 'w').write('x')\\nresult = 1" % marker),
    "keyring": None if secret is None or keyctl is None else error(
        "import ctypes\\nlibc = ctypes.CDLL(None, use_errno=True)\\n"
        "assert libc.syscall(%d, 10, -3, b'user', b'trl-ext-modes', 0) >= 0, 'not found'\\nresult = 1" % keyctl),
}
# A snippet that kills every process it may signal, while another one runs.
sleeper, killer = pool.run_many(
    ["import time\\ntime.sleep(2)\\nresult = 'alive'", "import os, time\\ntime.sleep(0.5)\\nos.kill(-1, 9)\\nresult = 1"],
    "result", Limits(timeout_s=20), 2)
uids = [pool.run("import os\\nresult = os.getuid()", "result", Limits()).value for _ in range(2)]
print(json.dumps({"refused": refused, "info": info, "attacks": attacks, "sleeper": sleeper.value, "uids": uids,
                  "secret": secret}))
"""


def runs(command: list[str]) -> bool:
    try:
        return subprocess.run(command, capture_output=True, timeout=60).returncode == 0
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return False


CHROOT = "mount -t tmpfs none /mnt && mkdir /mnt/r && mount --rbind / /mnt/r && chroot /mnt/r "
AS_NOBODY = f"setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups "
NO_SYS_ADMIN = "capsh --drop=cap_sys_admin -- -c "
# mode -> (shell prefix of the probe's command, whether the probe's command goes in as one quoted argument, whether
# it runs in a new mount namespace with a chroot)
MODES = {
    "root": ("", False, False),
    "root without CAP_SYS_ADMIN": (NO_SYS_ADMIN, True, False),
    "root without namespaces": (CHROOT + NO_SYS_ADMIN, True, True),
    "not root, user namespaces": (AS_NOBODY, False, False),
    "not root, no namespaces": (CHROOT + AS_NOBODY, False, True),
    "root, no libseccomp": ("", False, False),
    "not root, user namespaces, no libseccomp": (AS_NOBODY, False, False),
}


def cap_sys_admin() -> bool:
    with open("/proc/self/status") as f:
        return bool(int(next(line.split()[1] for line in f if line.startswith("CapEff:")), 16) >> 21 & 1)


def user_namespaces_allowed(mode: str) -> bool:
    """An oracle independent of the sandbox: can util-linux's unshare(1) make a user namespace in this mode?"""
    if "no namespaces" in mode or "without namespaces" in mode:
        return False
    if mode.startswith("root") and "CAP_SYS_ADMIN" not in mode and cap_sys_admin():
        return True  # no user namespace needed
    check = ["unshare", "--user", "--map-root-user", "--net", "--mount", "--pid", "--fork", "true"]
    if mode.startswith("root"):
        return runs(["capsh", "--drop=cap_sys_admin", "--", "-c", shlex.join(check)])
    return runs(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *check])


@pytest.fixture(scope="module")
def package():
    """A copy of the sandbox package and of pyseccomp (one module) that uid 65534 can import."""
    import pyseccomp

    base = tempfile.mkdtemp(prefix="trl-ext-sandbox-modes-", dir="/tmp")
    shutil.copytree(REPO / "trl_ext" / "sandbox", Path(base) / "sandbox", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(pyseccomp.__file__, base)
    for parent, _dirs, files in os.walk(base):
        os.chmod(parent, 0o755)
        for name in files:
            os.chmod(os.path.join(parent, name), 0o644)
    yield base
    shutil.rmtree(base)


@pytest.fixture(scope="module")
def targets():
    """What a snippet must not reach: TCP and UDP listeners on 127.0.0.1, an abstract Unix socket, a process of
    uid 65534."""
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(8)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract.bind(f"\0trl-ext-modes-{uuid.uuid4().hex[:8]}")
    abstract.listen(8)
    for sock in (tcp, udp, abstract):
        sock.setblocking(False)
    bystander = subprocess.Popen(["sleep", "600"], user=NOBODY, group=NOBODY, extra_groups=[])
    yield {"tcp": tcp, "udp": udp, "abstract": abstract, "bystander": bystander}
    bystander.kill()
    bystander.wait()
    for sock in (tcp, udp, abstract):
        sock.close()


def reached(targets) -> list[str]:
    hits = []
    for name in ("tcp", "udp", "abstract"):
        try:
            targets[name].recv(1) if name == "udp" else targets[name].accept()[0].close()
            hits.append(name)
        except BlockingIOError:
            pass
    return hits


@pytest.mark.parametrize("mode", list(MODES))
def test_every_mode_isolates_what_it_says_or_refuses(mode, package, targets):
    prefix, quoted, chroot = MODES[mode]
    if NO_SYS_ADMIN in prefix and not shutil.which("capsh"):
        pytest.skip("capsh missing here (apt-get install libcap2-bin): cannot drop CAP_SYS_ADMIN")
    if chroot and not runs(["unshare", "-m", "true"]):
        pytest.skip("cannot make the chroot here (needs CAP_SYS_ADMIN and util-linux unshare)")
    marker = f"/tmp/trl-ext-modes-{uuid.uuid4().hex[:8]}"
    args = [
        targets["tcp"].getsockname()[1],
        targets["udp"].getsockname()[1],
        targets["abstract"].getsockname().decode(),
        targets["bystander"].pid,
        ADD_KEY,
        KEYCTL,
        marker,
    ]
    env = f"env -i PYTHONPATH={package} PATH=/usr/bin:/bin HOME=/" + (
        " PROBE_NO_LIBSECCOMP=1" if "libseccomp" in mode else ""
    )
    probe = f"{env} {sandbox_interpreter()} -s -c {shlex.quote(PROBE)} {shlex.quote(json.dumps(args))}"
    shell = prefix + (shlex.quote(probe) if quoted else probe)
    command = ["unshare", "-m", "--propagation", "private", "sh", "-c", shell] if chroot else ["sh", "-c", shell]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd="/")
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.splitlines()[-1])
    info, attacks, refused = outcome["info"], outcome["attacks"], outcome["refused"]

    # Refused unless every layer is there; opted in, the report says which mode it is and what is missing.
    complete = user_namespaces_allowed(mode) and "libseccomp" not in mode
    if complete:
        assert refused is None and info["missing"] == [], (refused, info["missing"])
        expected = "user namespace"
        if mode.startswith("root"):  # this process's own root gets a user namespace too when it lacks CAP_SYS_ADMIN
            expected = "root" if mode == "root" and cap_sys_admin() else "root (user namespace)"
        assert info["mode"] == expected and {"network", "mount", "pid", "ipc"} <= set(info["namespaces"])
    else:
        assert refused and "TRL_EXT_SANDBOX_ALLOW_UNISOLATED=1" in refused and "allow_unisolated=True" in refused
        assert info["missing"]
    if "libseccomp" in mode:
        assert any("libseccomp unavailable" in m and "AF_VSOCK" in m for m in info["missing"]), info["missing"]
        assert "libseccomp" in refused
    if "no namespaces" in mode or "without namespaces" in mode:
        assert info["mode"] == "unisolated (opted in)" and info["namespaces"] == []
        assert any(m.startswith("network") for m in info["missing"])

    # What a snippet reaches, in every mode.
    assert reached(targets) == []
    for name in ("tcp", "udp", "abstract"):
        assert attacks[name], (name, attacks)
    assert not os.path.exists(marker)  # its own /tmp, or (no namespaces) Landlock
    if outcome["secret"] is not None and ADD_KEY is not None:
        assert attacks["keyring"], attacks  # a fresh session keyring, with or without a filter
    if "libseccomp" not in mode:
        assert attacks["vsock"], attacks
    if any("may signal" in m for m in info["missing"]):  # opted in without a filter or Landlock ABI 6: said so
        assert mode == "not root, no namespaces" and "seccomp" not in info["privileges"]
    else:
        assert attacks["bystander"] and targets["bystander"].poll() is None, attacks
        assert outcome["sleeper"] == "alive"

    # The uid the snippets run as.
    uids = outcome["uids"]
    if mode == "root without namespaces":  # one of its own per execution: it can signal no other process
        low, high = (int(x) for x in info["uid"].split(" ")[0].split(".."))
        assert all(low <= uid <= high for uid in uids) and uids[0] != uids[1]
    else:
        assert uids == [NOBODY, NOBODY] and info["uid"] == NOBODY
