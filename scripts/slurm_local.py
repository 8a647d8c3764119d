#!/usr/bin/env python3
"""A single-node Slurm cluster on 127.0.0.1, for trying and testing ``tfdist-launch --emit slurm``.

Installs Debian's ``slurm-wlm`` and ``munge`` with apt-get when they are missing (needs root), writes a
slurm.conf into its own directory (its own munge key and socket, free ports, so it never touches a
system Slurm), starts munged, slurmctld and slurmd in the foreground of their own sessions, and waits
until ``sinfo`` shows the node idle. The node claims more CPUs than the machine has, so a few tasks
(and two small jobs) can share the cores.

    sudo python3 scripts/slurm_local.py start --dir /tmp/slurm   # prints: export SLURM_CONF=...
    export SLURM_CONF=/tmp/slurm/slurm.conf
    tfdist-launch --emit slurm --workers 2 -- python train.py > job.sbatch && sbatch --wait job.sbatch
    sudo python3 scripts/slurm_local.py stop --dir /tmp/slurm

The test fixture (tests/conftest.py ``slurm_cluster``) uses :func:`start` and :meth:`LocalSlurm.stop`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable

PACKAGES = ("slurm-wlm", "munge")
BINARIES = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "sinfo", "srun", "scontrol", "scancel", "squeue")
NODE = "localhost"
_SBIN = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")

CONF = """\
# Written by tfdist scripts/slurm_local.py: one node on 127.0.0.1, everything under {dir}.
ClusterName=tfdist
# Job ids start here: two local clusters on one machine given distinct ranges never pick the same ports
# (tfdist's Slurm jobs take their port slot from the job id).
FirstJobId={first_job_id}
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={dir}/munge/munge.socket
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# No slurmdbd here: finished jobs are recorded (with their exit codes) in this file, and scontrol keeps
# them for MinJobAge seconds.
JobCompType=jobcomp/filetxt
JobCompLoc={dir}/jobcomp.txt
MinJobAge=900
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
KillWait=5
InactiveLimit=0
# The node claims {cpus} CPUs whatever the machine has, so a few TensorFlow tasks share its cores.
SlurmdParameters=config_overrides
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000 State=UNKNOWN
PartitionName=local Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


def _which(name: str) -> str | None:
    path = os.pathsep.join([os.environ.get("PATH", ""), *_SBIN])
    return shutil.which(name, path=path)


def missing_binaries() -> list[str]:
    """The Slurm and munge programs not installed here."""
    return [name for name in BINARIES if _which(name) is None]


def ensure_installed() -> str | None:
    """Installs slurm-wlm and munge with apt-get when missing; returns None, or why it could not."""
    if not missing_binaries():
        return None
    if shutil.which("apt-get") is None:
        return f"Slurm is not installed ({', '.join(missing_binaries())} missing) and there is no apt-get"
    if os.geteuid() != 0:
        return f"Slurm is not installed ({', '.join(missing_binaries())} missing) and apt-get needs root"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
            return f"apt-get could not install {' '.join(PACKAGES)}: '{' '.join(argv)}' exited {done.returncode}: {tail[0]}"
    if missing_binaries():
        return f"apt-get installed {' '.join(PACKAGES)} but {', '.join(missing_binaries())} are still missing"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalSlurm:
    """A running single-node Slurm cluster; ``env`` points Slurm's commands at it."""

    def __init__(self, directory: str, processes: dict[str, subprocess.Popen]) -> None:
        self.directory = directory
        self.processes = processes
        self.conf = os.path.join(directory, "slurm.conf")
        self.env = dict(os.environ, SLURM_CONF=self.conf)

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of every daemon's log, for failure messages."""
        out = []
        for name in ("munged.log", "slurmctld.log", "slurmd.log"):
            path = os.path.join(self.directory, name)
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    out.append(f"--- {name}\n" + "".join(f.readlines()[-lines:]))
        return "\n".join(out)

    def stop(self, grace: float = 15.0) -> None:
        """Cancels this cluster's jobs, then stops the daemons this object started, each by its own pid."""
        if all(self.processes.get(n) is not None and self.processes[n].poll() is None for n in ("slurmctld", "slurmd")):
            try:
                subprocess.run(
                    [_which("scancel") or "scancel", "--full", "--user", "root"],
                    env=self.env,
                    capture_output=True,
                    timeout=20,
                )
                deadline = time.monotonic() + grace
                while time.monotonic() < deadline:  # Their tasks end before slurmd does.
                    queue = subprocess.run(
                        [_which("squeue") or "squeue", "-h"], env=self.env, capture_output=True, text=True, timeout=20
                    )
                    if queue.returncode != 0 or not queue.stdout.strip():
                        break
                    time.sleep(0.5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.processes.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def _write_conf(directory: str, cpus: int, first_job_id: int) -> None:
    for sub in ("state", "spool", "munge"):
        os.makedirs(os.path.join(directory, sub), mode=0o700, exist_ok=True)
    text = CONF.format(
        dir=directory,
        node=NODE,
        cpus=cpus,
        ctld_port=_free_port(),
        slurmd_port=_free_port(),
        first_job_id=first_job_id,
    )
    with open(os.path.join(directory, "slurm.conf"), "w") as f:
        f.write(text)


def _spawn(argv: list[str], log: str) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )


