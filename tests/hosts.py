"""Two hosts on this one machine, for launches across hosts.

Each host is a network namespace with a hosts file, a hostname and an sshd
of its own:

    hostA 10.213.0.1 [hvd0] <--- veth ---> [hvd0] 10.213.0.2 hostB

The veth ends have the same name on both hosts, so `--network-interface hvd0`
names the link everywhere. `ip netns exec` bind-mounts /etc/netns/<namespace>/hosts
over /etc/hosts, so the host names resolve inside the namespaces only. A
command on a host also runs in a UTS namespace of its own, whose hostname is
the host's name, as on a real machine: Gloo looks its hostname up to find its
address. Each sshd lets root log in with a key from a temporary directory;
the `ssh` on `Hosts.env`'s PATH runs the client with that key and a
known_hosts file of its own, leaving ~/.ssh alone. Leaving `two_hosts()`
stops every process on the hosts and removes the namespaces (with the veth)
and the files it made; it leaves /run/sshd, which sshd needs and its own
service makes.

    with two_hosts() as pair:
        a, b = pair.hosts
        launch.run(a.command(["horovodrun", "-H", f"{a.name}:1,{b.name}:1", ...]),
                   env=pair.env)
"""

import contextlib
import dataclasses
import os
import pathlib
import shutil
import signal
import tempfile

import launch

SSHD = pathlib.Path("/usr/sbin/sshd")
INTERFACE = "hvd0"
NETWORK = (("hostA", "10.213.0.1"), ("hostB", "10.213.0.2"))
PREFIX = 24
TIMEOUT = 30  # seconds for any one set-up step


class Unavailable(Exception):
    """This machine cannot make the hosts; the message says why."""


@dataclasses.dataclass(frozen=True)
class Host:
    name: str
    address: str
    namespace: str

    def command(self, args):
        """`args` as a command run on this host: in its network namespace,
        under its own hostname."""
        return ["ip", "netns", "exec", self.namespace, "unshare", "--uts",
                "sh", "-c", 'hostname "$0" && exec "$@"', self.name, *map(str, args)]


@dataclasses.dataclass(frozen=True)
class Hosts:
    hosts: tuple    # of Host
    env: dict   # for the launcher: PATH with the `ssh` that uses the hosts' key


@contextlib.contextmanager
def two_hosts():
    """Makes the two hosts (raising Unavailable if this machine cannot), yields
    Hosts, then removes everything it made."""
    if os.geteuid() != 0:
        raise Unavailable("network namespaces need root")
    if not SSHD.is_file():
        raise Unavailable(f"no {SSHD}: install openssh-server (scripts/install.sh does)")
    hosts = tuple(Host(name, address, f"hvdtrain-{name.lower()}-{os.getpid()}")
                  for name, address in NETWORK)
    directory = pathlib.Path(tempfile.mkdtemp(prefix="hvdtrain-hosts-"))
    sshds = []
    try:
        _network(hosts)
        bin_dir = _keys(directory)
        for host in hosts:
            sshds.append(_start_sshd(host, directory))
        pair = Hosts(hosts, {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
        # The whole chain (names, routes, keys, each sshd) works, or set-up fails here.
        for source, target in ((hosts[0], hosts[1]), (hosts[1], hosts[0])):
            _run(source.command(["ssh", target.name, "true"]), env=pair.env)
        yield pair
    finally:
        _remove(hosts, sshds, directory)


def _run(args, env=None):
    result = launch.run(args, timeout=TIMEOUT, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))} failed: {result.stderr.strip()}")
    return result


def _network(hosts):
    a, b = hosts
    for host in hosts:
        added = launch.run(["ip", "netns", "add", host.namespace], timeout=TIMEOUT)
        if added.returncode != 0:
            raise Unavailable(f"`ip netns add` failed: {added.stderr.strip()}")
    _run(["ip", "link", "add", INTERFACE, "netns", a.namespace, "type", "veth",
          "peer", "name", INTERFACE, "netns", b.namespace])
    names = "".join(f"{host.address} {host.name}\n" for host in hosts)
    for host in hosts:
        _run(["ip", "-n", host.namespace, "address", "add", f"{host.address}/{PREFIX}",
              "dev", INTERFACE])
        for interface in ("lo", INTERFACE):
            _run(["ip", "-n", host.namespace, "link", "set", interface, "up"])
        etc = pathlib.Path("/etc/netns") / host.namespace
        etc.mkdir(parents=True)
        (etc / "hosts").write_text(f"127.0.0.1 localhost\n{names}")


def _keys(directory):
    """A host key, a client key allowed to log in, the client's config and
    the `ssh` that uses it; returns the directory holding that `ssh`."""
    for key in ("host_key", "client_key"):
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", directory / key])
    shutil.copy(directory / "client_key.pub", directory / "authorized_keys")
    (directory / "ssh_config").write_text(
        "Host *\n"
        f"  IdentityFile {directory}/client_key\n"
        "  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {directory}/known_hosts\n"
        "  StrictHostKeyChecking accept-new\n"
        "  BatchMode yes\n"
        f"  ConnectTimeout {TIMEOUT}\n"
        "  LogLevel ERROR\n")
    bin_dir = directory / "bin"
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {directory}/ssh_config "$@"\n')
    ssh.chmod(0o755)
    return bin_dir


def _start_sshd(host, directory):
    config = directory / f"sshd_config.{host.name}"
    pid_file = directory / f"sshd.{host.name}.pid"
    config.write_text(
        f"ListenAddress {host.address}\n"
        f"HostKey {directory}/host_key\n"
        f"AuthorizedKeysFile {directory}/authorized_keys\n"
        f"PidFile {pid_file}\n"
        "PermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        # The keys' parent directories include /tmp, which StrictModes refuses.
        "StrictModes no\n")
    # sshd's privilege-separation directory.
    pathlib.Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    log = directory / f"sshd.{host.name}.log"
    sshd = launch.start(host.command([SSHD, "-D", "-e", "-f", config]), log)
    # sshd writes its pid file once it listens.
    if not launch.wait_until(lambda: pid_file.exists() or sshd.poll() is not None, TIMEOUT,
                             interval=0.05) or not pid_file.exists():
        raise RuntimeError(f"sshd on {host.name} did not start: {log.read_text()}")
    return sshd


def _remove(hosts, sshds, directory):
    def running():
        for sshd in sshds:
            sshd.poll()  # reaps it once it exits
        return [int(pid) for host in hosts for pid in launch.run(
            ["ip", "netns", "pids", host.namespace], timeout=TIMEOUT).stdout.split()]

    # Every process on the hosts: the sshds, and the ranks of a launch that
    # failed. SIGTERM first, so that shells run their exit traps (which
    # remove lock files that root's ~/.bashrc may take at each ssh login).
    for signum in (signal.SIGTERM, signal.SIGKILL):
        for pid in running():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        if launch.wait_until(lambda: not running(), TIMEOUT / 2, interval=0.1):
            break
    for sshd in sshds:
        sshd.wait(TIMEOUT)
    for host in hosts:
        launch.run(["ip", "netns", "delete", host.namespace], timeout=TIMEOUT)
        shutil.rmtree(pathlib.Path("/etc/netns") / host.namespace, ignore_errors=True)
    with contextlib.suppress(OSError):  # only when no other namespace has files there
        pathlib.Path("/etc/netns").rmdir()
    shutil.rmtree(directory, ignore_errors=True)
