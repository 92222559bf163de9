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
