"""Which GPU a run gets (SSH-4, ERR-3, ERR-5). nvidia-smi's CSV here is scripted: it stands in for
hardware this machine does not have; the columns are what NVIDIA_SMI_QUERY asks for."""

from __future__ import annotations

import pytest

from potato_queue.host.gpus import NO_KERNELS, GpuRefused, choose, describe, has_kernels, parse_gpus

pytestmark = pytest.mark.unit

TWO_GPUS = """\
0, NVIDIA A100-SXM4-80GB, 1200, 81920, 97, 8.0
1, NVIDIA A100-SXM4-80GB, 70000, 81920, 3, 8.0
"""
TORCH_ARCHS = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]


def test_nvidia_smi_csv_is_read_and_bad_lines_left_out() -> None:
    gpus = parse_gpus(TWO_GPUS + "2, Tesla K80, [N/A], 11441, [N/A], 3.7\nNo devices were found\n")
    assert [(g.index, g.free_mb, g.utilization_pct, g.compute_cap) for g in gpus] == [
        (0, 1200.0, 97.0, "8.0"), (1, 70000.0, 3.0, "8.0")]
    assert parse_gpus("") == []


def test_auto_takes_the_gpu_with_most_free_memory() -> None:
    choice = choose("auto", parse_gpus(TWO_GPUS), 2000, TORCH_ARCHS)
    assert (choice.visible_devices, choice.device) == ("1", "cuda")
    assert choice.line == "the run gets GPU 1: NVIDIA A100-SXM4-80GB, 70000 of 81920 MB free, 3 % busy"


def test_auto_refuses_when_no_gpu_has_min_free_mb() -> None:
    with pytest.raises(GpuRefused, match=r"^No GPU has 80000 MB free$"):  # ERR-3
        choose("auto", parse_gpus(TWO_GPUS), 80000, TORCH_ARCHS)


def test_no_gpu_on_the_host_means_cpu_under_auto_and_none_means_cpu() -> None:
    assert choose("auto", [], 2000, None, host="gpu").line == "no GPU on gpu: training on CPU"
    assert choose("none", parse_gpus(TWO_GPUS), 2000).device == "cpu"
    assert choose("none", parse_gpus(TWO_GPUS), 2000).visible_devices == ""


def test_pinned_gpus_are_taken_as_asked_even_when_busy() -> None:
    assert choose("0", parse_gpus(TWO_GPUS), 2000, TORCH_ARCHS).visible_devices == "0"
    assert choose("0,1", parse_gpus(TWO_GPUS), 2000, TORCH_ARCHS).visible_devices == "0,1"
    with pytest.raises(GpuRefused, match=r"gpus: 3 asks for GPU 3, but gpu has GPUs: 0, 1"):
        choose("3", parse_gpus(TWO_GPUS), 2000, TORCH_ARCHS, host="gpu")


def test_a_gpu_the_hosts_torch_has_no_kernels_for_is_marked_and_skipped() -> None:
    mixed = parse_gpus("0, NVIDIA B200, 180000, 183000, 0, 10.0\n1, NVIDIA A100, 9000, 81920, 50, 8.0\n")
    assert describe(mixed[0], TORCH_ARCHS).endswith(" " + NO_KERNELS)
    assert NO_KERNELS not in describe(mixed[1], TORCH_ARCHS)
    assert choose("auto", mixed, 2000, TORCH_ARCHS).visible_devices == "1", "the B200 has more free but no kernels"
    with pytest.raises(GpuRefused, match=r"^This host's torch has no kernels for any of its GPUs$"):  # ERR-5
        choose("auto", mixed[:1], 2000, TORCH_ARCHS)
    with pytest.raises(GpuRefused, match="no kernels for it"):
        choose("0", mixed, 2000, TORCH_ARCHS)


@pytest.mark.parametrize(("cap", "archs", "runs"), [
    ("8.6", ["sm_80"], True),          # same major, older minor: the cubin runs
    ("8.0", ["sm_86"], False),         # a newer minor's cubin does not
    ("9.0", ["sm_80", "compute_80"], True),  # PTX is compiled for newer GPUs
    ("9.0", ["sm_80"], False),
    ("9.0", ["sm_90a"], True),
    ("12.0", ["sm_120"], True),
    ("8.0", [], True),                 # no arch list (no torch there yet): torch will say
])
def test_kernel_support_follows_cudas_compatibility_rules(cap: str, archs: list[str], runs: bool) -> None:
    gpu = parse_gpus(f"0, GPU, 1000, 2000, 0, {cap}\n")[0]
    assert has_kernels(gpu, archs) is runs
