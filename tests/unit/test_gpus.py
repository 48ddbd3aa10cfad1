"""Which GPU a run gets (SSH-4, ERR-3, ERR-5). nvidia-smi's CSV here is scripted: it stands in for
hardware this machine does not have; the columns are what NVIDIA_SMI_QUERY asks for."""

from __future__ import annotations

import pytest

from potato_queue.host.gpus import (
    NO_KERNELS,
    GpuBusy,
    GpuRefused,
    GpuWait,
    agent_gpu_problem,
    agent_pick,
    agent_wait,
    agent_wait_expired,
    agent_wait_line,
    choose,
    describe,
    has_kernels,
    ssh_wait_expired,
    ssh_wait_line,
)
from potato_queue.host.nvidia_smi import NVIDIA_SMI_QUERY, parse_gpus, visible_gpus

pytestmark = pytest.mark.unit

TWO_GPUS = """\
0, NVIDIA A100-SXM4-80GB, 1200, 81920, 97, 8.0
1, NVIDIA A100-SXM4-80GB, 70000, 81920, 3, 8.0
"""
TORCH_ARCHS = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]


def test_nvidia_smi_csv_is_read_and_bad_lines_left_out() -> None:
    gpus = parse_gpus(TWO_GPUS + "2, Tesla K80, [N/A], 11441, [N/A], 3.7\nNo devices were found\n")
    assert [(g.index, g.free_mb, g.utilization_pct, g.compute_cap) for g in gpus] == [
        (0, 1200.0, 97.0, "8.0"),
        (1, 70000.0, 3.0, "8.0"),
        (2, None, None, "3.7"),
    ], "a GPU nvidia-smi cannot size stays"
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


def test_pinned_gpus_are_taken_as_asked_when_they_have_min_free_mb() -> None:
    assert choose("1", parse_gpus(TWO_GPUS), 2000, TORCH_ARCHS).visible_devices == "1"
    assert choose("0,1", parse_gpus(TWO_GPUS), 1000, TORCH_ARCHS).visible_devices == "0,1"
    assert choose("0", parse_gpus(TWO_GPUS), 0, TORCH_ARCHS).visible_devices == "0", "0: taken however busy"
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


@pytest.mark.parametrize(
    ("cap", "archs", "runs"),
    [
        ("8.6", ["sm_80"], True),  # same major, older minor: the cubin runs
        ("8.0", ["sm_86"], False),  # a newer minor's cubin does not
        ("9.0", ["sm_80", "compute_80"], True),  # PTX is compiled for newer GPUs
        ("9.0", ["sm_80"], False),
        ("9.0", ["sm_90a"], True),
        ("12.0", ["sm_120"], True),
        ("8.0", [], True),  # no arch list (no torch there yet): torch will say
    ],
)
def test_kernel_support_follows_cudas_compatibility_rules(cap: str, archs: list[str], runs: bool) -> None:
    gpu = parse_gpus(f"0, GPU, 1000, 2000, 0, {cap}\n")[0]
    assert has_kernels(gpu, archs) is runs


def test_no_gpu_with_min_free_mb_now_is_a_wait_that_says_what_it_sees() -> None:
    with pytest.raises(GpuBusy) as busy:
        choose("auto", parse_gpus(TWO_GPUS), 80000, TORCH_ARCHS)
    assert ssh_wait_line(busy.value.wait, "gpu-test") == (
        "waiting for a GPU with 80000 MB free on gpu-test (best now: GPU 1: NVIDIA A100-SXM4-80GB, 70000 of 81920 MB free)"
    )
    assert ssh_wait_expired(busy.value.wait, "gpu-test", "gpu-server", 30) == (
        "No GPU on gpu-test had 80000 MB free within setup_timeout_s (30 s) (at the end: GPU 1: NVIDIA A100-SXM4-80GB, "
        "70000 of 81920 MB free); the run did not start. Fix: free memory on a GPU of gpu-test, lower min_free_gpu_mb "
        "of backend gpu-server, or raise its setup_timeout_s"
    )


def test_a_pinned_gpu_without_min_free_mb_is_waited_for() -> None:
    with pytest.raises(
        GpuBusy,
        match=r"^gpus: 0,1 asks for GPU 0, which has 1200 of 81920 MB free, less than "
        r"min_free_gpu_mb \(2000\)$",
    ) as busy:
        choose("0,1", parse_gpus(TWO_GPUS), 2000, TORCH_ARCHS)
    assert ssh_wait_line(busy.value.wait, "gpu-test") == (
        "waiting for GPU 0,1 on gpu-test to have 2000 MB free (now: GPU 0: NVIDIA A100-SXM4-80GB, 1200 of 81920 MB free)"
    )
    assert ssh_wait_expired(busy.value.wait, "gpu-test", "b", 5).startswith(
        "GPU 0,1 on gpu-test did not have 2000 MB free within setup_timeout_s (5 s)"
    )


