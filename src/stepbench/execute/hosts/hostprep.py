"""Prepare an SSH host for stepbench. Runs there, under the host's own Python, before stepbench is
installed: execute/hosts/ssh.py sends this file's source as `PYTHON -c SOURCE ARGS`, the wheel on stdin.
So it uses the standard library only.

It installs the wheel into a virtual environment that sees every package of that Python (its
torch above all: `--system-site-packages`, plus the site folders of a Python that is itself a
venv or conda env), named by the wheel's hash and the Python, once: later runs of the same
stepbench reuse it. A lock file keeps two runs (or two host aliases of one machine, or hosts
sharing a home folder) from building the same environment at once. Then it writes the model
configs it was given and the user's workload files (a tar after the wheel on stdin, under
workloads/SHA/), makes this run's work folder and prints, as one JSON line, where
everything is and what the probe (`stepbench.execute.hosts.hostside probe`) found there.
Any failure is one JSON line {"error": "..."} that names the fix.
"""

import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

MIN_PYTHON = (3, 11)


class Failed(Exception):
    pass


def main(argv):
    args = json.loads(argv[0])
    data = sys.stdin.buffer.read()
    # After the wheel, a user's workload files as a tar, where a factory file travels.
    size = args.get("wheel_size", len(data))
    wheel, workload = data[:size], data[size:]
    try:
        print(json.dumps(prepare(args, wheel, workload)))
    except Failed as exc:
        print(json.dumps({"error": str(exc)}))
        return 1
    return 0


def prepare(args, wheel, workload=b""):
    if sys.version_info < MIN_PYTHON:
        raise Failed(f"{sys.executable} is Python {sys.version.split()[0]}; stepbench needs "
                     f"{'.'.join(map(str, MIN_PYTHON))} or newer: pass --remote-python PATH")
    if importlib.util.find_spec("torch") is None:
        raise Failed(f"{sys.executable} there has no torch; pass --remote-python the Python that "
                     "has it (stepbench uses the host's own torch and never installs one)")
    base = os.path.abspath(os.path.expanduser(args["dir"]))
    key = hashlib.sha256(wheel + os.path.realpath(sys.executable).encode()
                         + sys.version.encode()).hexdigest()[:16]
    env = os.path.join(base, "envs", f"stepbench-{args['version']}-{key}")
    try:
        os.makedirs(os.path.dirname(env), exist_ok=True)
        with open(env + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            installed = not os.path.exists(os.path.join(env, "READY"))
            if installed:
                install(env, wheel, args["wheel_name"], args["requires"])
        models = {}
        for model in args["models"]:
            path = os.path.join(base, "models", model["sha"], "config.json")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(model["text"])
            models[model["local"]] = path
        carried = args.get("workload")
        workload_cwd = unpack(base, carried, workload) if carried else None
        os.makedirs(os.path.join(base, "runs"), exist_ok=True)
        workdir = tempfile.mkdtemp(prefix="run-", dir=os.path.join(base, "runs"))
    except OSError as exc:
        raise Failed(f"cannot write under {base} ({exc.strerror}: {exc.filename}); pass a "
                     "writable --remote-dir") from None
    python = os.path.join(env, "bin", "python")
    cache = args.get("compile_cache")
    probe = run([python, "-m", "stepbench.execute.hosts.hostside", "probe", args["device"]],
                "the probe of torch and the GPU")
    return {"python": python, "env": env, "installed": installed, "workdir": workdir,
            "models": models, "workload_cwd": workload_cwd,
            "probe": json.loads(probe.splitlines()[-1]),
            "compile_cache": os.path.abspath(os.path.expanduser(cache)) if cache else None}


def unpack(base, carried, data):
    """The workload's files (a tar) under workloads/SHA/, once per content; the folder its
    setups run in."""
    import io
    import tarfile

    root = os.path.join(base, "workloads", carried["sha"])
    if not os.path.isdir(root):
        os.makedirs(os.path.dirname(root), exist_ok=True)
        part = tempfile.mkdtemp(prefix=carried["sha"] + "-", dir=os.path.dirname(root))
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for member in tar.getmembers():
                name = os.path.normpath(member.name)
                if not member.isfile() or name.startswith("..") or os.path.isabs(name):
                    raise Failed(f"the workload's archive holds {member.name!r}; run again")
                target = os.path.join(part, name)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with open(target, "wb") as f:
                    f.write(tar.extractfile(member).read())
        try:
            os.rename(part, root)
        except OSError:             # another run unpacked the same files meanwhile
            shutil.rmtree(part, ignore_errors=True)
    cwd = os.path.normpath(os.path.join(root, carried["cwd"]))
    os.makedirs(cwd, exist_ok=True)
    return cwd


def install(env, wheel, wheel_name, requires):
    shutil.rmtree(env, ignore_errors=True)
    run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", env],
        f"making a virtual environment with {sys.executable}")
    python = os.path.join(env, "bin", "python")
    site_packages = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        "finding the environment's site-packages").strip()
    # This Python's own site folders (a venv's or conda env's are not the "system" ones), each
    # with its .pth files, after the environment's own: the host's torch is found, and the
    # stepbench installed here wins over any other.
    here = [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")
            and os.path.isdir(p)]
    with open(os.path.join(site_packages, "_stepbench_host.pth"), "w") as f:
        f.write("import site; " + "; ".join(f"site.addsitedir({p!r})" for p in here) + "\n")
    if subprocess.run([python, "-m", "pip", "--version"], capture_output=True).returncode:
        raise Failed(f"{sys.executable} has no pip to install stepbench with; install it there "
                     "(python3 -m ensurepip --user, or the python3-pip package)")
    wheel_path = os.path.join(env, wheel_name)
    with open(wheel_path, "wb") as f:
        f.write(wheel)
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "--quiet"]
    # The wheel alone first: a stepbench that this Python already has must not stop it.
    run(pip + ["--no-deps", "--ignore-installed", wheel_path], "installing stepbench")
    # Then only what this Python lacks (usually nothing: its packages are found as they are). Never
    # torch: the host's own build (its CUDA, its driver) is the one to measure.
    requires = [r for r in requires if re.split(r"[\s;<>=!~\[(]", r, 1)[0].lower() != "torch"]
    if requires:
        run(pip + requires, "installing stepbench's requirements (" + ", ".join(requires) + ")")
    os.remove(wheel_path)
    open(os.path.join(env, "READY"), "w").close()


def run(command, what):
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        said = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-4:])
        raise Failed(f"{what} failed (exit code {proc.returncode}): {said or 'no output'}")
    return proc.stdout


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
