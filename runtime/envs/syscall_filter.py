"""The jail's system-call filters: the kernel features a namespace does not cover, refused with seccomp.

A PID, network and mount namespace leaves some doors open: the kernel keyrings (keys outlive the jail, are shared
between uids and with the trainer's session keyring), address families the network namespace does not confine
(AF_VSOCK reaches the hypervisor on Firecracker, Kata or Nitro guests; netlink carries the host's uevents), io_uring,
and, for a root trainer, user namespaces of the program's own (in which it may mount a tmpfs past `file_mb`). The
filters are written as libseccomp rules (through `pyseccomp`, which drives Debian's libseccomp2 by ctypes) and
exported as BPF, for the native architecture only: a system call of another ABI (i386's `int 0x80`, x32) kills
the process, so the family test of `socket` cannot be bypassed through `socketcall`.

Two filters stack. `jail()` is bubblewrap's `--seccomp`, on everything in the jail, the supervisor included; it lets
one keyring call through, joining a fresh anonymous session keyring, which the supervisor does first, and user
namespaces, one of which a root trainer's supervisor makes for the program. `program()` is what the supervisor
loads just before the program starts: no keyring call at all, no user namespace, no inotify.
"""

from __future__ import annotations

import errno
import functools
import socket
import tempfile

try:  # it loads libseccomp through ctypes at import, and raises where the library is missing
    import pyseccomp
except (ImportError, RuntimeError, OSError) as exc:
    pyseccomp, _MISSING = None, f"{type(exc).__name__}: {exc}"

KEYCTL_JOIN_SESSION_KEYRING = 1
CLONE_NEWUSER = 0x10000000
# Local sockets and IP, which the jail's network namespace confines; every other family is refused.
FAMILIES = (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6)


class FilterUnavailable(RuntimeError):
    """libseccomp cannot be loaded here (the message says what to install)."""


def _seccomp():
    if pyseccomp is None:
        raise FilterUnavailable(
            f"the jail's seccomp filter needs libseccomp and pyseccomp ({_MISSING}): install libseccomp2 "
            "(Debian/Ubuntu: apt-get install libseccomp2; Fedora: dnf install libseccomp) and pip install pyseccomp "
            "(in rlc's runtime extra)"
        )
    return pyseccomp


def _new():
    sc = _seccomp()
    return sc, sc.SyscallFilter(sc.ALLOW)


def _export(flt) -> bytes:
    with tempfile.TemporaryFile() as f:
        flt.export_bpf(f)
        f.seek(0)
        return f.read()


def _refuse_keys(sc, flt, *, join: bool) -> None:
    eperm = sc.ERRNO(errno.EPERM)
    flt.add_rule(eperm, "add_key")
    flt.add_rule(eperm, "request_key")  # also the upcalls (dns_resolver) a host with keyutils would run as root
    if not join:
        flt.add_rule(eperm, "keyctl")
        return
    flt.add_rule(eperm, "keyctl", sc.Arg(0, sc.NE, KEYCTL_JOIN_SESSION_KEYRING))
    flt.add_rule(eperm, "keyctl", sc.Arg(0, sc.EQ, KEYCTL_JOIN_SESSION_KEYRING), sc.Arg(1, sc.NE, 0))


@functools.cache
def jail() -> bytes:
    """BPF for bwrap's --seccomp: keyrings (but joining an anonymous session keyring), address families but UNIX and
    IP, and io_uring refused in the whole jail."""
    sc, flt = _new()
    _refuse_keys(sc, flt, join=True)
    # The family is compared as the 64-bit register: a value with high bits set is >= the largest allowed, refused.
    refused = [f for f in range(max(FAMILIES)) if f not in FAMILIES]
    for family in refused:
        flt.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), "socket", sc.Arg(0, sc.EQ, family))
    flt.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), "socket", sc.Arg(0, sc.GT, max(FAMILIES)))
    for name in ("io_uring_setup", "io_uring_enter", "io_uring_register"):
        flt.add_rule(sc.ERRNO(errno.ENOSYS), name)  # libraries fall back to plain reads and writes
    return _export(flt)


@functools.cache
def program() -> bytes:
    """BPF the supervisor loads for the program, on top of the jail's: no keyring call, no new user namespace."""
    sc, flt = _new()
    _refuse_keys(sc, flt, join=False)
    eperm = sc.ERRNO(errno.EPERM)
    flt.add_rule(eperm, "unshare", sc.Arg(0, sc.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER))
    # clone's flags are its first argument on x86-64 and arm64 (the second on s390, which rlc does not run on).
    flt.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER))
    # clone3 keeps its flags in memory a filter cannot read: ENOSYS makes glibc fall back to clone.
    flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    # inotify on the read-only trees the jail shares (the interpreter, site-packages) would see the trainer's and
    # other sandboxes' reads of them: a side channel, and a covert one between concurrent rollouts.
    for name in ("inotify_init", "inotify_init1"):
        if sc.resolve_syscall(sc.Arch.NATIVE, name) >= 0:  # arm64 has inotify_init1 only
            flt.add_rule(eperm, name)
    return _export(flt)


@functools.cache
def syscall_number(name: str) -> int:
    """The native number of a system call (the supervisor calls keyctl through libc's syscall())."""
    sc = _seccomp()
    return int(sc.resolve_syscall(sc.Arch.NATIVE, name))