def test_what_waiting_cannot_fix_is_refused_at_once() -> None:
    for setting in ("auto", "1"):  # no GPU there has 90000 MB at all
        with pytest.raises(
            GpuRefused,
            match=r"^min_free_gpu_mb \(90000\) is more than any GPU on gpu has: the "
            r"largest, GPU \d, has 81920 MB$",
        ) as refused:
            choose(setting, parse_gpus(TWO_GPUS), 90000, TORCH_ARCHS, host="gpu")
        assert not isinstance(refused.value, GpuBusy)
    for setting, message in (("3", "asks for GPU 3"), ("auto", "no kernels")):
        with pytest.raises(GpuRefused, match=message) as refused:
            choose(setting, parse_gpus(TWO_GPUS), 80000, ["sm_90"])
        assert not isinstance(refused.value, GpuBusy)


def test_a_wait_goes_over_the_wire_and_back_unchanged() -> None:
    wait = GpuWait(2000, parse_gpus(TWO_GPUS)[0], "0")
    assert GpuWait.from_json(wait.to_json()) == wait
    assert GpuWait.from_json(GpuWait(2000, None).to_json()) == GpuWait(2000, None)


def test_an_agent_claims_only_while_a_gpu_it_may_use_has_min_free_mb() -> None:
    gpus = parse_gpus(TWO_GPUS)
    assert agent_wait(gpus, 2000) is None, "GPU 1 has room"
    assert agent_wait(gpus, 0) is None and agent_wait([], 0) is None, "0: no wait, GPU or not"
    assert agent_wait(visible_gpus(gpus, "0"), 2000) == GpuWait(2000, gpus[0]), "only GPU 0 is the agent's"
    assert agent_wait(gpus, 80000) == GpuWait(80000, gpus[1])
    assert agent_wait([], 2000) == GpuWait(2000, None)


def test_cuda_visible_devices_limits_the_gpus_an_agent_looks_at() -> None:
    gpus = parse_gpus(TWO_GPUS)
    assert visible_gpus(gpus, None) == gpus
    assert [gpu.index for gpu in visible_gpus(gpus, "1")] == [1]
    assert [gpu.index for gpu in visible_gpus(gpus, " 0 ,1")] == [0, 1]
    assert visible_gpus(gpus, "") == []
    assert visible_gpus(gpus, "GPU-5d5e3c3a-0000") == gpus, "UUIDs cannot be matched with nvidia-smi's index"


def test_an_agent_that_could_never_claim_does_not_start() -> None:
    gpus = parse_gpus(TWO_GPUS)
    assert agent_gpu_problem(False, [], 0) is None, "a CPU agent without --min-free-gpu-mb"
    assert agent_gpu_problem(True, gpus, 2000) is None
    assert agent_gpu_problem(False, [], 2000) == (
        "--min-free-gpu-mb 2000 waits for a GPU, but there is no nvidia-smi on this machine's PATH; fix: start the "
        "agent without --min-free-gpu-mb to take runs as a CPU machine, or put nvidia-smi on PATH"
    )
    assert "nvidia-smi shows none this agent can use" in (agent_gpu_problem(True, [], 2000) or "")
    assert (agent_gpu_problem(True, gpus, 90000) or "").startswith(
        "--min-free-gpu-mb 90000 is more than any GPU here has: the largest, GPU 0, has 81920 MB"
    )


def test_the_agent_wait_line_and_its_expiry_name_the_agent_its_best_gpu_and_the_fixes() -> None:
    wait = GpuWait(2000, parse_gpus("0, NVIDIA RTX A5000, 1200, 24000, 90, 8.6\n")[0])
    assert agent_wait_line("lab", "ws-1", wait) == (
        "waiting for the agent on lab (ws-1): its GPUs have less than 2000 MB free "
        "(best: GPU 0: NVIDIA RTX A5000, 1200 of 24000 MB free)"
    )
    assert agent_wait_expired("lab", "ws-1", wait, 30) == (
        "No GPU of the agent on lab (ws-1) had 2000 MB free within queue_timeout_s (30 s) (at the end: GPU 0: NVIDIA "
        "RTX A5000, 1200 of 24000 MB free), so it claimed no run. Fix: free memory on a GPU of ws-1, start its agent "
        "with a lower --min-free-gpu-mb, or raise queue_timeout_s of backend lab"
    )
    assert agent_wait_line("lab", "ws-1", GpuWait(2000, None)).endswith("(best: nvidia-smi shows no GPU)")


