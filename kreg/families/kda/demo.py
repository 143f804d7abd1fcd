"""A small KDA prefill on the CPU (Triton interpreter) checked against both float64 oracles.

    TRITON_INTERPRET=1 python -m kreg.families.kda.demo

Inputs follow the production argument set in miniature: raw gate input with A_log / dt_bias
through the sigmoid-bound activation, q/k L2 normalisation and beta sigmoid inside the kernel,
an initial state, grouped value heads, and a length that is not a multiple of the chunk.
"""

from __future__ import annotations

import os
import sys


def main() -> int:
    if os.environ.get("TRITON_INTERPRET") != "1":
        # the interpreter must be chosen before any kernel is imported: re-run in a new process
        env = {**os.environ, "TRITON_INTERPRET": "1"}
        os.execvpe(sys.executable, [sys.executable, "-m", "kreg.families.kda.demo"], env)

    import attrs
    import torch

    from kreg.dispatch.words import summary
    from kreg.families.kda import api, oracles
    from kreg.families.kda.specs import bitwise_pair
    from kreg.text import wrap

    from .selection import select_kda

    gen = torch.Generator().manual_seed(0)
    B, T, H, HV, K, V = 1, 100, 1, 2, 32, 32
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    q, k, v = r(B, T, H, K).half(), r(B, T, H, K).half(), r(B, T, HV, V).half()
    g_raw, beta_raw = r(B, T, HV, K).half(), r(B, T, HV).half()
    A_log, dt_bias, h0 = r(HV) * 0.5, r(HV * K) * 0.5, r(B, HV, K, V) * 0.1
    opts = dict(gate_activation="sigmoid_bound", gate_lower_bound=-5.0, A_log=A_log,
                dt_bias=dt_bias, use_qk_l2norm=True, use_beta_sigmoid=True, initial_state=h0,
                output_final_state=True)  # fmt: skip
    o, ht = api.kda_prefill(q, k, v, g_raw, beta_raw, **opts)
    of, htf = api.kda_prefill(q, k, v, g_raw, beta_raw, algorithm="kda.fused", **opts)

    problem, call = api._prepare(q, k, v, g_raw, beta_raw, **opts)
    sel = select_kda(problem, "sm90")
    # bit for bit is promised between fused and the split spec tiling as it does (bitwise_pair);
    # the dispatcher's split choice may tile otherwise, then they agree within rounding
    fused = select_kda(problem, "sm90", algorithm="kda.fused", allow_opt_in=True)
    pair = attrs.evolve(sel, spec=bitwise_pair(fused.spec))
    op, htp = api.run_selection(pair, call, problem)
    n = lambda x: x.double().numpy()  # noqa: E731
    g = oracles.gate_sigmoid_bound(n(g_raw), n(A_log), n(dt_bias), -5.0)
    args = (oracles.l2norm(n(q)), oracles.l2norm(n(k)), n(v), g, oracles.sigmoid(n(beta_raw)))
    serial = oracles.token_serial_oracle(*args, initial_state=n(h0))
    tile = oracles.tile_oracle(*args, initial_state=n(h0), chunk=sel.spec.tile.chunk)
    print(f"KDA prefill on CPU (Triton interpreter), fp16, B={B} T={T} H={H} HV={HV} K={K} V={V}")
    print(wrap(f"Selected with sm90's rules: {summary(sel)}", indent="  "))
    print(
        f"  Its spec runs chunks of {sel.spec.tile.chunk} tokens; the tile oracle below uses the same."
    )
    worst = 0.0
    for name, (ro, rs) in (("token-serial oracle", serial), ("tile oracle", tile)):
        eo, es = oracles.relative_rms(n(o), ro), oracles.relative_rms(n(ht), rs)
        worst = max(worst, eo, es)
        print(f"  vs {name:20s} relative RMS: o {eo:.2e}, final state {es:.2e}")
    same = torch.equal(op, of) and torch.equal(htp, htf)
    print(f"  fused == split on its bitwise pair spec, bit for bit: {same}")
    ok = worst < 2e-3 and same
    print("OK" if ok else "FAILED: above the fp16 tolerance 2e-3, or fused != its split pair")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
