"""predict/memory.py and model.wave_factor: what the record's kernel bins and GEMM shapes change
in a prediction, and where the constants come from."""

from pathlib import Path

import pytest

from stepbench.predict import gpus, memory, model
from test_predict import step

H200, L40S, A6000 = gpus.lookup("H200"), gpus.lookup("L40S"), gpus.lookup("RTX A6000")
MB = 2**20

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"


def bins(size_bytes: float, cls: str = "elementwise") -> list[dict]:
    return [{"class": cls, "us": 20.0, "kernels": 10, "ms": 0.2, "bytes": size_bytes}]


def test_a_kernel_whose_inputs_fit_the_targets_l2_runs_faster_than_its_dram_says():
    # 3 x 8 MB: the inputs (16 MB) fit the L40S's 96 MB L2, and the H200's 50 MB.
    assert memory.l2_factors(bins(24 * MB), H200, L40S)["elementwise"] < 1
    # 3 x 32 MB: the inputs fit the L40S's L2, not the H200's.
    assert memory.l2_factors(bins(96 * MB), H200, L40S)["elementwise"] < 1
    # The RTX A6000's 6 MB L2 holds neither: the H200's hits are lost there.
    assert memory.l2_factors(bins(24 * MB), H200, A6000)["elementwise"] > 1


def test_a_kernel_beyond_every_l2_scales_with_dram_bandwidth_alone():
    assert memory.l2_factors(bins(3 * 1024 * MB), H200, L40S) == {"elementwise": pytest.approx(1)}


def test_without_shapes_a_kernels_bytes_come_from_its_time_on_the_source():
    c = memory.constants()
    size = memory.size_of(20e-6, H200, c)
    assert memory.kernel_s(size, H200, c) == pytest.approx(20e-6, rel=1e-6)
    no_bytes = [{k: v for k, v in b.items() if k != "bytes"} for b in bins(0)]
    assert memory.l2_factors(no_bytes, H200, L40S) == {
        k: pytest.approx(v, rel=1e-9) for k, v in memory.l2_factors(bins(size), H200, L40S).items()}


def test_no_bins_or_no_l2_figure_changes_nothing():
    assert memory.l2_factors(None, H200, L40S) == {}
    b200 = gpus.lookup("B200")     # the table has no L2 size for it
    assert memory.l2_factors(bins(24 * MB), H200, b200) == {}


def test_the_constants_name_where_they_come_from():
    c = memory.constants()
    assert {"dram_efficiency", "l2_gbs_per_sm", "l2_full_hit_share", "read_share"} <= set(c)
    assert "first estimate" in c["source"] or "microbench" in c["source"]


def test_a_gemm_filling_the_sources_sms_in_one_wave_leaves_a_bigger_gpus_idle():
    rtx5090 = gpus.lookup("RTX 5090")
    tile = model.GEMM_TILE
    one_wave = [{"m": 12 * tile, "n": 11 * tile, "k": 1024, "ms": 1.0}]   # 132 tiles
    assert model.wave_factor(one_wave, H200, rtx5090) == pytest.approx(170 / 132)
    assert model.wave_factor(None, H200, rtx5090) == 1.0
    p = model.predict(with_gemms(one_wave), H200, rtx5090)
    plain = model.predict(with_gemms(None), H200, rtx5090)
    assert p.classes_ms["matmul"] == pytest.approx(plain.classes_ms["matmul"] * 170 / 132)


def with_gemms(gemms):
    return step({"matmul": 10.0}, 10.0, gemms=gemms)


def test_the_l2_factor_scales_the_class_and_drops_the_intervals_own_allowance():
    binned = step({"elementwise": 10.0}, 10.0, memory_kernels=bins(24 * MB))
    plain = step({"elementwise": 10.0}, 10.0)
    with_bins, without = model.predict(binned, H200, L40S), model.predict(plain, H200, L40S)
    factor = memory.l2_factors(bins(24 * MB), H200, L40S)["elementwise"]
    assert with_bins.classes_ms["elementwise"] == pytest.approx(
        without.classes_ms["elementwise"] * factor)
    u = model.UNCERTAINTY["elementwise"]
    assert with_bins.step_ms_low == pytest.approx(with_bins.step_ms * (1 - u))
    assert without.step_ms_low < without.step_ms * (1 - u)


def test_the_notes_say_where_the_l2_constants_come_from_where_they_acted():
    from stepbench.predict import document

    binned = step({"elementwise": 10.0}, 10.0, memory_kernels=bins(24 * MB))
    plain = step({"elementwise": 10.0}, 10.0)

    def l2_notes(source):
        rows = [model.predict(source, H200, L40S)]
        notes = document.notes(rows, [source], [], priced=True, price_flag="--price-list")
        return [n for n in notes if "L2 model" in n]

    (said,) = l2_notes(binned)
    assert memory.constants()["source"] in said           # "first estimate, not measured" now
    assert l2_notes(plain) == []                          # no bins: the constants played no part


