"""The varlen tables (Triton): sequence offsets made safe and the chunk tables, in one launch.

A packed batch's offsets may reach the kernels unvalidated (a device ``cu_seqlens`` alone: reading
it on the host would be a device sync; a CUDA graph replays whatever was copied into it). This
kernel rewrites them as the other kernels read them: each offset clamped into ``[0, T]``, then the
running maximum, so no sequence starts before the previous one ends and none reads outside the
packed tokens. Valid offsets come out unchanged. From those it derives, on the device:

- ``seq_chunk`` [N + 1] int32: each sequence's first chunk (prefix sums of ``ceil(len / C)``);
- ``chunk_seq`` [NC] int32: the sequence of each chunk id, ``N - 1`` past the last chunk (the
  ids past it belong to no sequence; their programs exit);
- ``hs_seq`` [N + 1] int32: each sequence's first chunk-state row (every ``HS`` tokens).

One program: the offsets are a few hundred entries, and three passes over them separated by
block barriers cost less than the launches of the torch ops they replace (one launch here against
about ten, each a few microseconds of host time).
"""

import triton
import triton.language as tl

from kreg.registry.interpreter import interpreting, patch_interpreter

if interpreting():
    patch_interpreter()


@triton.jit
def _max(a, b):
    return tl.maximum(a, b)


@triton.jit
def _prefix_counts(cu, table, N, SIZE: tl.constexpr, BLOCK: tl.constexpr):
    """table[0] = 0, table[i + 1] = sum over sequences j <= i of ceil(len_j / SIZE)."""
    carry = tl.zeros((), dtype=tl.int32)
    for start in range(0, N, BLOCK):
        i = start + tl.arange(0, BLOCK)
        inside = i < N
        lo = tl.load(cu + i, mask=inside, other=0)
        hi = tl.load(cu + i + 1, mask=inside, other=0)
        counts = ((hi - lo + SIZE - 1) // SIZE).to(tl.int32)
        sums = tl.cumsum(counts, axis=0) + carry
        tl.store(table + i + 1, sums, mask=inside)
        carry = tl.max(tl.where(inside, sums, carry), axis=0)
    tl.store(table, tl.zeros((), dtype=tl.int32))


@triton.jit
def kda_varlen_tables_kernel(
    cu_in, cu_out, seq_chunk, chunk_seq, hs_seq,
    N, T, NC, STEPS,
    C: tl.constexpr, HS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Grid (1,). ``cu_in`` [N + 1] int32 or int64 (any values); ``cu_out`` [N + 1] int64.
    ``C`` = 0: the offsets alone (the recurrence needs no chunk tables); ``HS`` = 0: no
    ``hs_seq``. ``STEPS``: binary-search steps, ``N.bit_length()``."""
    # pass 1: clamp into [0, T], running maximum across blocks
    carry = tl.zeros((), dtype=tl.int64)
    for start in range(0, N + 1, BLOCK):
        i = start + tl.arange(0, BLOCK)
        inside = i <= N
        x = tl.load(cu_in + i, mask=inside, other=0).to(tl.int64)
        x = tl.minimum(tl.maximum(x, 0), T)
        x = tl.maximum(tl.associative_scan(x, 0, _max), carry)
        tl.store(cu_out + i, x, mask=inside)
        carry = tl.max(tl.where(inside, x, carry), axis=0)
    if C > 0 or HS > 0:
        tl.debug_barrier()  # pass 2 reads offsets other threads stored
    if HS > 0:
        _prefix_counts(cu_out, hs_seq, N, HS, BLOCK)
    if C > 0:
        _prefix_counts(cu_out, seq_chunk, N, C, BLOCK)
        tl.debug_barrier()  # pass 3 searches the table other threads stored
        # pass 3: chunk id c belongs to the number of sequences s in [1, N] whose first chunk
        # seq_chunk[s] <= c (a binary search over the non-decreasing table), at most N - 1
        for start in range(0, NC, BLOCK):
            c = start + tl.arange(0, BLOCK)
            lo = tl.zeros((BLOCK,), dtype=tl.int32)
            hi = tl.zeros((BLOCK,), dtype=tl.int32) + N
            for _ in range(STEPS):
                active = lo < hi
                mid = (lo + hi) // 2
                first = tl.load(seq_chunk + 1 + mid, mask=active, other=0)
                right = active & (first <= c)
                lo = tl.where(right, mid + 1, lo)
                hi = tl.where(active & ~right, mid, hi)
            tl.store(chunk_seq + c, tl.minimum(lo, N - 1), mask=c < NC)
