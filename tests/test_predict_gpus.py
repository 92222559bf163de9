"""The GPU table: every number has a source naming a vendor document, none is missing its
explanation, and names resolve (an unknown one names the closest)."""

import tomllib
from importlib import resources

import pytest

from stepbench.errors import UserError
from stepbench.predict import gpus

VENDOR_DOCS = ("datasheet", "whitepaper", "specifications", "Programming Guide",
               "Specification")


def raw() -> dict:
    text = resources.files("stepbench.predict").joinpath("gpus.toml").read_text()
    return tomllib.loads(text)["gpus"]


def test_every_number_has_a_source_that_names_a_vendor_document():
    missing, unnamed = [], []
    for name, entry in raw().items():
        sources = entry.get("sources", {})
        for key, value in entry.items():
            if key in ("sources", "aliases", "notes", "measured", "measured_sources"):
                continue
            assert key in gpus.FIELDS, (name, key)
            assert isinstance(value, (int, float)) and value > 0, (name, key, value)
            if not sources.get(key):
                missing.append((name, key))
            elif not any(doc in sources[key] for doc in VENDOR_DOCS):
                unnamed.append((name, key, sources[key]))
    assert missing == [] and unnamed == []


def test_a_published_measurement_names_its_url_and_is_no_vendor_field():
    seen = 0
    for name, entry in raw().items():
        for key, value in entry.get("measured", {}).items():
            assert key in gpus.MEASURED_FIELDS and key not in gpus.FIELDS, (name, key)
            assert isinstance(value, (int, float)) and value > 0, (name, key)
            assert "https://" in entry["measured_sources"][key], (name, key)
            seen += 1
    assert seen >= 1


def test_a_field_left_out_says_why():
    for name, entry in raw().items():
        for key in gpus.FIELDS:
            assert key in entry or entry["sources"].get(key), (name, key)


def test_the_common_gpus_and_the_price_lists_gpus_are_in_the_table():
    for name in ("A100 40GB", "A100 80GB", "H100 SXM", "H100 PCIe", "H200", "B200", "L4",
                 "L40S", "RTX A6000", "RTX 4090", "RTX 5090", "NVIDIA GeForce RTX 5090",
                 "nvidia h100 pcie"):
        assert gpus.find(name) is not None, name
    from pathlib import Path
    prices = tomllib.loads((Path(__file__).parent.parent / "benchmarks" / "prices.toml")
                           .read_text())["prices"]
    assert [g for g in prices if gpus.find(g) is None] == []


def test_dense_peaks_are_below_the_sparse_ones_they_came_from():
    # A halved figure was halved once: the H100 PCIe's 1,513 with sparsity is 756.5 dense.
    assert gpus.lookup("H100 PCIe").tensor_tflops("bf16") == 756.5
    assert gpus.lookup("H200").tensor_tflops("fp8") == 1978.9
    assert gpus.lookup("RTX A6000").tensor_tflops("fp8") is None


def test_an_unknown_gpu_names_the_closest():
    with pytest.raises(UserError, match=r"unknown GPU 'L40'; closest: NVIDIA L40S"):
        gpus.lookup("L40")
    with pytest.raises(UserError, match="closest: NVIDIA H100 PCIe"):
        gpus.lookup("H100 PCI")
