"""The key of a call's launch plan (``api.plan_key``): what Triton's JIT specialises on and what
validation reads are in it, so a changed shape, dtype, flag, alignment or contiguity misses, and
calls whose values are read on the host are not planned. Replays: tests/interpreter/
test_kda_plans.py (interpreter) and tests/test_kda_hostpath_gpu.py (compiled launchers)."""

from __future__ import annotations

import pytest
import torch

from kreg.dispatch import selector
from kreg.families.kda import api


def make(T=32, H=2, K=32, dtype=torch.float16):
    return dict(q=torch.zeros(1, T, H, K, dtype=dtype), k=torch.zeros(1, T, H, K, dtype=dtype),
                v=torch.zeros(1, T, H, K, dtype=dtype), g=torch.zeros(1, T, H, K, dtype=dtype),
                beta=torch.zeros(1, T, H, dtype=dtype))  # fmt: skip


def key(x, **options):
    x = dict(x)
    tensors = [x.pop(n) for n in ("q", "k", "v", "g", "beta")]
    return api.plan_key(*tensors, {**x, **options}, ("auto", False, None, True))


def test_same_call_same_key():
    x = make()
    assert key(x) == key(make()) and key(x) is not None


def _misaligned(t):
    """The same shape and dtype at an address 2 bytes off 16-byte alignment."""
    buf = torch.zeros(t.numel() + 8, dtype=t.dtype)
    return buf[1 : 1 + t.numel()].view(t.shape)


@pytest.mark.parametrize(
    "change",
    [
        lambda x: {**x, "q": make(T=48)["q"]},  # shape
        lambda x: {**x, **make(dtype=torch.float32)},  # dtype
        lambda x: {**x, "g": x["g"].float()},  # g may be fp32: another kernel
        lambda x: {**x, "k": _misaligned(x["k"])},  # alignment (Triton's divisibility by 16)
        lambda x: {**x, "v": x["v"].transpose(1, 2).contiguous().transpose(1, 2)},  # strides
        lambda x: {**x, "beta": x["beta"].clone().requires_grad_()},  # validation refuses it
        lambda x: {**x, "output_final_state": True},  # a flag
        lambda x: {**x, "scale": 0.25},  # a value the kernels take
        lambda x: {**x, "cu_seqlens": torch.tensor([0, 32]).to("meta")},  # varlen
        lambda x: {**x, "cu_seqlens": torch.tensor([0, 32], dtype=torch.int32).to("meta")},
        lambda x: {**x, "cu_seqlens": torch.tensor([0, 5, 32]).to("meta")},  # N
        lambda x: {**x, "cu_seqlens": torch.tensor([0, 32]).to("meta"), "max_seqlen": 32},
    ],
    ids=[
        "shape",
        "dtype",
        "g_dtype",
        "alignment",
        "strides",
        "grad",
        "flag",
        "scale",
        "varlen",
        "int32_offsets",
        "num_seqs",
        "max_seqlen",
    ],  # fmt: skip
)
def test_a_change_misses(change):
    x = make()
    assert key(change(x)) != key(x)


@pytest.mark.parametrize(
    "change",
    [
        lambda a: torch.zeros(4),  # shape
        lambda a: a.double(),  # dtype
        lambda a: a.to("meta"),  # device
        lambda a: torch.zeros(2, 2).t()[0],  # contiguity: a column, stride 2
        lambda a: _misaligned(a),  # alignment
    ],
    ids=["shape", "dtype", "device", "contiguity", "alignment"],
)
def test_an_option_tensor_changed_misses(change):
    """A tensor among the options (A_log here) is described as q is, not by its identity."""
    x = make()
    a_log = torch.zeros(2)
    assert key(x, A_log=a_log) == key(x, A_log=torch.ones(2))  # values are not in the key
    assert key(x, A_log=change(a_log)) != key(x, A_log=a_log)


@pytest.mark.parametrize(
    "given, planned",
    [
        (dict(output_final_state=1), dict(output_final_state=True)),
        (dict(use_qk_l2norm=0), dict(use_qk_l2norm=False)),
        (dict(scale=1), dict(scale=1.0)),
    ],
    ids=["flag_as_int", "false_as_zero", "int_scale"],
)
def test_a_number_of_another_type_misses(given, planned):
    """True == 1 == 1.0 in Python: the key holds each option's type beside its value, so a flag
    given as 1 (which validation refuses) cannot replay a plan made for True."""
    x = make()
    assert key(x, **given) != key(x, **planned)


def test_options_are_keyed_by_name():
    """The same values under other names miss: the key is one flat tuple, the options' names in
    it beside their values."""
    x = make()
    assert key(x, scale=None) != key(x, gate_lower_bound=None)


