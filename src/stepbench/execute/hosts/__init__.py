"""The SSH hosts backend (`run --host`, `--hosts-file`, and `--rent`'s machines, rent/): one
runner per host, all at once, into one results file (fleet.py); ssh.py is the executor,
hostprep.py and hostside.py run on the host."""

from stepbench.execute.registry import Backend


class HostsBackend(Backend):
    name = "hosts"
    fleet = True

    def chosen(self, settings) -> bool:
        from stepbench.settings import RunSettings

        return isinstance(settings, RunSettings) and settings.remote_run
