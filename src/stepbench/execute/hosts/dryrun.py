"""`run --host/--rent --dry-run`: what each SSH host and each rented machine would run, after the
checks that need no other machine; nothing is contacted (--rent-prices asks the providers)."""

from __future__ import annotations

import json

from stepbench.execute.hosts.site import say
from stepbench.settings import RunSettings
from stepbench.setup import setup_line


def dry_run_hosts(settings: RunSettings, specs: list) -> int:
    """`run --host/--rent --dry-run`: the setups each SSH host and each rented machine would
    run, after the checks that need no other machine; nothing is contacted (--rent-prices asks
    the providers for each rental's machine and price)."""
    from stepbench.execute.bundle import carried
    from stepbench.execute.hosts.fleet import destination
    from stepbench.execute.rent.rentals import API_KEYS, check_rentals, quote_rentals

    rentals, key = check_rentals(settings.rent) if settings.rent.specs else ([], None)
    offers = quote_rentals(rentals) if settings.rent.prices else {}
    auto = settings.device == "auto"
    # Whose defaults each machine's setups show: a host's device is known once it is probed
    # there (a GPU host's are shown), a rented machine has GPUs.
    shown = "cuda" if auto else settings.device
    workload = carried(settings, destination(settings))
    carries = workload and {"paths": list(workload.sources), "files": len(workload.files),
                            "bytes": workload.size}
    common = {"device": settings.device, "defaults_of": shown, "carries": carries,
              "setups": settings.resolved(shown).plan()}
    machines = [{"host": spec.name, "via": "ssh", "address": spec.host, "user": spec.user,
                 "port": spec.port, **common} for spec in specs]
    for spec in rentals:
        offer = offers.get(spec.name)
        machines.append({"host": spec.name, "via": "rent", "provider": spec.provider,
                         "gpu_type": spec.gpu_type, "gpu_count": spec.gpu_count,
                         "price_per_hour": offer.price_per_hour if offer else None,
                         "region": offer.region if offer else None, **common})
    if settings.format == "json":
        print(json.dumps([{**m, "setups": [s.to_dict() for s in m["setups"]]} for m in machines],
                         indent=1))
    else:
        for m in machines:
            count = len(m["setups"])
            print(f"{_machine_line(m)}: {count} setup{'s' if count != 1 else ''}")
            for setup in m["setups"]:
                print("  " + setup_line(setup))
    if auto and specs:
        cpu = [_workload(s) for s in settings.resolved("cpu").plan()]
        differs = cpu != [_workload(s) for s in common["setups"]]
        say("each machine runs the defaults of its own device; shown: a GPU's"
                   + (" (a host without one runs the CPU's: --device cpu --dry-run lists them)"
                      if differs else ""))
    if workload:
        say(f"each machine is sent {workload.describe().removeprefix('carries ')}, unpacked "
            f"there under {_home(settings.remote.dir)}/workloads/")
    checked = []
    if specs:
        checked += ["the host names"] + [f"{what} {path}" for what, path in (
            ("the hosts file", settings.remote.hosts_file),
            ("the SSH config file", settings.remote.ssh_config)) if path]
    if rentals:
        checked += ["the rentals and their providers", f"the SSH key {key}"]
    if offers:
        checked += ["the providers' GPU types and prices now"]
    unchecked = []
    if specs:
        unchecked.append("that the hosts answer (their SSH config entries, keys and host keys) "
                         "and what GPU and Python they have")
    if rentals and not offers:
        names = sorted({s.provider for s in rentals})
        unchecked.append(f"{' and '.join(names)}'s GPU types, counts and prices now, and "
                         + " and ".join(API_KEYS.get(n, f"{n}'s API key") for n in names)
                         + " (--rent-prices asks, creating nothing)")
    elif rentals:
        unchecked.append("that the machines will be there when the run asks for them")
    say(f"dry run: checked {', '.join(checked)}; contacted "
               f"{'only the providers' if offers else 'nothing'}; not checked: "
               + "; ".join(unchecked))
    return 0


def _machine_line(m: dict) -> str:
    """'host alpha (SSH; a GPU's defaults)', 'rented runcrate:L40S (1 x L40S from runcrate at
    $0.86/h; --device cuda)'."""
    device = ("a GPU's defaults" if m["device"] == "auto" and m["via"] == "ssh"
              else f"--device {m['device']}" if m["device"] != "auto" else "")
    if m["via"] == "ssh":
        return f"host {m['host']} (SSH; {device})"
    price = (f" at ${m['price_per_hour']:g}/h" + (f" ({m['region']})" if m["region"] else "")
             if m["price_per_hour"] is not None else "")
    return (f"rented {m['host']} ({m['gpu_count']} x {m['gpu_type']} from {m['provider']}"
            f"{price}{'; ' + device if device else ''})")


def _home(folder: str) -> str:
    """--remote-dir as the hosts read it: a relative one is in the home folder."""
    return folder if folder.startswith(("/", "~")) else f"~/{folder}"


def _workload(setup) -> tuple:
    return setup.name, setup.batch, setup.seq, setup.dtype, setup.model
