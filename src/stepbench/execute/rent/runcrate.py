"""Runcrate as a provider of rented GPUs (execute/rent/rentals.py), through its official Python SDK
(`runcrate-sdk`, the `runcrate` extra).

Instances and SSH, not the SDK's jobs API: a job runs one command on a fresh machine and hands
its files back when it ends, so a study would either pay a machine start (and a cold install)
per setup or come back all at once at the end, with no live progress and nothing kept if the
machine dies half-way. An instance reached over SSH is exactly a `--host`: each record is
appended here the moment its setup ends, progress streams, resume works per machine, and one
machine runs the whole matrix.

The calls, as the SDK makes them (base URL www.runcrate.ai, or $RUNCRATE_BASE_URL):
  GET /api/v1/instances/types            prices (hourly_rate per instance type)
  GET, POST /api/v1/ssh-keys             find or register the SSH key
  POST /api/v1/instances                 create: gpu_type, gpu_count, ssh_key_id, max_runtime_minutes
  GET /api/v1/instances/{id}/status      poll until running with an ip
  GET /api/v1/instances/{id}             the running instance (price, region, address)
  GET /api/v1/instances?search=NAME      a create that got no answer
  DELETE /api/v1/instances/{id}          terminate
The instance's SSH login is root on port 22 (as Runcrate's own CLI connects), unless the
instance says otherwise (`ssh_user`, `ssh_port`). The API key (RUNCRATE_API_KEY) goes to the SDK
only; every message from here has it redacted.
"""

from __future__ import annotations

import base64
import hashlib
import os
import threading
import time

from stepbench.errors import UserError, first_line
from stepbench.execute.rent.providers import (POLL_FIRST_S, POLL_MAX_S, Instance, Offer, ProviderError,
                                         RentError, RentSpec, api_key_from_env, redact)
from stepbench.execute.hosts.ssh import HostStopped

INSTALL_HINT = "pip install 'stepbench[runcrate]'"
READY = {"running", "deployed", "active", "ready"}
ENDED = {"failed", "error", "terminated", "terminating", "stopped", "stopping", "deleted",
         "cancelled", "canceled"}
# What to do about an HTTP status, after the provider's own message.
HINTS = {401: "check RUNCRATE_API_KEY", 402: "add credits or raise the environment's budget",
         403: "the API key may not do this; check its permissions"}


def require_sdk():
    try:
        import runcrate
    except ImportError:
        raise UserError(f"--rent runcrate needs Runcrate's SDK: {INSTALL_HINT}") from None
    return runcrate


def make_provider() -> "Runcrate":
    runcrate = require_sdk()
    key = api_key_from_env("RUNCRATE_API_KEY", "Runcrate dashboard, API keys; it starts with "
                           "rc_live_")
    try:
        client = runcrate.Runcrate(api_key=key, base_url=os.environ.get("RUNCRATE_BASE_URL") or None)
    except ValueError:      # the SDK's own check of the key's form; its message never holds it
        raise UserError("RUNCRATE_API_KEY is not a Runcrate API key (those start with "
                        "rc_live_); copy it again from the dashboard") from None
    return Runcrate(client, key)