def test_a_claiming_agent_gives_its_run_the_gpu_with_most_room_and_without_a_minimum_none() -> None:
    gpus = parse_gpus(
        "0, NVIDIA A100-SXM4-80GB, 1200, 81920, 97, 8.0\n1, NVIDIA A100-SXM4-80GB, 70000, 81920, 3, 8.0\n"
    )
    choice = agent_pick(gpus, 2000)
    assert choice is not None and choice.visible_devices == "1"
    assert choice.line == "the run gets GPU 1: NVIDIA A100-SXM4-80GB, 70000 of 81920 MB free, 3 % busy"
    assert agent_pick(gpus, 0) is None, "no --min-free-gpu-mb: the agent's own CUDA_VISIBLE_DEVICES holds"


# -- GPUs as real machines print them ------------------------------------------------------------------------------
# Stand-ins for hardware this machine does not have, in the format NVIDIA documents: the fields are
# `nvidia-smi --help-query-gpu`'s (mig.mode.current: "Enabled" or "Disabled"), and nvidia-smi(1) says unsupported
# data "is indicated by a "N/A""; in CSV that is `[N/A]`, or `[Not Supported]` from older drivers (both seen for one
# field, github.com/enkore/i3pystatus/pull/776). The rows copy machines people posted: an A100 with MIG on, whose
# GPU row has N/A for its memory and GPU-Util (github.com/NVIDIA/DCGM/issues/152, driver 535.104.05), beside one
# with MIG off; a DGX Spark (GB10), whose unified memory nvidia-smi does not size (`[N/A], [N/A]`,
# github.com/mostlygeek/llama-swap/issues/782); a GeForce, whose mig.mode.current is `[N/A]`
# (github.com/Syllo/nvtop/pull/470). Trailing spaces and a blank line as a shell capture may leave them.
MIG_HOST = """\
0, NVIDIA A100-SXM4-80GB, [N/A], [N/A], [N/A], 8.0, Enabled
1, NVIDIA A100-SXM4-80GB, 70000, 81920, 3, 8.0, Disabled  \r

"""
MIG_ONLY = "0, NVIDIA A100-SXM4-80GB, [N/A], [N/A], [N/A], 8.0, Enabled\n"
GB10 = "0, NVIDIA GB10, [N/A], [N/A], 0, 12.1, [N/A]\n"
OLD_DRIVER = "0, Quadro K620, [Not Supported], [Not Supported], [Not Supported], [N/A], [N/A]\n"


def test_nvidia_smi_rows_with_n_a_not_supported_mig_and_missing_fields_are_all_read() -> None:
    assert NVIDIA_SMI_QUERY[1].endswith(",compute_cap,mig.mode.current")
    mig, plain = parse_gpus(MIG_HOST)
    assert (mig.free_mb, mig.total_mb, mig.utilization_pct, mig.compute_cap, mig.mig) == (None, None, None, "8.0", True)
    assert (plain.free_mb, plain.total_mb, plain.utilization_pct, plain.mig) == (70000.0, 81920.0, 3.0, False)
    [spark] = parse_gpus(GB10)
    assert (spark.free_mb, spark.total_mb, spark.utilization_pct, spark.compute_cap, spark.mig) == (
        None,
        None,
        0.0,
        "12.1",
        False,
    )
    [old] = parse_gpus(OLD_DRIVER)
    assert (old.free_mb, old.utilization_pct, old.compute_cap, old.free_text) == (None, None, None, "[Not Supported]")
    # An older query's rows: no MIG mode, or no compute capability either.
    assert parse_gpus("0, Tesla T4, 15000, 15360, 0, 7.5\n")[0][2:] == (15000.0, 15360.0, 0.0, "7.5", False, "")
    assert parse_gpus("0, Tesla T4, 15000, 15360, 0\n")[0].compute_cap is None


def test_a_gpu_whose_free_memory_is_unknown_is_described_as_such_and_mig_named_as_the_reason() -> None:
    assert describe(parse_gpus(GB10)[0]) == "GPU 0: NVIDIA GB10, free memory unknown ([N/A]), 0 % busy"
    assert describe(parse_gpus(OLD_DRIVER)[0]) == "GPU 0: Quadro K620, free memory unknown ([Not Supported])"
    assert describe(parse_gpus(MIG_ONLY)[0]) == "GPU 0: NVIDIA A100-SXM4-80GB, free memory not reported, as MIG is on"
    # Some drivers do report a MIG GPU's memory (github.com/utkuozdemir/nvidia_gpu_exporter/issues/203): all its
    # instances' together, none of which a run gets whole.
    reported = parse_gpus("0, NVIDIA A800-SXM4-80GB, 45383, 81920, [N/A], 8.0, Enabled\n")[0]
    assert (
        describe(reported)
        == "GPU 0: NVIDIA A800-SXM4-80GB, 45383 of 81920 MB free, MIG is on: its MIG instances' together"
    )


