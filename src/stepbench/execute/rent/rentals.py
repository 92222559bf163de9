"""Rented machines: `stepbench run --rent runcrate:L40S --rent "runcrate:RTX 5090" ...`.

A rented machine becomes one more SSH host of the fleet (execute/hosts/fleet.py): for each `--rent`
its host thread creates an instance (with a maximum runtime as a safety net), waits until it has
an address and answers SSH, pins its host key, and then runs exactly as `--host` does. The
instance is deleted on every way out: the study finished, the host failed, the wait timed out,
Ctrl-C, SIGTERM, SIGHUP, a bug. A create that may have reached the provider without an answer
(a timeout, a lost connection) is looked up by its unique name and deleted too.

A new machine's host key cannot be known in advance, so the first SSH contact accepts whatever
key it shows (said on one line, with its fingerprint); that key is written to a known_hosts file
of this study, and every connection after it is checked against it.

The provider seam is `Provider` (prices, register_key, create, wait, delete, find): runcrate.py
implements it with Runcrate's SDK; another cloud (or SkyPilot) slots in the same way.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from stepbench.errors import UserError
from stepbench.execute.rent.providers import (Instance, Offer, Provider, ProviderError, RentError,
                                         RentSpec)
from stepbench.execute.hosts.ssh import EventLoop, HostSpec, HostStopped, require_asyncssh
from stepbench.execute.runner import on_signals
from stepbench.settings import Rent

# How long to wait for an instance to have an address and answer SSH (--rent-timeout).
READY_TIMEOUT_S = 900
# The provider deletes an instance after this long whatever happens here (--rent-max-minutes).
MAX_RUNTIME_MINUTES = 120
DELETE_ATTEMPTS = 3
DEFAULT_KEYS = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")


# ---------------------------------------------------------------- what the command line names

def provider(name: str) -> Provider:
    """The provider named on the command line (its module is imported only when asked for)."""
    if name == "runcrate":
        from stepbench.execute.rent import runcrate

        return runcrate.make_provider()
    raise UserError(f"unknown provider {name!r}; choose one of: " + ", ".join(PROVIDERS))


PROVIDERS = ("runcrate",)
# Where each provider's API key is read from (the provider's module reads it when made).
API_KEYS = {"runcrate": "RUNCRATE_API_KEY"}


def parse_rent(text: str) -> RentSpec:
    """'runcrate:L40S', 'runcrate:RTX 5090', 'runcrate:H100 PCIe:2'."""
    name = " ".join(text.split())
    provider, _, rest = name.partition(":")
    gpu, count = rest, "1"
    head, sep, tail = rest.rpartition(":")
    if sep and tail.strip().isdigit():
        gpu, count = head, tail.strip()
    gpu = gpu.strip()
    if not provider or not gpu or not int(count) >= 1:
        raise UserError(f"--rent {text!r} is not a rental; pass PROVIDER:GPU[:COUNT], e.g. "
                        "--rent runcrate:L40S or --rent 'runcrate:H100 PCIe:2'")
    if provider not in PROVIDERS:
        raise UserError(f"--rent {text!r}: unknown provider {provider!r}; choose one of: "
                        + ", ".join(PROVIDERS))
    return RentSpec(name, provider, gpu, int(count))


def parse_rentals(texts) -> list[RentSpec]:
    """Every --rent, parsed; a UserError for a bad one or one given twice."""
    specs = [parse_rent(text) for text in texts]
    names = [s.name for s in specs]
    for name in names:
        if names.count(name) > 1:
            raise UserError(f"--rent {name!r} is given twice; to rent two of one GPU type give "
                            "them a count instead (--rent 'runcrate:L40S:2' is one machine with "
                            "2 GPUs)")
    return specs


def check_rentals(rent: Rent) -> tuple[list[RentSpec], Path]:
    """What can be checked of the --rent flags without contacting anything: each spec parses
    and names a known provider, asyncssh is there, and the SSH key exists and reads. The specs
    and the key's path."""
    specs = parse_rentals(rent.specs)
    require_asyncssh()
    key_path, _ = ssh_key(rent.key)
    return specs, key_path


