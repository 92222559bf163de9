"""measure/kernels.py: a profiled step's kernels sorted into classes, on a stored H200 trace
and on traces built here."""

import gzip
import json
from pathlib import Path

import pytest

from stepbench.measure import kernels

FIXTURE = Path(__file__).parent / "data" / "profile" / "h200-eager-sdpa-kernels.json.gz"


@pytest.mark.parametrize("name, cls", [
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "matmul"),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x32_8x5_nn_align1>(...)", "matmul"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "matmul"),
    ("triton_tem_fused_mm_0", "matmul"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26", "attention"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128>>", "attention"),
    ("fmha_cutlassB_bf16_aligned_64x64_k64_sm80", "attention"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>>", "elementwise"),
    ("triton_poi_fused_add_mul_0", "elementwise"),
    ("Memcpy DtoD (Device -> Device)", "elementwise"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>", "reduction"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>", "reduction"),
    ("triton_red_fused__to_copy_mean_pow_1", "reduction"),
    ("triton_per_fused_rsqrt_2", "reduction"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedOptimizerTensorListMetadata>", "optimizer"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
    ("Memcpy HtoD (Pageable -> Device)", "transfer"),
])
def test_a_kernel_name_gives_its_class(name, cls):
    assert kernels.classify(name) == cls


def test_the_stored_h200_step_splits_into_its_classes():
    split = kernels.split_trace(FIXTURE)
    classes = split["classes_ms"]
    # The profiler's own total for this step: 86.06 ms of kernels (the trace's .txt table).
    assert sum(classes.values()) == pytest.approx(86.06, abs=0.05)
    assert split["busy_s"] == pytest.approx(0.08606, abs=5e-5)   # one stream: no overlap
    assert split["kernels"] == 3110
    # eager+sdpa of the 468M model: the GEMMs about a third, cuDNN attention about a tenth.
    assert 25 < classes["matmul"] < 33 and 8 < classes["attention"] < 11
    assert classes["optimizer"] == pytest.approx(2.42, abs=0.05)
    assert classes["communication"] == classes["transfer"] == 0
    assert split["idle_s"] == pytest.approx(split["span_s"] - split["busy_s"])
    assert split["matmul_flops"] is None    # this trace was recorded without with_flops
    assert split["matmuls"][0]["kernel"].startswith("nvjet") and split["matmuls"][0]["calls"] > 100


def write(tmp_path, events) -> Path:
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    return path


def test_overlapping_streams_count_busy_time_once_and_gaps_as_idle(tmp_path):
    events = [
        {"ph": "X", "cat": "kernel", "name": "nvjet_a", "ts": 0, "dur": 100, "args": {"stream": 7}},
        {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce", "ts": 50, "dur": 100,
         "args": {"stream": 9}},
        {"ph": "X", "cat": "kernel", "name": "triton_poi_fused_0", "ts": 400, "dur": 100,
         "args": {"stream": 7, "External id": 5}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 1, "args": {"External id": 5}},
    ]
    split = kernels.split_trace(write(tmp_path, events))
    assert split["busy_s"] == pytest.approx(250e-6)
    assert split["span_s"] == pytest.approx(500e-6)
    assert split["idle_s"] == pytest.approx(250e-6)
    assert split["classes_ms"]["communication"] == pytest.approx(0.1)


def test_flops_and_shapes_come_from_the_launching_op_where_recorded(tmp_path):
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5,
         "args": {"External id": 3, "Input Dims": [[8192, 1024], [1024, 4096]], "flops": 6.9e10}},
        {"ph": "X", "cat": "kernel", "name": "nvjet_x", "ts": 10, "dur": 100,
         "args": {"External id": 3}},
    ]
    split = kernels.split_trace(write(tmp_path, events))
    assert split["matmul_flops"] == 6.9e10
    assert split["matmuls"] == [{"kernel": "nvjet_x", "ms": 0.1, "calls": 1, "flops": 6.9e10,
                                 "shapes": [[8192, 1024], [1024, 4096]], "op": "aten::mm"}]


def test_a_cpu_trace_gives_no_fields(tmp_path):
    path = write(tmp_path, [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5}])
    assert kernels.split_trace(path) == {}


def test_the_module_reads_a_stored_trace_from_the_command_line(capsys):
    assert kernels.main([str(FIXTURE)]) == 0
    assert json.loads(capsys.readouterr().out)["kernels"] == 3110
    assert kernels.main([]) == 2


