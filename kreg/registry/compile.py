"""Compile a ``@triton.jit`` function for any registered target, on any machine.

Builders of every family go through :func:`compile_kernel`, so artifacts, IR normalisation and
resource reports are uniform across families.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .model import Artifact, Target

IR_STAGES = ("ttir", "ttgir", "llir", "ptx", "amdgcn")


def compile_kernel(
    fn,
    signature: Mapping[str, str],
    constexprs: Mapping[str, Any],
    target: Target,
    *,
    num_warps: int = 4,
    num_stages: int = 2,
    values: Mapping[str, Any] | None = None,
) -> Artifact:
    """Compile ``fn`` for ``target`` with Triton's AOT path (no device needed), specialised as
    Triton's JIT specialises it at launch, so the artifact is the kernel that runs.

    ``signature`` maps each runtime argument to a Triton type ("*bf16", "i32", "fp32", ...);
    ``constexprs`` maps each constexpr argument to its value. ``values`` gives the runtime value a
    launch passes for every non-pointer argument (ints: the JIT specialises them on divisibility
    by 16 and folds a 1 into a constant) and ``None`` for a pointer the launch passes as None
    (folded to a constant None); any other pointer is taken as a 16-byte aligned tensor, as every
    buffer kreg allocates or requires contiguous is.
    """
    import torch  # noqa: F401  # not lazily inside Triton's native binder: it swallows a Ctrl-C
    import triton
    from triton.compiler import ASTSource

    spec_sig, spec_constexprs, attrs, options = jit_specialisation(
        fn, signature, constexprs, target, values or {}, num_warps=num_warps,
        num_stages=num_stages,
    )  # fmt: skip
    src = ASTSource(fn=fn, signature=spec_sig, constexprs=spec_constexprs, attrs=attrs)
    compiled = triton.compile(src, target=target.gpu_target(), options=options)
    stages = {k: v for k, v in compiled.asm.items() if k in IR_STAGES and isinstance(v, str)}
    binary = compiled.asm.get("cubin") or compiled.asm.get("hsaco")
    md = compiled.metadata
    return Artifact(
        kernel=md.name,
        target=target.name,
        stages=stages,
        shared_bytes=int(md.shared),
        num_warps=int(md.num_warps),
        **_resources(target, stages),
        binary=binary if isinstance(binary, bytes) else None,
        compiled=compiled,
    )


def jit_specialisation(
    fn,
    signature: Mapping[str, str],
    constexprs: Mapping[str, Any],
    target: Target,
    values: Mapping[str, Any],
    *,
    num_warps: int,
    num_stages: int,
) -> tuple[dict, dict, dict, dict]:
    """(signature, constexprs, attrs, options) exactly as ``JITFunction.run`` derives them for a
    launch with these arguments: it runs the JIT's own argument binder (``specialize_impl`` per
    argument: pointer alignment and integer divisibility become ``tt.divisibility = 16`` attrs,
    an integer 1 and a None become constants) and ``_pack_args``, so the rule cannot drift from
    the installed Triton (pinned in pyproject.toml; both are private to triton.runtime.jit)."""
    import triton.language as tl
    from triton import knobs
    from triton.compiler import make_backend
    from triton.runtime.jit import MockTensor, create_function_from_signature

    args: dict[str, Any] = {}
    for param in fn.params:
        name = param.name
        if param.is_constexpr:
            if name in constexprs:
                args[name] = constexprs[name]
            continue
        if name not in signature:
            raise ValueError(f"{fn.__name__}: no type for runtime argument {name!r}")
        declared = signature[name]
        if name in values:
            args[name] = values[name]
        elif declared.startswith("*"):
            # data_ptr() 0: 16-byte aligned
            args[name] = MockTensor(tl.str_to_ty(declared, None).element_ty)
        else:
            raise ValueError(
                f"{fn.__name__}: no runtime value for {name!r} ({declared}); the JIT specialises "
                "on it, so pass the value a launch would (values=...)"
            )
    unknown = set(signature) - set(fn.arg_names) | set(constexprs) - set(fn.arg_names)
    if unknown:
        raise ValueError(f"{fn.__name__} has no argument(s) {sorted(unknown)}")
    backend = make_backend(target.gpu_target())
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    # the options JITFunction.run adds before binding
    kwargs = dict(num_warps=num_warps, num_stages=num_stages,
                  debug=fn.debug or knobs.runtime.debug,
                  instrumentation_mode=knobs.compilation.instrumentation_mode)  # fmt: skip
    bound, specialisation, _ = binder(**args, **kwargs)
    opts, sig, consts, attrs = fn._pack_args(backend, kwargs, bound, specialisation, kwargs)
    for name, kind in sig.items():  # the declared types must be the ones the values give
        declared = signature.get(name)
        if kind != "constexpr" and declared is not None and kind != declared:
            raise ValueError(f"{fn.__name__}: {name} declared {declared}, a launch passes {kind}")
    return sig, consts, attrs, opts.__dict__


def _resources(target: Target, stages: Mapping[str, str]) -> dict[str, int | None]:
    """Registers per thread and spilled registers, as the backend's assembler reports them."""
    if "amdgcn" in stages:
        text = stages["amdgcn"]
        vgpr = re.search(r"\.vgpr_count:\s+(\d+)", text)
        spill = re.search(r"\.vgpr_spill_count:\s+(\d+)", text)
        return {
            "registers": int(vgpr.group(1)) if vgpr else None,
            "spills": int(spill.group(1)) if spill else None,
        }
    if "ptx" in stages:
        return _ptxas_report(stages["ptx"], target)
    return {"registers": None, "spills": None}