def test_a_microbenchmark_that_timed_launches_calibrates_dram_alone():
    """The H200's first microbenchmark (2026-12-05) timed every add under 8 MB at ~9 us, the
    host's launch: calibrate_predict takes its DRAM efficiency and keeps the L2 constants as they
    stand, saying so; a run whose L2-sized adds grow with their bytes calibrates the L2."""
    import copy
    import json

    from test_benchmarks import load

    calibrate = load("calibrate_predict")
    path = RESULTS / "h200-2026-12-05-microbench.json"
    measured = json.loads(path.read_text())
    launched = calibrate.calibrate(measured, path.name)
    assert launched["dram_efficiency"] == pytest.approx(0.909, abs=0.002)
    assert launched["l2_gbs_per_sm"] == memory.constants()["l2_gbs_per_sm"]
    assert "first estimates" in launched["source"] and path.name in launched["source"]
    # The same file with the small adds' times in proportion to their bytes, at 2x the DRAM's
    # rate (what an L2 gives): the L2 constants come from it.
    graphed = copy.deepcopy(measured)
    for row in graphed["elementwise"]:
        if row["working_set_mb"] <= 15:
            row["gbs"] = 2 * 4363.0
            row["us"] = row["bytes"] / (row["gbs"] * 1e9) * 1e6
    kernels = calibrate.calibrate(graphed, path.name)
    assert kernels["l2_gbs_per_sm"] == pytest.approx(2 * 4363.0 * 0.909 / 132, rel=0.01)
    assert "first estimates" not in kernels["source"]


def test_the_predictor_reads_the_graph_timed_run_through_the_gpu_tables_bandwidth():
    """The first graph-timed run (an H100 80GB HBM3, 2026-12-05) wrote the H200's 4,800 GB/s as
    its datasheet figure (the microbenchmark's old default): calibrate_predict divides by the GPU
    table's 3,350 instead, so the DRAM efficiency is the H100's 0.914 (0.638 against 4,800), near
    the H200's 0.909; and calibration.toml is exactly what that file calibrates to."""
    import json

    from test_benchmarks import load

    calibrate = load("calibrate_predict")
    path = RESULTS / "h100-2026-12-05-lease2-microbench.json"
    measured = json.loads(path.read_text())
    assert measured["datasheet_bandwidth_gbs"] == 4800.0           # the old default, kept as run
    values = calibrate.calibrate(measured, path.name)
    assert values["dram_efficiency"] == pytest.approx(0.914, abs=0.002)
    assert "3350 GB/s" in values["source"] and "first estimates" not in values["source"]
    assert values == memory.constants()
    # a card the table lacks, with no figure in the file either: a message naming the fix
    unknown = dict(measured, gpu="NVIDIA Made Up 9000", datasheet_bandwidth_gbs=None)
    with pytest.raises(SystemExit, match="--bandwidth-gbs"):
        calibrate.calibrate(unknown, path.name)


def test_the_l2_line_and_where_the_adds_leave_the_l2():
    """The L2's throughput is the slope of the small adds' times, their fixed time the
    intercept; the inputs leave the L2 midway between the last add on that line and the next
    size measured, so quarter-octave sizes narrow it."""
    from test_benchmarks import load

    calibrate = load("calibrate_predict")
    microbench = load("gpu_microbench")
    l2, fixed, l2_gbs, dram_gbs = 50.0, 1.2, 8000.0, 3000.0

    def add(tensor_mb):
        moved = 3 * tensor_mb * MB
        inside = tensor_mb * 2 <= 0.4 * l2                       # inputs up to 0.4 of the L2
        us = fixed + moved / (l2_gbs if inside else dram_gbs) / 1e3
        return {"op": "add", "working_set_mb": 3 * tensor_mb, "bytes": moved, "us": us}

    small = [add(mb) for mb in (0.5, 1.0, 2.0, 4.0)]
    assert calibrate.l2_line(small) == (pytest.approx(fixed), pytest.approx(l2_gbs))
    doubling = [add(mb) for mb in microbench.sizes_mb(None)]
    fine = [add(mb) for mb in microbench.sizes_mb(l2)]
    coarse = calibrate.full_hit_share(doubling, l2, fixed, l2_gbs)
    narrow = calibrate.full_hit_share(fine, l2, fixed, l2_gbs)
    assert coarse == pytest.approx((0.32 + 0.64) / 2)            # 8 and 16 MB a tensor
    assert narrow < coarse and narrow == pytest.approx(0.4, abs=0.03)     # 0.354 to 0.420


def test_the_microbenchmark_takes_the_datasheet_bandwidth_from_the_gpu_table():
    from test_benchmarks import load

    microbench = load("gpu_microbench")
    assert microbench.table_bandwidth("NVIDIA H100 80GB HBM3") == 3350.0
    assert microbench.table_bandwidth("NVIDIA H200") == 4800.0
    assert microbench.table_bandwidth("NVIDIA Made Up 9000") is None
