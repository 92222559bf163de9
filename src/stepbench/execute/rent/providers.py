"""The seam between rented machines (execute/rent/rentals.py) and the clouds that rent them: what a provider
is asked (`Provider`) and what it answers (`Offer`, `Instance`, `ProviderError`). runcrate.py
implements it with Runcrate's SDK; another cloud (or SkyPilot) slots in the same way, named in
rent.PROVIDERS. Nothing here knows a particular provider.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Protocol

from stepbench.errors import UserError
from stepbench.execute.hosts.ssh import HostError

POLL_FIRST_S, POLL_MAX_S = 1.0, 10.0     # how often a provider's state is looked at, growing


class RentError(HostError):
    """A rented host cannot go on; the message is its one line (never holds the API key)."""


class ProviderError(Exception):
    """The provider refused or failed a call; the message is one line, the API key redacted.
    `maybe_done`: the call may have taken effect without an answer (a create that timed out)."""

    def __init__(self, message: str, maybe_done: bool = False):
        super().__init__(message)
        self.maybe_done = maybe_done


@dataclass(frozen=True)
class RentSpec:
    """One `--rent PROVIDER:GPU[:COUNT]`."""

    name: str           # as given: tags the records (their host), part of the resume key
    provider: str
    gpu_type: str       # the provider's label of the GPU ("L40S", "RTX 5090")
    gpu_count: int = 1


@dataclass(frozen=True)
class Offer:
    """One instance type a provider rents out, at its hourly price."""

    gpu_type: str
    gpu_count: int
    price_per_hour: float           # the whole instance, all its GPUs, dollars
    region: str | None = None
    id: str | None = None


@dataclass
class Instance:
    """A machine the provider created for this study."""

    id: str
    name: str
    price_per_hour: float | None = None     # the whole instance, dollars
    gpu_count: int | None = None
    region: str | None = None
    address: str | None = None              # set once it is ready
    port: int = 22
    user: str = "root"
    status: str | None = None


class Provider(Protocol):
    """What stepbench asks of a GPU cloud. Every method raises ProviderError (one line, the
    API key left out) when the provider refuses or cannot be reached."""

    name: str

    def prices(self, gpu_type: str | None = None) -> list[Offer]: ...

    def register_key(self, public_key: str) -> str:
        """Register the SSH public key (or find it registered); its id."""

    def create(self, spec: RentSpec, name: str, key_id: str, *, max_runtime_minutes: int,
               template: str | None) -> Instance: ...

    def wait(self, instance: Instance, timeout_s: float, stopping: threading.Event) -> Instance:
        """The instance once it runs and has an address. RentError when it ends or is not
        ready within timeout_s; HostStopped when `stopping` is set."""

    def delete(self, instance_id: str) -> None: ...

    def find(self, name: str) -> list[str]:
        """Ids of the live instances named `name` (a create that got no answer)."""


def redact(text: str, secret: str | None) -> str:
    """`text` without `secret` (an API key a provider's message might echo)."""
    text = str(text)
    if secret:
        text = text.replace(secret, secret[:8] + "…")
    return text



def api_key_from_env(variable: str, hint: str) -> str:
    key = os.environ.get(variable, "").strip()
    if not key:
        raise UserError(f"set {variable} to your API key ({hint})")
    return key