# ---------------------------------------------------------------- settings shared by the rentals

@dataclass
class RentSettings:
    """The run's --rent-* flags, checked."""

    key_path: Path                      # the private key that logs into the rented machines
    public_key: str
    ready_timeout_s: float = READY_TIMEOUT_S
    max_runtime_minutes: int = MAX_RUNTIME_MINUTES
    template: str | None = None


def ssh_key(path: str | None) -> tuple[Path, str]:
    """The private key to log in with (the first of DEFAULT_KEYS without --rent-key) and its
    public key."""
    asyncssh = require_asyncssh()
    candidates = [path] if path else list(DEFAULT_KEYS)
    for candidate in candidates:
        private = Path(candidate).expanduser()
        if private.is_file():
            break
    else:
        where = path or ", ".join(DEFAULT_KEYS)
        raise UserError(f"no SSH key at {where}; pass --rent-key with a private key file (make "
                        "one with `ssh-keygen -t ed25519`)")
    # Read here, before anything is rented: stepbench logs in with the file itself (a key with
    # a passphrase would need a prompt in the middle of the run).
    try:
        key = asyncssh.read_private_key(str(private))
    except (asyncssh.KeyImportError, OSError, ValueError) as exc:
        raise UserError(f"cannot use SSH key {private} ({exc}); pass --rent-key a key without a "
                        "passphrase, e.g. one made by `ssh-keygen -t ed25519 -N '' -f "
                        "~/.ssh/stepbench`") from None
    return private, " ".join(key.export_public_key().decode().split()[:2])


# ---------------------------------------------------------------- one rented machine