def test_auto_with_a_minimum_takes_only_a_gpu_whose_free_memory_it_can_check() -> None:
    assert choose("auto", parse_gpus(MIG_HOST), 2000, TORCH_ARCHS).visible_devices == "1"
    with pytest.raises(GpuRefused) as refused:  # waiting would not make nvidia-smi tell: refused at once
        choose("auto", parse_gpus(MIG_ONLY), 2000, TORCH_ARCHS, host="gpu")
    assert not isinstance(refused.value, GpuBusy)
    assert str(refused.value) == (
        "min_free_gpu_mb (2000) cannot be checked on gpu: nvidia-smi reports no free memory for its GPUs (a GPU with "
        "MIG on has its memory split among its MIG instances) (GPU 0: NVIDIA A100-SXM4-80GB, free memory not "
        'reported, as MIG is on). Fix: pin a GPU with the backend\'s gpus, like gpus: "0" (a pinned GPU whose free '
        "memory is unknown is taken unchecked), or set min_free_gpu_mb: 0"
    )
    with pytest.raises(GpuRefused, match=r"free memory unknown \(\[N/A\]\)\)\. Fix: pin a GPU"):
        choose("auto", parse_gpus(GB10), 2000, ["sm_120"])
    assert choose("auto", parse_gpus(MIG_ONLY), 0, TORCH_ARCHS).line == (
        "the run gets GPU 0: NVIDIA A100-SXM4-80GB, free memory not reported, as MIG is on"
    ), "no minimum: no check"
    with pytest.raises(
        GpuBusy,
        match=r"^No GPU has 80000 MB free \(GPU 0 not counted: free memory not reported, "
        r"as MIG is on\)$",
    ) as busy:
        choose("auto", parse_gpus(MIG_HOST), 80000, TORCH_ARCHS)
    assert busy.value.wait.best == parse_gpus(MIG_HOST)[1], "the wait watches the GPU it can size"


def test_a_pinned_gpu_whose_free_memory_is_unknown_is_taken_saying_the_minimum_was_not_checked() -> None:
    choice = choose("0", parse_gpus(MIG_HOST), 2000, TORCH_ARCHS)
    assert (choice.visible_devices, choice.device) == ("0", "cuda")
    assert choice.line == (
        "the run gets GPU 0: NVIDIA A100-SXM4-80GB, free memory not reported, as MIG is on "
        "(min_free_gpu_mb not checked on GPU 0: its free memory is unknown)"
    )
    assert choose("0", parse_gpus(MIG_HOST), 0, TORCH_ARCHS).line.endswith("as MIG is on")
    with pytest.raises(GpuBusy, match=r"^gpus: 0,1 asks for GPU 1, which has 70000 of 81920 MB free, less than"):
        choose("0,1", parse_gpus(MIG_HOST), 75000, TORCH_ARCHS)


def test_an_agent_counts_only_gpus_it_can_size_and_one_with_none_does_not_start_with_a_minimum() -> None:
    from potato_queue.server.claims import GpuWaitIn

    gpus = parse_gpus(MIG_HOST)
    assert agent_wait(gpus, 2000) is None and agent_pick(gpus, 2000) == choose("1", gpus, 0)
    wait = agent_wait(gpus, 80000)
    assert wait == GpuWait(80000, gpus[1])
    assert GpuWaitIn.model_validate(wait.to_json()).best is not None, "the server takes the agent's report"
    assert agent_wait(parse_gpus(MIG_ONLY), 2000) == GpuWait(2000, None)
    assert agent_gpu_problem(True, parse_gpus(MIG_ONLY), 2000) == (
        "--min-free-gpu-mb 2000 waits for free GPU memory, but nvidia-smi reports none here (GPU 0: NVIDIA "
        "A100-SXM4-80GB, free memory not reported, as MIG is on); fix: start the agent without --min-free-gpu-mb: its "
        "runs then get the GPUs CUDA_VISIBLE_DEVICES gives it, unchecked; to give its runs one MIG instance, start it "
        "with CUDA_VISIBLE_DEVICES=MIG-<uuid> (nvidia-smi -L lists them)"
    )
    assert "MIG-<uuid>" not in (agent_gpu_problem(True, parse_gpus(GB10), 2000) or "MIG-<uuid>")
    assert agent_gpu_problem(True, gpus, 2000) is None and agent_gpu_problem(True, parse_gpus(MIG_ONLY), 0) is None