def _ptxas_report(ptx: str, target: Target) -> dict[str, int | None]:
    """Triton loads cubins lazily, so ask its bundled ptxas for the verbose resource line."""
    import subprocess
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas

    arch = f"sm_{target.arch}a" if target.arch == 90 else f"sm_{target.arch}"
    with tempfile.TemporaryDirectory() as tmp:
        src = f"{tmp}/k.ptx"
        with open(src, "w") as f:
            f.write(ptx)
        run = subprocess.run(
            [get_ptxas(target.arch).path, "-v", f"--gpu-name={arch}", src, "-o", f"{tmp}/k.cubin"],
            capture_output=True,
            text=True,
        )
    report = run.stdout + run.stderr
    regs = re.search(r"Used (\d+) registers", report)
    spill = re.search(r"(\d+) bytes spill stores", report)
    return {
        "registers": int(regs.group(1)) if regs else None,
        "spills": int(spill.group(1)) if spill else None,
    }


# --- normalisation for hashing -------------------------------------------------------------

_LOC_PATTERNS = (
    re.compile(r"^#loc\d*\s*=.*$", re.M),  # MLIR location aliases
    re.compile(r"\s*loc\((?:[^()]|\([^()]*\))*\)"),  # inline loc(...) attributes
    re.compile(r"^\s*\.file\s+\d+\s+\".*$", re.M),  # ptx / amdgcn .file directives
    re.compile(r"^\s*\.loc\s+.*$", re.M),  # ptx / amdgcn .loc directives
    re.compile(r"^!\d+ = (?:distinct )?!DI.*$", re.M),  # llvm debug-info metadata
    re.compile(r",?\s*!dbg !\d+"),  # llvm debug attachments
    re.compile(r"^\s*(?:source_filename|!llvm\.dbg\.cu|!llvm\.module\.flags).*$", re.M),
    re.compile(r"^\s*\.section\s+\.debug_\w+.*?(?=^\s*\.section(?!\s+\.debug)|\Z)", re.M | re.S),
)


# Temporary labels ptx / amdgcn emit for every `.loc`: their numbering follows the line table.
_TMP_LABEL = re.compile(r"^(\$L__tmp\d+|\.Ltmp\d+):[ \t]*$", re.M)


def normalise_ir(text: str) -> str:
    """Strip source locations, file paths and debug info so the hash depends on the IR alone
    (identical for the same kernel at another checkout path or source line)."""
    for pattern in _LOC_PATTERNS:
        text = pattern.sub("", text)
    labels = set(_TMP_LABEL.findall(text))
    if labels:  # drop the line-table labels nothing else refers to
        body = _TMP_LABEL.sub("", text)
        used = {label for label in labels if re.search(re.escape(label) + r"(?!\d)", body)}
        text = _TMP_LABEL.sub(lambda m: m.group(0) if m.group(1) in used else "", text)
    lines = [line.rstrip() for line in text.splitlines()]
    return "\n".join(line for line in lines if line.strip()) + "\n"
