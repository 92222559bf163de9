"""A factory's signature read on the Ray cluster before any setup's job (execute/elsewhere.py),
for a package the nodes have and this machine does not: one short Ray job per factory, `python
-c` workload/sigreader.py with the model, its log read back as the setups' jobs' logs are
(jobs.py). It asks one CPU, as a CPU setup's job does; a cluster whose nodes differ in what they
have installed answers for the node Ray picks."""

from __future__ import annotations

import uuid
from pathlib import Path

from stepbench.execute.hosts.ssh import EventLoop, quote_command
from stepbench.execute.ray.jobs import delete_ended
from stepbench.workload import sigreader

WHERE = "on the Ray cluster"
READ_TIMEOUT_S = 120        # a job waits for a free CPU first; past this it goes unchecked


def read_signatures(cluster, settings, models: list[str]) -> dict:
    """model -> (WHERE, sigreader's fields), for each model a job answered; one that did not
    answer in READ_TIMEOUT_S (or that Ray refused) is left out, and goes unchecked."""
    python = cluster.local.python if cluster.local else "python"
    source = Path(sigreader.__file__).read_text()
    found = {}
    loop = EventLoop()
    try:
        for model in models:
            job_id = f"stepbench-signature-{uuid.uuid4().hex[:12]}"
            try:
                cluster.client.submit_job(entrypoint=quote_command([python, "-c", source, model]),
                                          submission_id=job_id, entrypoint_num_cpus=1,
                                          metadata={"stepbench": "signature"})
                output = loop.call(_log(cluster.client, job_id), timeout=READ_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - refused, or no answer in time: unchecked, said
                continue
            finally:
                _end(cluster, job_id)
            fields = sigreader.parse(output)
            if fields is not None:
                found[model] = (WHERE, fields)
    finally:
        loop.close()
    return found


async def _log(client, job_id: str) -> str:
    """The job's whole log, once it ends."""
    chunks = []
    logs = client.tail_job_logs(job_id)
    try:
        async for chunk in logs:
            chunks.append(chunk)
    finally:
        await logs.aclose()
    return "".join(chunks)


def _end(cluster, job_id: str) -> None:
    """Stop the job (where it still runs) and delete it once it ended (jobs.delete_ended: Ray
    deletes only ended jobs); a `--ray local` cluster ends with the run, its jobs with it."""
    if cluster.local is not None:
        return
    try:
        cluster.client.stop_job(job_id)
    except Exception:  # noqa: BLE001 - ended (or gone) meanwhile
        pass
    delete_ended(cluster.client, job_id)
