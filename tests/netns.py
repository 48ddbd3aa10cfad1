"""A machine behind NAT, for real: a network namespace joined to this host by a veth pair.

The server listens on the host side's address; processes started with
`NatHost.popen` run inside the namespace, where an nft table drops every new
inbound connection (the one-way firewall of a home router or a campus NAT),
and counts what it dropped. `cut()` drops everything both ways (a silent
network cut: connections hang, they are not refused); `restore()` undoes it.
Only addresses inside the namespace made here are ever targets
(a rule on the host's own addresses could cut this machine off). Needs root, iproute2 and nftables (`.ci/run` installs it).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import time
from typing import Any

__all__ = ["NatHost", "netns_missing"]

ONE_WAY = """
table inet pq_oneway {
  chain input {
    type filter hook input priority 0; policy accept;
    iif "lo" accept
    ct state established,related accept
    ct state new counter drop
  }
}
"""
CUT = """
table inet pq_cut {
  chain input { type filter hook input priority -10; policy drop; }
  chain output { type filter hook output priority -10; policy drop; }
}
"""

RESET = """
table inet pq_reset {{
  chain output {{ type filter hook output priority -20; policy accept; tcp dport {port} reject with tcp reset; }}
}}
"""


def netns_missing() -> str | None:
    """Why namespaces cannot be made here (a reason to skip), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install iproute2 nftables)"
    return None


def _sh(*args: str, input_text: str | None = None) -> str:
    proc = subprocess.run(args, input=input_text, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


class NatHost:
    """One namespace: `host_ip` is this side (where the server listens), `ip` the machine behind NAT."""

    def __init__(self) -> None:
        tag = secrets.token_hex(3)
        self.name = f"pq-{tag}"
        self.veth_host, self.veth_ns = f"pqh{tag}", f"pqa{tag}"
        # Disjoint ranges per pytest-xdist worker (gw0, gw1, ...): two namespaces made at once never share a /24.
        worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)
        subnet = 16 + 50 * (worker % 4) + int(tag[:2], 16) % 50
        self.host_ip, self.ip = f"10.201.{subnet}.1", f"10.201.{subnet}.2"

    def __enter__(self) -> NatHost:
        _sh("ip", "netns", "add", self.name)
        try:
            _sh("ip", "link", "add", self.veth_host, "type", "veth", "peer", "name", self.veth_ns)
            _sh("ip", "link", "set", self.veth_ns, "netns", self.name)
            _sh("ip", "addr", "add", f"{self.host_ip}/24", "dev", self.veth_host)
            _sh("ip", "link", "set", self.veth_host, "up")
            self.exec("ip", "addr", "add", f"{self.ip}/24", "dev", self.veth_ns)
            self.exec("ip", "link", "set", self.veth_ns, "up")
            self.exec("ip", "link", "set", "lo", "up")
            self.exec("nft", "-f", "-", input_text=ONE_WAY)
        except BaseException:
            self.__exit__()
            raise
        return self

    def exec(self, *args: str, input_text: str | None = None) -> str:
        return _sh("ip", "netns", "exec", self.name, *args, input_text=input_text)

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[str]:
        """A process inside the namespace (it sees only the veth and its own loopback)."""
        return subprocess.Popen(["ip", "netns", "exec", self.name, *argv], text=True, **kwargs)

    def refused_inbound(self) -> int:
        """New connections into the namespace that the one-way firewall dropped."""
        out = self.exec("nft", "list", "table", "inet", "pq_oneway")
        for line in out.splitlines():
            if "ct state new" in line and "counter packets" in line:
                return int(line.split("counter packets", 1)[1].split()[0])
        raise AssertionError(f"no counter in {out}")

    def cut(self) -> None:
        """Drop every packet both ways, silently."""
        self.exec("nft", "-f", "-", input_text=CUT)

    def restore(self) -> None:
        self.exec("nft", "delete", "table", "inet", "pq_cut")

    def slow(self, rate: str) -> None:
        """Shape what the host sends into the namespace to `rate` (tc tbf, e.g. "8mbit")."""
        _sh(
            "tc",
            "qdisc",
            "add",
            "dev",
            self.veth_host,
            "root",
            "tbf",
            "rate",
            rate,
            "burst",
            "32kbit",
            "latency",
            "400ms",
        )

    def reset_connections_from(self, port: int) -> None:
        """Reset every connection to the host's `port` as soon as the namespace sends on it (an ACK will do):
        the agent's side sees ECONNRESET at once, as when a proxy or a NAT box drops the connection."""
        self.exec("nft", "-f", "-", input_text=RESET.format(port=port))

    def stop_resetting(self) -> None:
        self.exec("nft", "delete", "table", "inet", "pq_reset")

    def pids(self) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.name], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def __exit__(self, *_: object) -> None:
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        # The host side first, then the namespace.
        subprocess.run(["ip", "link", "del", self.veth_host], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)