@dataclass
class Lease:
    """One `--rent`: the instance it created, from create to delete."""

    spec: RentSpec
    provider: Provider
    key_id: str
    settings: RentSettings
    folder: Path                        # this study's known_hosts and SSH config live here
    loop: EventLoop
    offer: Offer | None = None
    instance: Instance | None = None
    created_at: float | None = None
    deleted_at: float | None = None
    delete_failed: str | None = None
    stopping: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    unique_name: str | None = None      # the instance's name at the provider, unique
    _created: bool = False              # a create was sent (it may have succeeded unanswered)
    _released: bool = False

    @property
    def name(self) -> str:
        return self.spec.name

    def acquire(self, note: Callable[[str], None]) -> tuple[HostSpec, Path, dict]:
        """Create the instance, wait until it answers SSH, pin its host key. Returns the host to
        connect to, the SSH config that reaches it, and the record's `rental` value."""
        s = self.settings
        unique = f"stepbench-{_slug(self.spec.gpu_type)}-{secrets.token_hex(4)}"
        self._check_stopping()
        with self._lock:
            self.unique_name, self._created = unique, True
            self.created_at = time.monotonic()
        try:
            instance = self.provider.create(self.spec, unique, self.key_id,
                                            max_runtime_minutes=s.max_runtime_minutes,
                                            template=s.template)
        except ProviderError as exc:
            if not exc.maybe_done:
                with self._lock:
                    self._created = False
            raise RentError(str(exc)) from None
        with self._lock:
            self.instance = instance
        price = instance.price_per_hour or (self.offer.price_per_hour if self.offer else None)
        instance.price_per_hour = price
        note(f"created instance {instance.id} ({self.spec.gpu_count} x {self.spec.gpu_type}"
             + (f", ${price:g}/h" if price else "")
             + f"; the provider deletes it after {s.max_runtime_minutes} min whatever happens); "
             "waiting for it to start")
        deadline = time.monotonic() + s.ready_timeout_s
        try:
            ready = self.provider.wait(instance, s.ready_timeout_s, self.stopping)
        except ProviderError as exc:
            raise RentError(str(exc)) from None
        ready.price_per_hour = ready.price_per_hour or price
        with self._lock:
            self.instance = ready
        note(f"running at {ready.address}" + (f" port {ready.port}" if ready.port != 22 else "")
             + "; waiting for SSH")
        fingerprint, line = self._first_contact(ready, deadline)
        known = self.folder / f"{_slug(self.name)}.known_hosts"
        known.write_text(line + "\n")
        note(f"accepted host key {fingerprint} on first contact (a new machine's key cannot be "
             "known before); pinned for the rest of this study")
        alias = f"stepbench-rent-{_slug(self.name)}"
        config = self.folder / f"{_slug(self.name)}.ssh_config"
        config.write_text(
            f"Host {alias}\n  HostName {ready.address}\n  Port {ready.port}\n  User {ready.user}\n"
            f'  IdentityFile "{s.key_path}"\n  IdentitiesOnly yes\n'
            f'  UserKnownHostsFile "{known}"\n')
        rental = {"provider": self.provider.name, "gpu_type": self.spec.gpu_type,
                  "gpu_count": ready.gpu_count or self.spec.gpu_count,
                  "price_per_hour": ready.price_per_hour, "region": ready.region,
                  "instance": ready.id}
        return HostSpec(self.name, alias), config, {k: v for k, v in rental.items() if v is not None}

    def _check_stopping(self) -> None:
        if self.stopping.is_set():
            raise HostStopped()

    def _first_contact(self, ready: Instance, deadline: float) -> tuple[str, str]:
        """Connect until sshd answers (it starts after the instance runs); the host key it
        showed, as a fingerprint and a known_hosts line."""
        asyncssh = require_asyncssh()
        last = "no answer"
        while True:
            self._check_stopping()
            try:
                return self.loop.call(self._contact(ready), timeout=60)
            except (OSError, asyncio.TimeoutError, asyncssh.Error) as exc:
                last = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or str(exc) \
                    or type(exc).__name__
            except TimeoutError:
                last = "no answer"
            if time.monotonic() >= deadline:
                raise RentError(f"instance {ready.id} runs at {ready.address} but SSH there "
                                f"failed until the timeout ({self.settings.ready_timeout_s:g} s, "
                                f"--rent-timeout): {last}")
            self.stopping.wait(2.0)

    async def _contact(self, ready: Instance) -> tuple[str, str]:
        asyncssh = require_asyncssh()
        # known_hosts=None: this first contact accepts the key (it cannot be known before), and
        # only to read it: nothing runs on this connection.
        conn = await asyncssh.connect(ready.address, port=ready.port, username=ready.user,
                                      client_keys=[str(self.settings.key_path)], known_hosts=None,
                                      config=None, connect_timeout=15)
        try:
            key = conn.get_server_host_key()
        finally:
            conn.close()
            await conn.wait_closed()
        host = ready.address if ready.port == 22 else f"[{ready.address}]:{ready.port}"
        public = key.export_public_key("openssh").decode().split()
        return key.get_fingerprint("sha256"), f"{host} {public[0]} {public[1]}"

    def stop(self) -> None:
        self.stopping.set()

    def release(self) -> str | None:
        """Delete the instance, once; None when it is gone (or none was made), else the line
        that says it could not be deleted."""
        with self._lock:
            if self._released:
                return self.delete_failed
            self._released = True
            instance, created = self.instance, self._created
        ids = [instance.id] if instance is not None else []
        if not ids and created:
            # The create may have reached the provider without an answer: find it by name.
            try:
                ids = self.provider.find(self.unique_name)
            except ProviderError as exc:
                self.delete_failed = (f"could not check whether the create that got no answer "
                                      f"made an instance ({exc}); look in the provider's console")
                return self.delete_failed
        last = None
        for instance_id in ids:
            for attempt in range(DELETE_ATTEMPTS):
                try:
                    self.provider.delete(instance_id)
                    last = None
                    break
                except ProviderError as exc:
                    last = exc
                    if attempt + 1 < DELETE_ATTEMPTS:
                        time.sleep(1.0 + attempt)
            if last is not None:
                self.delete_failed = (
                    f"COULD NOT DELETE instance {instance_id} ({last}); delete it in the "
                    f"{self.provider.name} console now: it bills until its maximum runtime "
                    f"({self.settings.max_runtime_minutes} min) ends")
        if ids or created:
            self.deleted_at = time.monotonic()
        return self.delete_failed

    # -- money ---------------------------------------------------------------------------

    @property
    def minutes(self) -> float | None:
        if self.created_at is None:
            return None
        end = self.deleted_at if self.deleted_at is not None else time.monotonic()
        return (end - self.created_at) / 60

    @property
    def cost(self) -> float | None:
        price = self.instance.price_per_hour if self.instance else None
        if price is None or self.minutes is None:
            return None
        return price * self.minutes / 60


