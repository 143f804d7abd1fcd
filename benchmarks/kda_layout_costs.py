"""What the engine-facing input layouts cost on one GPU (issue 14), against the native case:

- head dims the kernels lack (fla's 12, 16, 60, 100), run zero-padded to 32/64/128/256: the whole
  call against the same call at the padded size on pre-padded inputs (the copies alone), and
  against the native head dim 128;
- non-contiguous q, k, v (views into one fused projection, as engines get them): the whole call
  against contiguous inputs (one copy each);
- chunk states every 64 tokens (fp32 and bf16) against none.

Device times are CUDA-graph replays with the L2 flushed (``kreg.bench.device_ms``), medians.
Usage: ``python benchmarks/kda_layout_costs.py [--out DIR]`` (about a minute on an H200); writes
``layout_costs.json``.
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from kreg.bench import device_ms
from kreg.families.kda import kda_prefill

B, T, H = 4, 8192, 32
BF16 = torch.bfloat16


def inputs(K, V, gen):
    def r(*shape):
        return torch.randn(*shape, device="cuda", generator=gen)

    q = torch.nn.functional.normalize(r(B, T, H, K), dim=-1).to(BF16)
    k = torch.nn.functional.normalize(r(B, T, H, K), dim=-1).to(BF16)
    g = (-5 * torch.sigmoid(r(B, T, H, K) + 1)).to(BF16)
    return dict(q=q, k=k, v=r(B, T, H, V).to(BF16), g=g, beta=torch.sigmoid(r(B, T, H)).to(BF16))


def padded(x, Kp, Vp):
    pad = torch.nn.functional.pad
    return {n: t if n == "beta" else pad(t, (0, (Vp if n == "v" else Kp) - t.shape[-1]))
            for n, t in x.items()}  # fmt: skip


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "layout_out"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    native = inputs(128, 128, gen)
    base = device_ms(lambda: kda_prefill(**native))
    rows.append({"what": "native K=V=128", "ms": base})
    for K, Kp in ((12, 32), (16, 32), (60, 64), (100, 128)):
        x = inputs(K, K, gen)
        pre = padded(x, Kp, Kp)
        ms = device_ms(lambda x=x: kda_prefill(**x))
        kernels = device_ms(lambda pre=pre, K=K: kda_prefill(**pre, scale=K**-0.5))
        rows.append({"what": f"K=V={K} padded to {Kp}", "ms": ms, "kernels_at_padded_ms": kernels,
                     "copies_ms": ms - kernels, "vs_native_128": ms / base})  # fmt: skip
    qkv = torch.cat([native[n].reshape(B, T, -1) for n in ("q", "k", "v")], -1)
    views = dict(
        native,
        q=qkv[..., :4096].view(B, T, H, 128),
        k=qkv[..., 4096:8192].view(B, T, H, 128),
        v=qkv[..., 8192:].view(B, T, H, 128),
    )
    ms = device_ms(lambda: kda_prefill(**views))
    rows.append({"what": "q, k, v views of one projection (copied)", "ms": ms,
                 "copies_ms": ms - base})  # fmt: skip
    for dtype in (torch.float32, BF16):
        ms = device_ms(lambda dtype=dtype: kda_prefill(**native, output_chunk_states=True,
                                                       chunk_states_dtype=dtype))  # fmt: skip
        rows.append({"what": f"chunk states every 64 tokens, {dtype}", "ms": ms,
                     "vs_none": ms / base})  # fmt: skip
    for r in rows:
        print({k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()})
    with open(os.path.join(args.out, "layout_costs.json"), "w") as f:
        json.dump({"B": B, "T": T, "H": H, "device": torch.cuda.get_device_name(), "rows": rows},
                  f, indent=2)  # fmt: skip


if __name__ == "__main__":
    main()
