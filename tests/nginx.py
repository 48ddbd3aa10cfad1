"""A real nginx (Debian's package) in front of `potato-queue serve`, with deploy/nginx.conf as shipped.

Only what names this machine changes: the certificate (a CA made here signs one for the listen address),
the listen addresses and the upstream's port. Everything else (TLS, the long-poll timeouts, the body
limits, the locations) is the shipped file, so a test through it tests the deployment. Its own prefix,
pid and temp folders; close() stops it and waits.
"""

from __future__ import annotations

import re
import shutil
import socket
import ssl
import subprocess
import time
from pathlib import Path

import pytest

from tests.lifecycle_helpers import ROOT

NGINX = "/usr/sbin/nginx"
SHIPPED = ROOT / "deploy" / "nginx.conf"

MAIN = """daemon off;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
worker_processes 1;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    include {prefix}/site.conf;
}}
"""


def tls_files(folder: Path, ip: str) -> tuple[Path, Path, Path]:
    """A CA made here, and a certificate it signed for `ip`: (ca, cert, key)."""
    ca_key, ca, key, csr, cert = (folder / n for n in ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem"))
    ext = folder / "san.ext"
    ext.write_text(f"subjectAltName=IP:{ip}\n")
    for argv in (
        [
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            ca_key,
            "-out",
            ca,
            "-days",
            "2",
            "-subj",
            "/CN=potato-queue test CA",
        ],
        ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", f"/CN={ip}"],
        [
            "x509",
            "-req",
            "-in",
            csr,
            "-CA",
            ca,
            "-CAkey",
            ca_key,
            "-CAcreateserial",
            "-out",
            cert,
            "-days",
            "2",
            "-extfile",
            ext,
        ],
    ):
        subprocess.run(["openssl", *map(str, argv)], check=True, capture_output=True, timeout=60)
    return ca, cert, key


def free_port(ip: str) -> int:
    with socket.socket() as sock:
        sock.bind((ip, 0))
        return int(sock.getsockname()[1])


def site_conf(ip: str, https_port: int, http_port: int, upstream_port: int, cert: Path, key: Path) -> str:
    """deploy/nginx.conf with this machine's names; a ValueError when the shipped file no longer has them."""
    text, count = SHIPPED.read_text(), 0
    for pattern, value in (
        (r"listen 443 ssl", f"listen {ip}:{https_port} ssl"),
        (r"listen 80;", f"listen {ip}:{http_port};"),
        (r"server 127\.0\.0\.1:8000;", f"server 127.0.0.1:{upstream_port};"),
        (r"ssl_certificate +\S+;", f"ssl_certificate {cert};"),
        (r"ssl_certificate_key +\S+;", f"ssl_certificate_key {key};"),
    ):
        text, found = re.subn(pattern, value, text)
        count += bool(found)
    if count != 5:
        raise ValueError("deploy/nginx.conf no longer has the lines this harness adapts")
    return text


class Nginx:
    """nginx on ip:https_port (TLS, the shipped site) proxying to 127.0.0.1:upstream_port."""

    def __init__(self, folder: Path, ip: str, upstream_port: int) -> None:
        if not Path(NGINX).exists() or shutil.which("openssl") is None:
            pytest.fail("the deployment's test needs nginx and openssl: apt-get install nginx-light openssl")
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.ip = folder, ip
        self.ca, cert, key = tls_files(folder, ip)
        self.port = free_port(ip)
        (folder / "site.conf").write_text(site_conf(ip, self.port, free_port(ip), upstream_port, cert, key))
        (folder / "nginx.conf").write_text(MAIN.format(prefix=folder))
        check = subprocess.run(
            [NGINX, "-t", "-p", str(folder), "-c", str(folder / "nginx.conf")],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert check.returncode == 0, check.stderr
        self.proc = subprocess.Popen(
            [NGINX, "-p", str(folder), "-c", str(folder / "nginx.conf")],
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._wait_listening()

    @property
    def url(self) -> str:
        return f"https://{self.ip}:{self.port}"

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))

    def _wait_listening(self, timeout_s: float = 20) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.folder / "error.log").read_text()
            try:
                socket.create_connection((self.ip, self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"nginx did not listen on {self.url}: {(self.folder / 'error.log').read_text()}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