def test_an_op_split_into_two_gemm_kernels_counts_its_flops_once_and_both_kernels_time(tmp_path):
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "ts": 0, "dur": 5,
         "args": {"External id": 4, "Input Dims": [[4096], [8192, 1024], [1024, 4096], [], []],
                  "Input type": ["c10::BFloat16"] * 3 + ["Scalar", "Scalar"]}},
        {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_splitk", "ts": 10, "dur": 300,
         "args": {"External id": 4}},
        {"ph": "X", "cat": "kernel", "name": "cublasLt::splitKreduce_kernel", "ts": 310,
         "dur": 20, "args": {"External id": 4}},
    ]
    split = kernels.split_trace(write(tmp_path, events))
    flops = 2 * 8192 * 4096 * 1024
    assert split["matmul_flops"] == flops
    assert split["gemms"] == [{"op": "aten::addmm", "dtype": "c10::BFloat16",
                               "shapes": [[4096], [8192, 1024], [1024, 4096]], "m": 8192,
                               "n": 4096, "k": 1024, "calls": 1, "flops": flops, "ms": 0.32}]
    assert sum(m.get("flops", 0) for m in split["matmuls"]) == flops


def test_a_profiled_cpu_step_records_each_gemm_shape_with_the_profilers_own_flops(tmp_path):
    """profile_step on a real CPU step (a linear layer forward and backward, a batched
    product): the trace has no kernels, so the GEMMs are the whole split, and their FLOPs
    are what torch.profiler's with_flops counts for the same ops."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from stepbench.measure.step import profile_step

    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 32)
    x, a, b = torch.randn(16, 64), torch.randn(4, 8, 16), torch.randn(4, 16, 8)

    def step():
        lin(x).sum().backward()
        return torch.bmm(a, b)

    result = profile_step(step, str(tmp_path / "p"), cuda=False)
    assert "classes_ms" not in result and Path(result["trace"]).is_file()
    by = {(g["op"], g.get("batch"), g["m"], g["n"], g["k"]): g for g in result["gemms"]}
    # forward (addmm), the weight's gradient (mm; the input needs none), the batched product
    assert set(by) == {("aten::addmm", None, 16, 32, 64), ("aten::mm", None, 32, 64, 16),
                       ("aten::bmm", 4, 8, 8, 16)}
    assert all(g["calls"] == 1 and g["dtype"] == "float" and g["ms"] > 0 for g in by.values())
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True) as prof:
        step()
    counted = {e.key: e.flops for e in prof.key_averages() if e.flops}
    assert {g["op"]: g["flops"] for g in by.values()} == counted
    assert result["matmul_flops"] == sum(counted.values())


def test_a_stored_cpu_step_of_llama_tiny_gives_its_gemms_and_the_conventional_flops():
    """A real profiled CPU step (tests/data/profile/make_cpu_fixture.py): 4 x 256 tokens through
    llama-tiny (hidden 128, MLP 512, 2 layers, vocabulary 4096; SDPA runs no GEMM op on a CPU)."""
    split = kernels.split_trace(Path(__file__).parent / "data" / "profile"
                                / "cpu-llama-tiny-gemms.json.gz")
    tokens, hidden, mlp, layers, vocab = 1024, 128, 512, 2, 4096
    weights = layers * (4 * hidden * hidden + 3 * hidden * mlp) + vocab * hidden
    # forward, and two products per weight backward: 6 FLOPs per weight and token.
    assert split["matmul_flops"] == 6 * weights * tokens
    assert split["gemms_left_out"] == 0 and len(split["gemms"]) == 9
    shapes = {(g["m"], g["n"], g["k"]): g["calls"] for g in split["gemms"]}
    assert shapes[(tokens, vocab, hidden)] == 1                  # the output layer, forward
    assert shapes[(tokens, hidden, hidden)] == 4 * layers * 2    # q, k, v, o: forward and dgrad
    assert all(g["dtype"] == "c10::BFloat16" for g in split["gemms"])


def test_memory_bound_kernels_are_binned_by_duration_with_their_tensors_bytes(tmp_path):
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 0, "dur": 5,
         "args": {"External id": 1, "Input Dims": [[8192, 1024], [8192, 1024], []],
                  "Input type": ["c10::BFloat16", "c10::BFloat16", "Scalar"]}},
        {"ph": "X", "cat": "kernel", "name": "vectorized_elementwise_kernel", "ts": 10, "dur": 11,
         "args": {"External id": 1}},
        {"ph": "X", "cat": "kernel", "name": "triton_poi_fused_mul_0", "ts": 30, "dur": 11.2,
         "args": {}},
        {"ph": "X", "cat": "kernel", "name": "triton_red_fused_sum_1", "ts": 50, "dur": 40,
         "args": {}},
    ]
    bins = kernels.split_trace(write(tmp_path, events))["memory_kernels"]
    elementwise = [b for b in bins if b["class"] == "elementwise"]
    # 11 and 11.2 us share a quarter-octave bin; only the ATen op's shapes give bytes (two
    # 16 MB inputs and a 16 MB output), averaged over the kernels that have them.
    assert len(elementwise) == 1 and elementwise[0]["kernels"] == 2
    assert elementwise[0]["ms"] == pytest.approx(0.0222)
    assert elementwise[0]["bytes"] == 3 * 8192 * 1024 * 2
    assert [(b["class"], b["kernels"]) for b in bins if b["class"] != "elementwise"] == [
        ("reduction", 1)]
    assert "bytes" not in bins[-1]