class Runcrate:
    """The Provider protocol on Runcrate's SDK (sync client: each host thread calls it)."""

    name = "runcrate"

    def __init__(self, client, key: str):
        self.client, self._key = client, key
        self.sdk = require_sdk()

    # -- every call goes through here ----------------------------------------------------

    def _call(self, what: str, fn, *args, **kwargs):
        sdk = self.sdk
        try:
            return fn(*args, **kwargs)
        except sdk.ApiError as exc:
            hint = HINTS.get(exc.status_code)
            # A 5xx may have been acted on before it failed; 4xx, 429 and 503 were not.
            maybe = exc.status_code >= 500 and exc.status_code != 503
            raise ProviderError(self._line(f"Runcrate {what}: {exc.message} (HTTP "
                                           f"{exc.status_code})" + (f"; {hint}" if hint else "")),
                                maybe_done=maybe) from None
        except sdk.RuncrateError as exc:       # no answer: a timeout or a lost connection
            raise ProviderError(self._line(f"Runcrate {what}: {exc.message}; check the network "
                                           "(and RUNCRATE_BASE_URL if set)"),
                                maybe_done=True) from None
        except ValueError as exc:              # pydantic: an answer the SDK cannot read
            raise ProviderError(self._line(f"Runcrate {what}: an answer the SDK cannot read "
                                           f"({first_line(str(exc))})")) from None

    def _line(self, text: str) -> str:
        return " ".join(redact(text, self._key).split())

    # -- the Provider protocol -------------------------------------------------------------

    def prices(self, gpu_type: str | None = None) -> list[Offer]:
        types = self._call("instance types", self.client.instances.list_types, gpu_type=gpu_type)
        return [Offer(t.gpu_type, t.gpu_count, t.hourly_rate, t.region, t.id) for t in types]

    def register_key(self, public_key: str) -> str:
        fingerprint = _fingerprint(public_key)
        name = "stepbench-" + fingerprint.removeprefix("SHA256:")[:12].replace("/", "_") \
            .replace("+", "-")

        def registered():
            for key in self._call("SSH keys", self.client.ssh_keys.list):
                if key.name == name or (key.fingerprint or "").strip() in (
                        fingerprint, fingerprint.removeprefix("SHA256:"), _md5(public_key)):
                    return key.id
            return None

        found = registered()
        if found:
            return found
        try:
            return self._call("register SSH key", self.client.ssh_keys.create, name=name,
                              public_key=public_key).id
        except ProviderError as exc:
            if "HTTP 409" in str(exc):         # registered meanwhile, or under another name
                found = registered()
                if found:
                    return found
            raise

    def create(self, spec: RentSpec, name: str, key_id: str, *, max_runtime_minutes: int,
               template: str | None) -> Instance:
        made = self._call(f"create {spec.gpu_type} instance", self.client.instances.create,
                          name=name, ssh_key_id=key_id, gpu_type=spec.gpu_type,
                          gpu_count=spec.gpu_count, max_runtime_minutes=max_runtime_minutes,
                          template=template)
        return self._instance(made)

    def wait(self, instance: Instance, timeout_s: float, stopping: threading.Event) -> Instance:
        deadline = time.monotonic() + timeout_s
        interval, status = POLL_FIRST_S, instance.status or "unknown"
        while True:
            state = self._call("instance status", self.client.instances.get_status, instance.id)
            status = (state.status or "unknown").lower()
            if status in READY and state.ip:
                ready = self._instance(self._call("instance", self.client.instances.get,
                                                  instance.id))
                ready.address = ready.address or state.ip
                ready.price_per_hour = ready.price_per_hour or instance.price_per_hour
                return ready
            if status in ENDED:
                raise RentError(f"instance {instance.id} ended before it was ready (status "
                                f"{status}); Runcrate's console may say why")
            left = deadline - time.monotonic()
            if left <= 0:
                raise RentError(f"instance {instance.id} was not ready after {timeout_s:g} s "
                                f"(last status: {status}); raise --rent-timeout, or try "
                                "another GPU type")
            if stopping.wait(min(interval, left)):
                raise HostStopped()
            interval = min(interval * 1.5, POLL_MAX_S)

    def delete(self, instance_id: str) -> None:
        try:
            self._call("delete instance", self.client.instances.terminate, instance_id)
        except ProviderError as exc:
            if "HTTP 404" not in str(exc):     # already gone (its maximum runtime ended)
                raise

    def find(self, name: str) -> list[str]:
        found = self._call("list instances", self.client.instances.list, search=name)
        return [i.id for i in found if i.name == name and (i.status or "").lower() not in ENDED]

    @staticmethod
    def _instance(made) -> Instance:
        extra = made.model_extra or {}
        return Instance(id=made.id, name=made.name, price_per_hour=made.cost_per_hour,
                        gpu_count=made.gpu_count, region=made.region, address=made.ip,
                        port=int(extra.get("ssh_port") or 22),
                        user=str(extra.get("ssh_user") or "root"), status=made.status)


def _fingerprint(public_key: str) -> str:
    blob = base64.b64decode(public_key.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def _md5(public_key: str) -> str:
    digest = hashlib.md5(base64.b64decode(public_key.split()[1])).hexdigest()
    return ":".join(digest[i:i + 2] for i in range(0, len(digest), 2))