def cost_summary(leases: list[Lease]) -> str | None:
    """What the rented machines cost: the provider's price times the time from create to
    delete (the provider's bill may count from when the machine started)."""
    used = [lease for lease in leases if lease.instance is not None and lease.minutes is not None]
    if not used:
        return None
    parts, total = [], 0.0
    for lease in used:
        price = lease.instance.price_per_hour
        parts.append(f"{lease.name} {lease.minutes:.1f} min"
                     + (f" at ${price:g}/h" if price else " (no price)")
                     + (" (NOT DELETED: still billing)" if lease.delete_failed else ""))
        total += lease.cost or 0.0
    return (f"rented {len(used)} machine{'s' if len(used) != 1 else ''}: " + ", ".join(parts)
            + f"; about ${total:.2f} in all at the provider's prices, from create to delete")


# ---------------------------------------------------------------- the run's rentals

@dataclass
class Rentals:
    """Every `--rent` of a run, checked against the providers before anything is created."""

    leases: list[Lease]
    folder: Path

    def stop(self) -> None:
        for lease in self.leases:
            lease.stop()

    def release_all(self) -> list[tuple[str, str]]:
        """Delete what is left (each lease's own thread normally did); the failures."""
        failed = []
        for lease in self.leases:
            problem = lease.release()
            if problem:
                failed.append((lease.name, problem))
        return failed

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def prepare_rentals(rent: Rent, loop: EventLoop, note: Callable[[str], None]) -> Rentals:
    """Parse the --rent flags, check the key and the API, look up each GPU's price and register
    the SSH key: every error a UserError, before any machine is created."""
    specs = parse_rentals(rent.specs)
    require_asyncssh()
    key_path, public_key = ssh_key(rent.key)
    settings = RentSettings(key_path, public_key, rent.timeout_s, rent.max_minutes,
                            rent.template)
    providers, offers = _offers(specs)
    try:
        key_ids = {name: p.register_key(public_key) for name, p in providers.items()}
    except ProviderError as exc:
        raise UserError(str(exc)) from None
    for spec in specs:
        offer = offers[spec.name]
        note(f"{spec.name}: {offer.gpu_count} x {offer.gpu_type} at ${offer.price_per_hour:g}/h"
             + (f" ({offer.region})" if offer.region else ""))
    folder = Path(tempfile.mkdtemp(prefix="stepbench-rent-"))
    leases = [Lease(spec, providers[spec.provider], key_ids[spec.provider], settings, folder,
                    loop, offer=offers[spec.name]) for spec in specs]
    return Rentals(leases, folder)


def quote_rentals(specs: list[RentSpec]) -> dict[str, Offer]:
    """`run --rent ... --dry-run --rent-prices`: the offer each rental would take now, by its
    name (this asks the providers, with their API keys); nothing is created."""
    return _offers(specs)[1]


def _offers(specs: list[RentSpec]) -> tuple[dict[str, Provider], dict[str, Offer]]:
    """Each provider the specs name, made once, and the offer each spec takes now, by its name;
    a provider's error a UserError."""
    providers: dict[str, Provider] = {}
    listed: dict = {}
    offers = {}
    try:
        for spec in specs:
            if spec.provider not in providers:
                providers[spec.provider] = provider(spec.provider)
            offers[spec.name] = pick_offer(providers[spec.provider], spec, listed)
    except ProviderError as exc:
        raise UserError(str(exc)) from None
    return providers, offers


