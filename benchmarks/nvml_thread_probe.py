"""Which call starts a thread in a process-server-like process on a GPU machine: prints the
process's threads after importing torch, after NVML answers the device count, after
torch.cuda.is_available() and after importing inductor's benchmarking module (results in
benchmarks/README.md, section h). Run: python3 benchmarks/nvml_thread_probe.py"""
import importlib
import os

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


if __name__ == "__main__":
    main()
