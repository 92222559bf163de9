"""Which call starts a thread in a process-server-like process on a GPU machine: prints the
process's threads after importing torch, after NVML answers the device count, after
torch.cuda.is_available() and after importing inductor's benchmarking module (results in
benchmarks/README.md, section h). Run: python3 benchmarks/nvml_thread_probe.py

`--answered N`: as the process server imports inductor (NVML's count answered with N, see
execute/local/serving.py nvml_answered), then the modules a compiled setup's first step imports
on a GPU (triton's code generation), each with its seconds and the threads after it.
    PYTHONPATH=src python3 benchmarks/nvml_thread_probe.py --answered 1"""
import importlib
import os
import sys
import time

os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")


def threads() -> list[str]:
    return sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))


def main() -> None:
    print("CUDA_VISIBLE_DEVICES", repr(os.environ.get("CUDA_VISIBLE_DEVICES")))
    torch = importlib.import_module("torch")
    print("after import torch", threads())
    print("NVML's device count", torch.cuda._device_count_nvml(), threads())
    print("device_count", torch.cuda.device_count(), threads())
    print("is_available", torch.cuda.is_available(), threads())
    config = importlib.import_module("torch._inductor.config")
    print("inductor config use_experimental_benchmarker",
          getattr(config, "use_experimental_benchmarker", "absent"), threads())
    bench = importlib.import_module("torch._inductor.runtime.benchmarking")
    print("benchmarking's use_experimental_benchmarker",
          getattr(bench, "use_experimental_benchmarker", "absent"), threads())
    print("CUDA initialised:", torch.cuda.is_initialized())


def answered(gpus: int) -> None:
    from stepbench.execute.local.serving import nvml_answered

    torch = importlib.import_module("torch")
    importlib.import_module("torch._dynamo")
    print("after torch and dynamo", threads())
    for name in ("torch._inductor.compile_fx", "torch._inductor.codegen.triton", "triton",
                 "torch._inductor.runtime.triton_heuristics", "torch._inductor.select_algorithm"):
        start = time.perf_counter()
        try:
            with nvml_answered(gpus):
                importlib.import_module(name)
            said = "imported"
        except Exception as exc:  # noqa: BLE001 - a probe: what happened is the result
            said = f"{type(exc).__name__}: {exc}"
        print(f"{name}: {said} in {time.perf_counter() - start:.2f} s", threads())
    print("CUDA initialised:", torch.cuda.is_initialized())


if __name__ == "__main__":
    if sys.argv[1:2] == ["--answered"]:
        answered(int(sys.argv[2]))
    else:
        main()
