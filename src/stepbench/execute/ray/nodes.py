"""A torchrun job over several nodes of a Ray cluster: the entrypoint of its Ray job
(execute/ray/jobs.py), `python -m stepbench.execute.ray.nodes SPEC`.

It reserves a placement group of `nnodes` bundles with the STRICT_SPREAD strategy (each bundle on
its own node), asks the first bundle's node for its address and a free port (torchrun's static
rendezvous), then starts one task per bundle. Each task runs, on its node, what an SSH host runs
(`python -m stepbench.execute.hosts.hostside run`) with that node's torchrun command, and streams its
lines back (a Ray streaming generator). This process passes node 0's protocol lines through as
the job's output, then one "placed" line naming every node, one "ranks" line with every node's
rank states and one "exit" line, as hostside does for a job on one node.

Ray ends a task's worker and its direct children only; hostside (each task's child) ends its own
process group (torchrun, its ranks and their compile workers) when the task is cancelled, and dies
with the task's worker (PR_SET_PDEATHSIG) if the worker is killed. On SIGTERM (Ray's stop_job)
the tasks are cancelled and this process exits.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading

from stepbench.execute.hosts import hostside
from stepbench.execute.local import FRESH
from stepbench.execute.hosts.hostside import EXIT_EVENT, PLACED_EVENT, RANKS_EVENT, event_of
from stepbench.execute.ray.servers import join_as_job


def _free_port() -> dict:
    import socket

    import ray

    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return {"ip": ray.util.get_node_ip_address(), "port": port}


def _node(spec: dict, argv: list[str]):
    """On one node: hostside runs `argv`; yields the node's id, then each line it prints."""
    import ray

    from stepbench.process import die_with_parent

    yield json.dumps({"node_id": ray.get_runtime_context().get_node_id(),
                      "ip": ray.util.get_node_ip_address()})
    spec = dict(spec, argv=argv)
    proc = subprocess.Popen(hostside.command(sys.executable, "run", json.dumps(spec)),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            preexec_fn=die_with_parent)
    try:
        for line in proc.stdout:
            yield line.decode("utf-8", "replace").rstrip("\n")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)    # hostside ends the node's process group
        proc.wait()


def main(argv: list[str]) -> int:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from stepbench.execute.protocol import Job, Rendezvous, worker_command
    from stepbench.setup import Setup

    spec = json.loads(argv[0])
    nnodes, bundle, python = spec["nnodes"], spec["bundle"], spec["python"]
    job = Job(Setup.from_dict(spec["job"]["setup"]),
              measure_peak=spec["job"].get("measure_peak", True),
              probe=spec["job"].get("probe", False))
    node_spec = {k: spec[k] for k in ("env", "dirs", "cleanup", "rank_dir", "watch_stdin")}
    join_as_job()
    group = placement_group([bundle] * nnodes, strategy="STRICT_SPREAD")
    tasks, lock = [], threading.Lock()
    try:
        ray.get(group.ready())

        def on(index: int):
            return PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)

        first = ray.get(ray.remote(_free_port).options(num_cpus=0, scheduling_strategy=on(0))
                        .remote())
        endpoint = f"{first['ip']}:{first['port']}"
        node_task = ray.remote(_node)
        for index in range(nnodes):
            command = worker_command(python, job, Rendezvous(nnodes, index, endpoint))
            tasks.append(node_task.options(
                num_cpus=bundle.get("CPU", 0), num_gpus=bundle.get("GPU", 0),
                resources={k: v for k, v in bundle.items() if k not in ("CPU", "GPU")},
                scheduling_strategy=on(index)).remote(node_spec, command))
        nodes: list = [None] * nnodes
        ranks: list[dict] = []
        codes: list = [None] * nnodes

        def read(index: int) -> None:
            for n, ref in enumerate(tasks[index]):
                line = ray.get(ref)
                if n == 0:
                    with lock:
                        nodes[index] = json.loads(line)
                        if all(nodes):      # every node runs: the job's clock starts
                            print(json.dumps({"event": PLACED_EVENT, "nodes": nodes}), flush=True)
                    continue
                message = event_of(line)
                event = message.get("event") if message else None
                if event == PLACED_EVENT:
                    pass
                elif event == RANKS_EVENT:
                    ranks.extend(message.get("states") or [])
                elif event == EXIT_EVENT:
                    codes[index] = message.get("returncode")
                elif index == 0:
                    with lock:
                        print(line, flush=True)
                else:
                    print(f"node {index}: {line}", file=sys.stderr, flush=True)

        readers = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(nnodes)]
        for reader in readers:
            reader.start()
        for reader in readers:
            while reader.is_alive():
                reader.join(1.0)       # wakes for SIGTERM in this, the main thread
        failed = next((c for c in codes if c not in (0, None)), None)
        _say({"event": RANKS_EVENT, "states": sorted(ranks, key=lambda s: s.get("rank", 0))}, lock)
        _say({"event": EXIT_EVENT, "returncode": failed if failed is not None else codes[0],
              "start": FRESH}, lock)
        return 0
    finally:
        for task in tasks:
            ray.cancel(task)
        remove_placement_group(group)


def _say(message: dict, lock) -> None:
    with lock:
        print(json.dumps(message), flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
