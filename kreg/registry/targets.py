"""Built-in hardware targets (numbers from the vendors' documentation) and device detection."""

from __future__ import annotations

from collections.abc import Mapping

from .model import Target

KIB = 1024

SM90 = Target(
    name="sm90",
    backend="cuda",
    arch=90,
    warp_size=32,
    compute_units=132,
    shared_mem_per_unit=228 * KIB,
    shared_mem_per_block=227 * KIB,
    registers_per_unit=65536,
    max_registers_per_thread=255,
    devices=("H100", "H200"),
    verification="gpu",
    description="NVIDIA Hopper (H100, H200)",
)

GFX950 = Target(
    name="gfx950",
    backend="hip",
    arch="gfx950",
    warp_size=64,
    compute_units=256,
    shared_mem_per_unit=160 * KIB,
    shared_mem_per_block=160 * KIB,
    registers_per_unit=131072,  # 512 KiB of VGPRs per CU
    max_registers_per_thread=512,  # arch VGPRs + AGPRs
    devices=("MI350X", "MI355X"),
    verification="compile",
    description="AMD CDNA4 (MI350X, MI355X)",
)

GFX942 = Target(
    name="gfx942",
    backend="hip",
    arch="gfx942",
    warp_size=64,
    compute_units=304,
    shared_mem_per_unit=64 * KIB,
    shared_mem_per_block=64 * KIB,
    registers_per_unit=131072,
    max_registers_per_thread=512,
    devices=("MI300X", "MI325X"),
    verification="compile",
    description="AMD CDNA3 (MI300X, MI325X)",
)

BUILTIN_TARGETS = (SM90, GFX950, GFX942)


def detect(targets=None) -> Target | None:
    """The registered target of the current GPU, or None without one (or an unknown one)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return None
    if not torch.cuda.is_available():
        return None
    if targets is None:
        from . import get_registry

        targets = get_registry().targets.values()
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    if torch.version.hip:
        arch = props.gcnArchName.split(":")[0]
        matches = [t for t in targets if t.backend == "hip" and t.arch == arch]
    else:
        cc = props.major * 10 + props.minor
        matches = [t for t in targets if t.backend == "cuda" and t.arch == cc]
    return matches[0] if matches else None


def resolve(targets: Mapping[str, Target], target) -> Target:
    """The one resolution of a ``target`` argument: a ``Target`` as it is, a registered name, or
    None for the GPU detected here. Anything else raises ``ValueError`` naming ``target``."""
    if isinstance(target, Target):
        return target
    known = ", ".join(targets)
    if target is None:
        found = detect(targets.values())
        if found is None:
            raise ValueError(f"target: no supported GPU detected: pass target= (one of {known})")
        return found
    if not isinstance(target, str) or target not in targets:
        raise ValueError(f"target: unknown target {target!r}; known: {known}")
    return targets[target]
