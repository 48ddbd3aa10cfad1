"""deploy/ and the Procfile as an ops engineer uses them: systemd's own verifier on the units, the Procfile's
commands, and Celery's own `inspect ping` answered by a running executor (real Redis, real executor)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent_helpers import BACKEND, Agent, lab, nat_host, register
from tests.lifecycle_helpers import ROOT, TERMINAL, Services, make_project, started
from tests.nginx import Nginx, free_port
from tests.sshd import ALIAS, Sshd

DEPLOY = ROOT / "deploy"
VENV_BIN = Path(sys.executable).parent


@pytest.mark.parametrize("unit", sorted(p.name for p in DEPLOY.glob("*.service")))
def test_each_unit_passes_systemd_analyze_verify(unit: str, tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze is needed to verify the units (Debian: systemd)")
    env = tmp_path / "potato-queue.env"
    shutil.copy(DEPLOY / "potato-queue.env", env)
    # Where this checkout is installed, instead of /opt/potato-queue; the units are otherwise as shipped.
    text = (DEPLOY / unit).read_text().replace("/opt/potato-queue/.venv/bin", str(VENV_BIN))
    text = text.replace("/etc/potato-queue/potato-queue.env", str(env)).replace("User=potato", "User=root")
    text = text.replace("Group=potato", "Group=root")
    copy = tmp_path / unit.replace("@", "@test")
    copy.write_text(text)
    done = subprocess.run(
        ["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    problems = [line for line in done.stderr.splitlines() if str(copy.name) in line or "potato" in line]
    assert done.returncode == 0 and problems == [], done.stderr
    assert "Restart=on-failure" in text and "NoNewPrivileges=yes" in text and "ProtectSystem=strict" in text


def test_the_procfile_names_real_commands() -> None:
    processes = dict(line.split(": ", 1) for line in (ROOT / "Procfile").read_text().splitlines() if line.strip())
    assert set(processes) == {"web", "executor", "beat"}
    for command in processes.values():
        words = command.split()
        assert words[0] == "potato-queue"
        done = subprocess.run(
            [str(VENV_BIN / "potato-queue"), words[1], "--help"], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr


def test_celery_inspect_ping_answers_from_a_running_executor(tmp_path: Path, redis_server_url: str) -> None:
    with started(tmp_path, redis_server_url) as svc:
        env = {**os.environ, "POTATO_CONFIG": str(svc.config), "POTATO_QUEUE_REDIS_URL": redis_server_url}
        for _ in range(10):  # the executor may still be starting
            done = subprocess.run(
                [str(VENV_BIN / "celery"), "-A", "potato_queue.celery_entry", "inspect", "ping", "--timeout", "5"],
                capture_output=True,
                text=True,
                timeout=60,
                env=env,
                cwd=tmp_path,
            )
            if done.returncode == 0:
                break
        assert done.returncode == 0, done.stdout + done.stderr
        assert re.search(r"->\s+\S+: OK\s+pong", done.stdout), done.stdout


def test_behind_the_shipped_nginx_with_tls_agent_and_ssh_runs_succeed(
    tmp_path: Path, redis_server_url: str, sshd: Sshd
) -> None:
    """The deployment as shipped: `serve` on 127.0.0.1 with an https --public-url (the web unit's command line),
    deploy/nginx.conf in front with TLS. Before, the server recorded the public https URL for its executors as
    well, so every ssh (and slurm) run failed at its forward; the agent behind NAT reaches the server through
    nginx, the ssh host through its forward to the bound address."""
    with nat_host() as nat:
        upstream = free_port("127.0.0.1")
        proxy = Nginx(tmp_path / "nginx", nat.host_ip, upstream)
        sshd.write_config("root")
        backends = {
            "gpu": {
                "type": "ssh",
                "host": ALIAS,
                "python": "/usr/bin/python3",
                "gpus": "none",
                "remote_dir": str(tmp_path / "remote"),
            },
            **lab()["backends"],
        }
        svc = Services(make_project(tmp_path, backends=backends), redis_server_url, tmp_path)
        try:
            svc.serve("127.0.0.1", "--port", str(upstream), "--public-url", proxy.url)
            assert svc.url == proxy.url
            svc.ssl_context = proxy.ssl_context()
            svc.executor(env={"POTATO_QUEUE_SSH_CONFIG": str(sshd.config)})
            over_ssh = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend="gpu")
            assert svc.wait_for(over_ssh, TERMINAL, 120)["state"] == "succeeded", svc.logs()
            agent = Agent(nat, svc, register(svc), "--once", "--ca-file", str(proxy.ca))
            by_agent = svc.start_run(trainer="sklearn-text", schemas=["sentiment"], backend=BACKEND)
            assert svc.wait_for(by_agent, TERMINAL, 120)["state"] == "succeeded", agent.output()
            assert agent.wait() == 0
        finally:
            svc.stop()
            proxy.close()