def test_grad_mode_and_selection_generation_are_in_the_key():
    x = make()
    with torch.no_grad():
        off = key(x)
    assert off != key(x)
    before = key(x)
    selector.clear_cache()
    assert key(x) != before


@pytest.mark.parametrize(
    "options",
    [
        dict(cu_seqlens=torch.tensor([0, 32])),  # CPU offsets: validated on the host
        dict(cu_seqlens=torch.tensor([0, 32]).to("meta"), cu_seqlens_cpu=torch.tensor([0, 32])),
        dict(scale=torch.tensor(0.5)),  # a 0-d tensor's value is read
        dict(initial_state_indices=torch.tensor([0])),  # host slots: validated on the host
    ],
    ids=["cpu_offsets", "cu_seqlens_cpu", "scale_tensor", "host_slots"],
)
def test_calls_with_host_values_are_not_planned(options):
    assert key(make(), **options) is None


def test_a_non_tensor_input_is_not_planned():
    assert key({**make(), "q": [[0.0]]}) is None


def test_a_tensor_without_a_data_pointer_is_not_planned():
    """A sparse tensor has no data_ptr: no key (validation then names it), not a RuntimeError."""
    assert key({**make(), "v": make()["v"].to_sparse()}) is None
    assert key(make(), A_log=torch.zeros(2).to_sparse()) is None


def test_an_unhashable_option_takes_the_normal_path(monkeypatch):
    """A list where a tensor goes makes the key unhashable: the normal path names the argument."""
    monkeypatch.setattr(api, "interpreting", lambda: True)
    with pytest.raises(ValueError, match="^A_log: "):
        api.kda_prefill(**make(), gate_activation="softplus", A_log=[0.0])


def _launcher(**overrides):
    """Triton's CUDA launcher without its compiled module: its C entry records its arguments."""
    pytest.importorskip("triton.backends.nvidia.driver")
    from triton.backends.nvidia.driver import CudaLauncher

    launcher = object.__new__(CudaLauncher)
    seen = []
    fields = dict(launch=lambda *a: seen.append(a), global_scratch_size=0, global_scratch_align=1,
                  profile_scratch_size=0, profile_scratch_align=1, num_ctas=1,
                  launch_cooperative_grid=False, launch_pdl=True)  # fmt: skip
    for name, value in {**fields, **overrides}.items():
        setattr(launcher, name, value)
    return launcher, seen


def test_the_direct_launch_passes_what_tritons_launcher_passes():
    """A replay calls the launcher's C entry itself (``plans._direct_launch``): with the
    arguments Triton's own wrapper gives it, checked here against that wrapper on Triton 3.6,
    and not at all where the wrapper would do more (scratch memory) or is another version."""
    import triton

    from kreg.families.kda import plans

    launcher, seen = _launcher()
    direct = plans._direct_launch(launcher, (5, 6, 7), function=1234)
    if not triton.__version__.startswith("3.6."):
        assert direct is None
        return
    args = (0xA000, None, 3, 0.5)
    launcher(5, 6, 7, 42, 1234, "packed", None, None, None, *args)  # Triton's way
    direct(42, "packed", *args)
    assert len(seen) == 2 and seen[0] == seen[1]
    scratch, _ = _launcher(global_scratch_size=128)
    assert plans._direct_launch(scratch, (1, 1, 1), function=0) is None
    assert plans._direct_launch(object(), (1, 1, 1), function=0) is None


def test_a_recording_sees_only_its_own_threads_work():
    """An engine driving two devices from two threads: while one thread records a plan, the
    other's launches must not enter that plan, and its being inside a launch must not let the
    recording thread's torch ops (a padded copy) pass unrecorded."""
    import threading
    import types

    from kreg.families.kda import plans

    lc = types.SimpleNamespace(fn=types.SimpleNamespace(fn=lambda x: None), constexprs={})
    inside, checked = threading.Event(), threading.Event()

    def other_thread():
        with plans.launching():  # the other thread is inside a launch ...
            inside.set()
            checked.wait(10)
        plans.note_launch(lc, (1,), (torch.zeros(1),), {}, kernel=None)  # ... and launches

    with plans.Recorder({}, torch.device("cpu")) as recorder:
        worker = threading.Thread(target=other_thread)
        worker.start()
        assert inside.wait(10)
        assert not plans.in_launch()  # this thread is not
        torch.zeros(2).clone()  # a torch op of the recorded run: it refuses the plan
        checked.set()
        worker.join(10)
    assert recorder.launches == []
    assert recorder.refused == "torch op clone"
