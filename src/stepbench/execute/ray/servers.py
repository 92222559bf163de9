"""The process servers of a run on a Ray cluster (`--start server`, the default): the entrypoint
of one Ray job per run, `python -m stepbench.execute.ray.servers SPEC` (execute/ray/jobs.py).

On every host of the cluster (one per address: raylets that share a machine share its /tmp) an
actor pinned to one of its nodes runs `python -m stepbench.execute.hosts.hostside serve PATH PRELOAD`,
the process server an SSH host runs (execute/local/server.py): it imports torch and transformers once
and forks each setup's process there. A setup's job on that host finds it at PATH (the same on
every host) and asks it for its process (hostside run); where none answers, the process starts
fresh. This process prints one line {"event": "servers", "hosts": N}, then one "ready" or
"failed" line per host, then waits.

It ends when the run stops its job (Ray's stop_job, SIGTERM): the actors are killed, each server's
stdin ends (the actor held it), and the server ends the setups' processes it forked that still
run. Actors of a job that ended are ended by Ray too.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

STOP_S = 2.0    # Ray kills this process 3 s after stop_job's SIGTERM (RAY_JOB_STOP_WAIT_TIME_S)

def join_as_job() -> None:
    """Join the cluster as a Ray job's entrypoint, Ray job stop's SIGTERM then a
    KeyboardInterrupt, so that the job tidies up what it started before Ray kills it."""
    import ray

    def stop(signum, frame):
        raise KeyboardInterrupt(signum)

    ray.init(log_to_driver=False, configure_logging=False)
    # After ray.init, whose own SIGTERM handler would end this process before it tidies up.
    signal.signal(signal.SIGTERM, stop)


class _Serve:
    """A Ray actor: one host's process server, a child that lives while this actor does."""

    def __init__(self, path: str, preload: dict, cwd: str | None = None):
        from stepbench.execute.hosts import hostside

        self.proc = subprocess.Popen(hostside.command(sys.executable, "serve", path,
                                                      json.dumps(preload), *filter(None, [cwd])),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def stop(self) -> int:
        """End the server as its SSH host's ends: its stdin ends, it ends what it forked."""
        self.proc.stdin.close()
        return self.proc.wait()

    def ready(self) -> dict:
        line = self.proc.stdout.readline()
        try:
            return json.loads(line)
        except ValueError:
            return {"op": "failed", "error": f"the process server exited with code "
                                             f"{self.proc.wait()} before it was ready"}


def main(argv: list[str]) -> int:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    spec = json.loads(argv[0])
    join_as_job()
    hosts: dict[str, str] = {}
    for node in ray.nodes():
        if node.get("Alive"):
            hosts.setdefault(node["NodeManagerAddress"], node["NodeID"])
    print(json.dumps({"event": "servers", "hosts": len(hosts)}), flush=True)
    server = ray.remote(num_cpus=0)(_Serve)
    actors = {ip: server.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        node_id, soft=False)).remote(spec["path"], spec["preload"], spec.get("cwd"))
        for ip, node_id in hosts.items()}
    try:
        pending = {actor.ready.remote(): ip for ip, actor in actors.items()}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            ip = pending.pop(done[0])
            try:
                ready = ray.get(done[0])
            except Exception as exc:  # noqa: BLE001 - that host's setups start fresh
                ready = {"op": "failed", "error": str(exc).splitlines()[0]}
            event = "ready" if ready.get("op") == "ready" else "failed"
            print(json.dumps({"event": event, "ip": ip, "node_id": hosts[ip],
                              "imports_s": ready.get("imports_s"),
                              "error": ready.get("error")}), flush=True)
        while True:
            time.sleep(3600)        # until the run stops this job (SIGTERM)
    except KeyboardInterrupt:
        return 0
    finally:
        # Before the actors go: Ray would kill each actor's server outright, leaving what it
        # forked running.
        try:
            ray.get([actor.stop.remote() for actor in actors.values()], timeout=STOP_S)
        except Exception:  # noqa: BLE001 - a server that cannot be reached: its host's hostside
            pass           # processes end their own setups
        for actor in actors.values():
            ray.kill(actor)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
