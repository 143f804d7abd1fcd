"""The seed's attribution, redone on this GPU: fused against split, and the probes that say why.

    python benchmarks/kda_case_study.py [--out DIR]

Per shape (bf16, K = V = 128, gates bounded at -5), each a median of CUDA-graph replays
(kreg.bench.device_ms):
  split          prep + scan (the spec the dispatcher picks; chunk forced to the fused spec's)
  prep, scan     each kernel of split alone
  fused          the fused kernel (same tile spec; block_v = V)
  fused_tiles    fused with the scan ablated: its tile phase alone (every tile still consumed)
  prep_looped    the prep kernel walking each sequence's chunks in one program, tiles to HBM
  prep_ballast_ctl / prep_ballast
                 prep with the ballast product at 1 KiB (control: same code, no occupancy
                 change) and at 128 KiB (shared memory forces one program per SM)
Compiled shared memory, registers and spills of each kernel are recorded so a probe that did
not take effect (a ballast that did not allocate, an ablation folded away) shows.
Writes DIR/case_study.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import attrs
import torch
import triton

from kreg.bench import device_ms
from kreg.dispatch import select
from kreg.families.kda import api, builders, launch
from kreg.registry.targets import detect

SHAPES = ((1, 8192, 32), (4, 8192, 32), (16, 8192, 32), (1, 65536, 4))


def resources(artifact) -> dict:
    return {"shared": artifact.shared_bytes, "regs": artifact.registers, "spills": artifact.spills}


def _probes(call, problem, split, fused, tile, scan, tables, tiles) -> dict:
    """name -> a no-argument launch of that probe."""
    return {
        "split": lambda: api.run_selection(split, call, problem),
        "prep": lambda: launch.run_prep(call, tile, tables),
        "scan": lambda: launch.run_scan(call, tile, scan, tables, tiles),
        "fused": lambda: api.run_selection(fused, call, problem),
        "fused_tiles": lambda: launch.run_fused(
            call, attrs.evolve(fused.spec, ablate_scan=True)),
        "prep_looped": lambda: launch.run_prep(call, attrs.evolve(tile, looped=True), tables),
        "prep_ballast_ctl": lambda: launch.run_prep(
            call, attrs.evolve(tile, ballast_bytes=1024), tables),
        "prep_ballast": lambda: launch.run_prep(
            call, attrs.evolve(tile, ballast_bytes=131072), tables),
    }  # fmt: skip


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "case_out"))
    ap.add_argument("--chunk", type=int, default=32)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    target = detect()
    rows = []
    for B, T, H in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(B + H)
        r = lambda *s, gen=gen: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
        K = 128
        q = torch.nn.functional.normalize(r(B, T, H, K), dim=-1).bfloat16()
        k = torch.nn.functional.normalize(r(B, T, H, K), dim=-1).bfloat16()
        v, g = r(B, T, H, K).bfloat16(), (-5 * torch.sigmoid(r(B, T, H, K) + 1)).bfloat16()
        beta = torch.sigmoid(r(B, T, H)).bfloat16()
        problem, call = api._prepare(q, k, v, g, beta, None, None, True, -5.0, None, None, None,
                                     None, "none", False, False, "kv", False)  # fmt: skip
        split = select(problem, target=target)
        fused = select(problem, target=target, algorithm="kda.fused")
        tile = attrs.evolve(fused.spec.tile)
        scan = attrs.evolve(split.spec.scan, chunk=tile.chunk, segment_chunks=0)
        split = attrs.evolve(split, spec=attrs.evolve(split.spec, tile=tile, scan=scan))
        tables = launch.chunk_tables(call, tile.chunk)
        tiles = launch.run_prep(call, tile, tables)
        probes = _probes(call, problem, split, fused, tile, scan, tables, tiles)
        row = {"B": B, "T": T, "H": H, "tile": repr(tile), "scan": repr(scan)}
        o_split, ht_split = api.run_selection(split, call, problem)
        o_fused, ht_fused = api.run_selection(fused, call, problem)
        row["split_eq_fused"] = bool(
            torch.equal(o_split, o_fused) and torch.equal(ht_split, ht_fused)
        )
        for name, fn in probes.items():
            try:
                row[name + "_ms"] = device_ms(fn)
            except Exception as e:  # noqa: BLE001
                row[name + "_ms"] = repr(e)[:300]
        row["resources"] = {
            "prep": resources(builders.build_kda_chunk_prep(tile, target)),
            "scan": resources(builders.build_kda_chunk_scan(scan, target)),
            "fused": resources(builders.build_kda_chunk_fused(fused.spec, target)),
            "fused_tiles": resources(builders.build_kda_chunk_fused(
                attrs.evolve(fused.spec, ablate_scan=True), target)),
            "prep_looped": resources(builders.build_kda_chunk_prep(
                attrs.evolve(tile, looped=True), target)),
            "prep_ballast_ctl": resources(builders.build_kda_chunk_prep(
                attrs.evolve(tile, ballast_bytes=1024), target)),
            "prep_ballast": resources(builders.build_kda_chunk_prep(
                attrs.evolve(tile, ballast_bytes=131072), target)),
        }  # fmt: skip
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()
               if k.endswith("_ms") or k == "split_eq_fused"}, f"B={B} T={T} H={H}",
              flush=True)  # fmt: skip
        rows.append(row)
        torch.cuda.empty_cache()
    out = {"device": torch.cuda.get_device_name(), "triton": triton.__version__,
           "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "rows": rows}  # fmt: skip
    with open(os.path.join(args.out, "case_study.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