def _node_state(env: dict[str, str]) -> str:
    done = subprocess.run(
        [_which("sinfo") or "sinfo", "-h", "-N", "-o", "%T"], env=env, capture_output=True, text=True, timeout=20
    )
    return done.stdout.strip() if done.returncode == 0 else ""


def start(directory: str, *, cpus: int = 8, timeout: float = 90.0, first_job_id: int = 1) -> LocalSlurm:
    """Starts munged, slurmctld and slurmd with their state in ``directory``; returns once the node is idle.

    Job ids start at ``first_job_id``: give local clusters that run at the same time ranges far apart.

    Raises:
      RuntimeError: A daemon died or the node did not become idle within ``timeout`` (the logs are in
        the message). Whatever was started is stopped first.
    """
    directory = os.path.abspath(directory)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)  # munged refuses directories others can write to.
    _write_conf(directory, cpus, first_job_id)
    munge = os.path.join(directory, "munge")
    key = os.path.join(munge, "munge.key")
    if not os.path.exists(key):
        subprocess.run(
            [_which("mungekey") or "mungekey", "--create", "--keyfile", key],
            check=True,
            capture_output=True,
            timeout=60,
        )
    os.chmod(key, 0o600)
    conf = os.path.join(directory, "slurm.conf")
    processes: dict[str, subprocess.Popen] = {}
    cluster = LocalSlurm(directory, processes)
    try:
        processes["munged"] = _spawn(
            [
                _which("munged") or "munged",
                "--foreground",
                "--force",
                f"--key-file={key}",
                f"--socket={munge}/munge.socket",
                f"--pid-file={munge}/munged.pid",
                f"--seed-file={munge}/munge.seed",
                f"--log-file={directory}/munged.log",
            ],
            os.path.join(directory, "munged.out"),
        )
        _wait_for(lambda: os.path.exists(f"{munge}/munge.socket"), 20, "munged socket", cluster)
        processes["slurmctld"] = _spawn(
            [_which("slurmctld") or "slurmctld", "-D", "-i", "-f", conf], os.path.join(directory, "slurmctld.out")
        )
        processes["slurmd"] = _spawn(
            [_which("slurmd") or "slurmd", "-D", "-N", NODE, "-f", conf], os.path.join(directory, "slurmd.out")
        )
        _wait_for(lambda: _node_state(cluster.env) == "idle", timeout, "node idle in sinfo", cluster)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait_for(ready: Callable[[], bool], timeout: float, what: str, cluster: LocalSlurm) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dead = [name for name, proc in cluster.processes.items() if proc.poll() is not None]
        if dead:
            raise RuntimeError(f"{', '.join(dead)} exited while waiting for {what}\n{cluster.log_tail()}")
        if ready():
            return
        time.sleep(0.5)
    raise RuntimeError(f"no {what} after {timeout:.0f}s\n{cluster.log_tail()}")


def _stop_dir(directory: str) -> int:
    """Stops the daemons recorded by pid files in ``directory`` (for the command line)."""
    stopped = 0
    for pidfile in ("slurmd.pid", "slurmctld.pid", "munge/munged.pid"):
        path = os.path.join(directory, pidfile)
        try:
            with open(path) as f:
                pid = int(f.read().strip())
            os.kill(pid, signal.SIGTERM)
            stopped += 1
        except (OSError, ValueError):
            continue
    return stopped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A single-node Slurm cluster on 127.0.0.1.")
    parser.add_argument("action", choices=("start", "stop"))
    parser.add_argument("--dir", default="/tmp/tfdist-slurm", help="state, logs and slurm.conf go here")
    parser.add_argument("--cpus", type=int, default=8, help="CPUs the node claims (default 8)")
    parser.add_argument("--first-job-id", type=int, default=1, help="the first job id (default 1)")
    args = parser.parse_args(argv)
    if args.action == "stop":
        print(f"stopped {_stop_dir(args.dir)} daemon(s)")
        return 0
    reason = ensure_installed()
    if reason:
        print(f"slurm_local: {reason}", file=sys.stderr)
        return 1
    try:
        cluster = start(args.dir, cpus=args.cpus, first_job_id=args.first_job_id)
    except RuntimeError as err:
        print(f"slurm_local: {err}", file=sys.stderr)
        return 1
    print(f"export SLURM_CONF={cluster.conf}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
