"""A real OpenSSH server for the remote tests, on 127.0.0.1 at a free port.

Throwaway host and user keys, its own sshd_config (no PAM, keys only, the test folder's
authorized_keys), and an SSH client config whose aliases all lead to it: `alpha` and `beta` (two
hosts, one machine), `closed` (a port where nothing listens), `stranger` (a known_hosts that
lacks the server's key), `refused` (a key the server does not accept) and `trusting` (host key
checking turned off). Debian's openssh-server provides sshd (`.ci/run` installs it); where sshd
cannot be had the tests that need it are skipped.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import psutil
import pytest

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SSHServer:
    def __init__(self, folder: Path):
        if not os.access(SSHD, os.X_OK) or not shutil.which("ssh-keygen"):
            pytest.skip("OpenSSH's sshd is not installed (apt-get install openssh-server)")
        self.folder = folder
        for name in ("host_key", "user_key", "other_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name,
                            "-f", str(folder / name)], check=True)
        shutil.copy(folder / "user_key.pub", folder / "authorized_keys")
        if os.geteuid() == 0:
            # sshd started as root separates privileges into this folder, which Debian's init
            # scripts make at boot; a container that never ran them lacks it.
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        self.port = free_port()
        (folder / "sshd_config").write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {folder / 'host_key'}\n"
            f"PidFile {folder / 'sshd.pid'}\nAuthorizedKeysFile {folder / 'authorized_keys'}\n"
            "UsePAM no\nStrictModes no\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nPubkeyAuthentication yes\n"
            "PermitRootLogin prohibit-password\n"
            # One torch thread per setup, as the local tests run them (tests/conftest.py).
            "SetEnv OMP_NUM_THREADS=1\nLogLevel ERROR\n")
        self.log = open(folder / "sshd.log", "wb")
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(folder / "sshd_config")],
                                     stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self._wait_listening()
        host_key = (folder / "host_key.pub").read_text().split()
        (folder / "known_hosts").write_text(f"[127.0.0.1]:{self.port} {host_key[0]} {host_key[1]}\n")
        (folder / "empty_known_hosts").write_text("")
        user = getpass.getuser()
        common = f"  HostName 127.0.0.1\n  User {user}\n  IdentitiesOnly yes\n"
        self.config = folder / "ssh_config"
        self.config.write_text(
            f"Host alpha beta\n{common}  Port {self.port}\n  IdentityFile {folder / 'user_key'}\n"
            f"  UserKnownHostsFile {folder / 'known_hosts'}\n"
            f"Host closed\n{common}  Port {free_port()}\n  IdentityFile {folder / 'user_key'}\n"
            f"  UserKnownHostsFile {folder / 'known_hosts'}\n"
            f"Host stranger\n{common}  Port {self.port}\n  IdentityFile {folder / 'user_key'}\n"
            f"  UserKnownHostsFile {folder / 'empty_known_hosts'}\n"
            f"Host refused\n{common}  Port {self.port}\n  IdentityFile {folder / 'other_key'}\n"
            f"  UserKnownHostsFile {folder / 'known_hosts'}\n"
            f"Host trusting\n{common}  Port {self.port}\n  IdentityFile {folder / 'user_key'}\n"
            "  UserKnownHostsFile none\n")

    def _wait_listening(self, timeout_s: float = 15) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.flush()
                said = (self.folder / "sshd.log").read_text().strip()
                pytest.skip(f"sshd did not start here ({said or f'exit code {self.proc.returncode}'})")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"sshd did not listen on port {self.port} within {timeout_s} s")

    def drop_connections(self) -> int:
        """Kill the server's processes for every open connection, as a host that dies would
        vanish; the listener stays. Returns how many it killed."""
        children = psutil.Process(self.proc.pid).children()
        for child in children:
            child.kill()
        return len(children)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def processes_with(text: str) -> list[psutil.Process]:
    """This machine's processes whose command line contains `text`."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if text in " ".join(proc.info["cmdline"] or []):
            found.append(proc)
    return found