def pick_offer(p: Provider, spec: RentSpec, cache: dict | None = None) -> Offer:
    """The cheapest offer of the GPU type and count; a UserError naming the types there are.
    `cache` keeps each provider's list for the other rentals of the run."""
    cache = {} if cache is None else cache
    if p.name not in cache:
        cache[p.name] = p.prices()
    offers = cache[p.name]
    same = [o for o in offers if o.gpu_type.lower() == spec.gpu_type.lower()]
    fits = [o for o in same if o.gpu_count == spec.gpu_count]
    if not fits:
        if same:
            counts = ", ".join(str(c) for c in sorted({o.gpu_count for o in same}))
            raise UserError(f"--rent {spec.name!r}: {p.name} has {spec.gpu_type} machines of "
                            f"{counts} GPU(s), not {spec.gpu_count}; pass one of those counts")
        types = ", ".join(sorted({o.gpu_type for o in offers})) or "none right now"
        raise UserError(f"--rent {spec.name!r}: {p.name} has no GPU type {spec.gpu_type!r}; "
                        f"choose one of: {types}")
    return min(fits, key=lambda o: o.price_per_hour)


# ---------------------------------------------------------------- signals while deleting

class hold_signals(on_signals):
    """While the rented machines are being deleted, Ctrl-C, SIGTERM and SIGHUP do not cut that
    short: each prints `message` (once) and the deleting goes on."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self, message: str):
        self.message, self.said = message, False

    def handle(self, signum, frame):
        if not self.said:
            self.said = True
            print(f"stepbench run: {self.message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- `stepbench prices`

# The GeForce cards' driver names carry "GeForce", which providers leave out of their labels.
_GEFORCE = re.compile(r"^(RTX|GTX) \d{4}( Ti| SUPER)*$", re.IGNORECASE)


def driver_name(label: str) -> str:
    """The name the driver reports for a provider's GPU label, where it is known to differ
    ("RTX 5090" -> "NVIDIA GeForce RTX 5090"); the label otherwise (the report's price lookup
    ignores case and a leading "NVIDIA ")."""
    if _GEFORCE.match(label.strip()):
        return "NVIDIA GeForce " + label.strip()
    return label.strip()


def price_file(offers: list[Offer], provider_name: str, when: str) -> str:
    """A TOML price file (the format `report --prices` reads): per GPU type, the cheapest price
    per GPU-hour of any offer of it."""
    best: dict[str, tuple[float, Offer]] = {}
    for offer in offers:
        if offer.gpu_count < 1 or offer.price_per_hour <= 0:
            continue
        per_gpu = offer.price_per_hour / offer.gpu_count
        key = driver_name(offer.gpu_type)
        if key not in best or per_gpu < best[key][0]:
            best[key] = (per_gpu, offer)
    lines = [f"# Hourly GPU prices from {provider_name}'s instance types, {when}",
             f"# (stepbench prices --from {provider_name}): dollars per GPU-hour, the cheapest",
             "# offer of each GPU type. Keys are the GPU's name as the driver reports it; where",
             "# the report says a price 'matches no GPU', rename its key to the name it shows.",
             "[prices]"]
    for key in sorted(best, key=str.lower):
        per_gpu, offer = best[key]
        where = f", {offer.region}" if offer.region else ""
        lines.append(f"{_toml_string(key)} = {round(per_gpu, 4)}  # {provider_name} "
                     f"{offer.gpu_type}: {offer.gpu_count} GPU{'s' if offer.gpu_count != 1 else ''}"
                     f" at ${offer.price_per_hour:g}/h{where}")
    return "\n".join(lines) + "\n"


def _toml_string(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{"".join(c if c.isprintable() else " " for c in escaped)}"'


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "gpu"
