"""The SSH hosts backend (`run --host`, `--hosts-file`, and `--rent`'s machines, rent/): one
runner per host, all at once, into one results file (site.py, fleet.py); ssh.py is the executor,
hostprep.py and hostside.py run on the host, dryrun.py shows what each machine would run."""

from stepbench.execute.registry import Backend


class HostsBackend(Backend):
    name = "hosts"
    remote = True

    def chosen(self, settings) -> bool:
        from stepbench.settings import RunSettings

        return isinstance(settings, RunSettings) and settings.remote_run

    def precheck(self, settings) -> None:
        _checked(settings)

    def reads_signatures(self, settings) -> str | None:
        if settings.remote.hosts:
            return "on the SSH hosts"
        # Rented machines exist once the run creates them (hosts/site.py, fleet.py).
        return "on the first rented machine once it is prepared (each other one must agree)" \
            if settings.rent.specs else None

    def dry_run(self, settings) -> int:
        from stepbench.execute.hosts.dryrun import dry_run_hosts

        return dry_run_hosts(settings, _checked(settings))

    def open(self, settings, note):
        from stepbench.execute.hosts.site import HostsSite

        return HostsSite.open(settings, note)


def _checked(settings) -> list:
    """The hosts the settings name (HostSpecs), their names, asyncssh and a workload that cannot
    travel checked once, before any host is contacted; the plan's models too (each host checks
    its own plan again, once its device is known)."""
    from stepbench.execute.hosts.fleet import check_hosts
    from stepbench.execute.hosts.site import plan_device
    from stepbench.measure.models import check_models

    specs = check_hosts(settings)
    with settings.origin.checking("model"):
        resolved = settings.resolved(plan_device(settings))
        check_models(resolved.plan())
    return specs
