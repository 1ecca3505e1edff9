"""A CPU (host) KV tier behind the GPU pool, as vLLM's native offloading does it.

What vLLM does (vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py,
vllm/v1/kv_offload/lru_manager.py, vllm/v1/kv_offload/cpu.py; docs/engine-model.md#cpu-kv-offload-tier):

* The host tier is a map block hash -> host block with its own LRU (an OrderedDict), of
  ``cpu_bytes_to_use / bytes per block`` blocks. ``touch`` moves a request's blocks to the MRU
  end in reverse order, so its first block is the most recent and eviction takes a request's
  deepest blocks first. Eviction (``prepare_store``) skips blocks being loaded and is
  all-or-nothing: if not enough blocks can be evicted the store is skipped.
* Stores: every step, the full blocks a scheduled request has filled since its last store are
  handed to ``prepare_store`` (blocks already in the tier are filtered out) and copied to the
  host; they become visible to lookups (``complete_store``) when the request finishes or is
  preempted.
* Lookup: a request with a GPU prefix hit of h blocks looks up its blocks h, h+1, ... in the
  host tier; k >= 1 consecutive hits are *loaded* instead of recomputed: the scheduler allocates
  GPU blocks for them and parks the request (WAITING_FOR_REMOTE_KVS) until the copy lands; then
  it is scheduled with h + k blocks computed (the last prompt token is always recomputed).

The model here (both engines, see tests/sim/reference_engine.py):

* stores are made when vLLM makes them visible: at the request's finish or preemption, one
  ``prepare_store`` of the full blocks from the request's next-store index on. Lookups only see
  completed stores, so what a lookup can hit is the same; the tier's occupancy by a running
  request's not-yet-visible blocks is not modelled;
* transfers overlap compute (vLLM copies on its own CUDA streams): a copy of k blocks takes
  ``latency_s + k * block_size * kv_bytes_per_token / bandwidth_bytes_per_s``; a request whose
  load has landed by a step's start is scheduled in that step (vLLM polls finished transfers
  once per step);
* the copies of one direction share one link (``CopyLink``): vLLM's worker has one
  ``SingleDirectionOffloadingHandler`` per direction (vllm/v1/kv_offload/worker/cpu_gpu.py) and
  each job's stream waits for the previous job's end event, so a direction's jobs run one after
  the other in submission order. Loads queue FIFO on the host-to-GPU link, stores (issued when a
  request finishes or is preempted, at that time) on the GPU-to-host link; with
  ``shared_link`` both directions queue on one link (a host whose copies contend for one path);
* the bandwidth is an effective one, a function of the bytes one copy moves
  (``effective_bandwidth_bytes_per_s``): vLLM before 0.12 copies per-layer K and V pieces of a
  block (tens of KiB each), from 0.12 one contiguous block of all layers (0.5-2 MiB).

This module keeps the tier compressed, like ``kv_pool``: block hashes are positions of
append-only streams, and a touch moves a stream's blocks [lo, hi) to the MRU end deepest first,
so the LRU order is a sequence of entries, each a few position intervals of one stream, deepest
first. A lookup touches everything a session's stream holds (its next prompt covers all it
stored), so a stream has one entry unless a store touched only part of it (a chunked prefill,
a preemption).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional

from .kv_pool import Stream

# Defaults and where they come from (docs/engine-model.md#cpu-kv-offload-tier).
# PCIe 5.0 x16 moves 64 GB/s per direction raw (32 GT/s x 16 lanes, 128b/130b); pinned-memory
# copies of large pieces reach about 50 GB/s host<->device on H100/MI300X-class hosts: the
# asymptote of the effective bandwidth below.
PEAK_BANDWIDTH_BYTES_PER_S = 50e9
# What one DMA copy (one cudaMemcpyAsync of one piece) costs beyond its bytes: a few microseconds
# of descriptor set-up and engine turnaround. With it, 32 KiB pieces move at ~9 GB/s and 2.25 MiB
# pieces at ~47 GB/s: the 4-5x vLLM 0.12 gained by its contiguous layout (docs say where from).
PER_COPY_S = 3e-6
# vLLM releases from this one copy a block of all layers as one contiguous piece.
CONTIGUOUS_LAYOUT_VERSION = (0, 12)
DEFAULT_VLLM_VERSION = "0.12"
# A copy job costs a kernel launch plus a CUDA event poll per step: tens of microseconds.
DEFAULT_LATENCY_S = 20e-6
# Qwen3-8B in BF16: K and V x 36 layers x 8 KV heads x 128 dims x 2 bytes = 144 KiB per token.
DEFAULT_KV_BYTES_PER_TOKEN = 147_456
DEFAULT_KV_LAYERS = 36


def parse_vllm_version(version: str) -> tuple[int, int]:
    """"0.11", "0.12.0", "0.32.1rc1" -> (major, minor); ValueError on anything else."""
    parts = version.split(".")
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1].isdigit():
        raise ValueError(f"a vLLM version like 0.11 or 0.12.0 is expected, got {version!r}")
    return int(parts[0]), int(parts[1])


def copy_piece_bytes(vllm_version: str, block_size: int, kv_bytes_per_token: int, kv_layers: int) -> int:
    """The bytes one copy moves: before 0.12 vLLM's KV cache is one tensor per layer with K and V
    apart, so a block is 2 x layers pieces; from 0.12 a block of all layers is one piece."""
    block_bytes = block_size * kv_bytes_per_token
    if parse_vllm_version(vllm_version) >= CONTIGUOUS_LAYOUT_VERSION:
        return block_bytes
    return max(1, block_bytes // (2 * kv_layers))


def effective_bandwidth_bytes_per_s(piece_bytes: int, peak_bytes_per_s: float = PEAK_BANDWIDTH_BYTES_PER_S,
                                    per_copy_s: float = PER_COPY_S) -> float:
    """Bytes per second of a stream of copies of ``piece_bytes`` each: each costs ``per_copy_s``
    plus its bytes at the peak rate."""
    return piece_bytes / (per_copy_s + piece_bytes / peak_bytes_per_s)


# vLLM's default layout (0.12 and later) with 16-token blocks of Qwen3-8B: ~47 GB/s.
DEFAULT_BANDWIDTH_BYTES_PER_S = effective_bandwidth_bytes_per_s(
    copy_piece_bytes(DEFAULT_VLLM_VERSION, 16, DEFAULT_KV_BYTES_PER_TOKEN, DEFAULT_KV_LAYERS))


@dataclass(frozen=True)
class OffloadConfig:
    """The host tier: its size and the copy cost between host and GPU."""

    cpu_blocks: int
    bandwidth_bytes_per_s: float = DEFAULT_BANDWIDTH_BYTES_PER_S
    latency_s: float = DEFAULT_LATENCY_S
    kv_bytes_per_token: int = DEFAULT_KV_BYTES_PER_TOKEN
    shared_link: bool = False  # loads and stores queue on one link (default: one link per direction)

    def transfer_s(self, num_blocks: int, block_size: int) -> float:
        return self.latency_s + num_blocks * block_size * self.kv_bytes_per_token / self.bandwidth_bytes_per_s


class CopyLink:
    """One direction's copies, one after the other in submission order (a FIFO server)."""

    __slots__ = ("free_s",)

    def __init__(self) -> None:
        self.free_s = 0.0  # when the last job submitted so far ends

    def submit(self, now_s: float, duration_s: float) -> float:
        """A job of ``duration_s`` submitted at ``now_s``: it starts when the link is free; returns its end."""
        end = max(now_s, self.free_s) + duration_s
        self.free_s = end
        return end


class _Entry:
    """Blocks of one stream that sit together in the LRU order, deepest first: disjoint, sorted
    [lo, hi) position intervals."""

    __slots__ = ("stream", "intervals")

    def __init__(self, stream: Stream, intervals: list[list[int]]) -> None:
        self.stream = stream
        self.intervals = intervals


class HostTier:
    """vLLM's LRU offloading manager over block positions of streams (see the module docstring).

    A ``touch`` of a stream's blocks [lo, hi) gathers them into one entry at the MRU end; a
    stream whose blocks were touched in part (a store during a chunked prefill, after a
    preemption) has several entries."""

    def __init__(self, config: OffloadConfig) -> None:
        if config.cpu_blocks < 1:
            raise ValueError(f"the host tier needs at least one block, got {config.cpu_blocks}")
        self.config = config
        self.num_blocks = config.cpu_blocks
        self.num_used = 0
        self.num_pinned = 0  # distinct pinned positions
        self.to_gpu = CopyLink()  # loads
        self.to_host = self.to_gpu if config.shared_link else CopyLink()  # stores
        self.lru: OrderedDict[int, _Entry] = OrderedDict()
        self._entries: dict[Stream, list[int]] = {}  # stream -> its entry ids
        # stream -> the [lo, hi) block ranges loads in flight pin, one per load (a load unpins
        # exactly what it pinned); a whole range, not each position: a load is thousands of blocks
        self._pins: dict[Stream, list[tuple[int, int]]] = {}
        self._next_id = 0

    # ------------------------------------------------------------------ request views
    @staticmethod
    def _segments(prefix: Optional[Stream], own: Stream, start: int, end: int):
        """(stream, lo, hi) pieces of the request's block range [start, end), prefix first."""
        base = own.base
        if prefix is not None and start < base:
            yield prefix, start, min(end, base)
        lo = max(start, base)
        if end > lo:
            yield own, lo, end

    def _resident(self, stream: Stream) -> list[list[int]]:
        """The stream's resident intervals, sorted (entries' intervals merged)."""
        ids = self._entries.get(stream)
        if not ids:
            return []
        if len(ids) == 1:
            return self.lru[ids[0]].intervals
        out: list[list[int]] = []
        for lo, hi in sorted(iv for eid in ids for iv in self.lru[eid].intervals):
            if out and out[-1][1] == lo:
                out[-1][1] = hi
            else:
                out.append([lo, hi])
        return out

    def lookup(self, prefix: Optional[Stream], own: Stream, start: int, end: int) -> int:
        """Consecutive resident blocks from ``start`` (at most up to ``end``)."""
        hits = 0
        for stream, lo, hi in self._segments(prefix, own, start, end):
            top = lo
            for a, b in self._resident(stream):
                if a <= lo < b:
                    top = min(b, hi)
                    break
            hits += top - lo
            if top < hi:
                return hits
        return hits

    def touch(self, prefix: Optional[Stream], own: Stream, end: int) -> None:
        """``touch`` of the request's blocks [0, end) in reverse: its own stream's blocks, then
        the prefix's, to the MRU end, each deepest first."""
        self._touch(own, own.base, end)
        if prefix is not None:
            self._touch(prefix, 0, min(end, own.base))

    def _touch(self, stream: Stream, lo: int, hi: int) -> None:
        ids = self._entries.get(stream)
        if not ids or hi <= lo:
            return
        if len(ids) == 1:
            entry = self.lru[ids[0]]
            if entry.intervals[0][0] >= lo and entry.intervals[-1][1] <= hi:
                self.lru.move_to_end(ids[0])
                return
        gathered: list[list[int]] = []
        for eid in list(ids):
            entry = self.lru[eid]
            keep = []
            for a, b in entry.intervals:
                if b <= lo or a >= hi:
                    keep.append([a, b])
                    continue
                if a < lo:
                    keep.append([a, lo])
                if b > hi:
                    keep.append([hi, b])
                gathered.append([max(a, lo), min(b, hi)])
            if keep:
                entry.intervals = keep
            else:
                del self.lru[eid]
                ids.remove(eid)
        if gathered:
            merged: list[list[int]] = []
            for a, b in sorted(gathered):
                if merged and merged[-1][1] == a:
                    merged[-1][1] = b
                else:
                    merged.append([a, b])
            self._add_entry(stream, merged)

    def _add_entry(self, stream: Stream, intervals: list[list[int]]) -> None:
        eid = self._next_id
        self._next_id += 1
        self.lru[eid] = _Entry(stream, intervals)
        self._entries.setdefault(stream, []).append(eid)

    def store(self, prefix: Optional[Stream], own: Stream, start: int, end: int) -> Optional[int]:
        """``prepare_store`` + ``complete_store`` of blocks [start, end): blocks already resident are
        skipped, the LRU makes room (skipping pinned blocks); returns the blocks stored, or None
        when there is not enough evictable room (nothing changes then)."""
        missing = []
        for stream, lo, hi in self._segments(prefix, own, start, end):
            pos = lo
            for a, b in self._resident(stream):
                if b <= pos:
                    continue
                if a >= hi:
                    break
                if a > pos:
                    missing.append((stream, pos, a))
                pos = max(pos, b)
            if pos < hi:
                missing.append((stream, pos, hi))
        num_new = sum(hi - lo for _, lo, hi in missing)
        if num_new == 0:
            return 0
        to_evict = num_new - (self.num_blocks - self.num_used)
        if to_evict > 0:
            if to_evict > self.num_used - self.num_pinned:
                return None
            self._evict(to_evict)
        for stream, lo, hi in missing:
            self._add_entry(stream, [[lo, hi]])
        self.num_used += num_new
        self.touch(prefix, own, end)
        return num_new

    def _evict(self, count: int) -> None:
        """LRU order: entries from the head, each deepest block first, pinned blocks skipped."""
        for eid in list(self.lru):
            entry = self.lru[eid]
            ivs = entry.intervals
            pins = self._pins.get(entry.stream)
            if not pins:
                while count and ivs:
                    lo, hi = ivs[-1]
                    take = min(count, hi - lo)
                    count -= take
                    self.num_used -= take
                    if take == hi - lo:
                        ivs.pop()
                    else:
                        ivs[-1][1] = hi - take
            else:  # a load pins some of this stream's blocks: block by block
                pinned = {pos for a, b in pins for pos in range(a, b)}
                victims = []
                for lo, hi in reversed(ivs):
                    for pos in range(hi - 1, lo - 1, -1):
                        if len(victims) == count:
                            break
                        if pos not in pinned:
                            victims.append(pos)
                for pos in victims:
                    _remove_position(ivs, pos)
                count -= len(victims)
                self.num_used -= len(victims)
            if not ivs:
                del self.lru[eid]
                ids = self._entries[entry.stream]
                ids.remove(eid)
                if not ids:
                    del self._entries[entry.stream]
            if not count:
                return
        raise AssertionError("evicting more host blocks than are evictable")

    def pin(self, prefix: Optional[Stream], own: Stream, start: int, end: int) -> None:
        for stream, lo, hi in self._segments(prefix, own, start, end):
            ranges = self._pins.setdefault(stream, [])
            self.num_pinned += _uncovered(ranges, lo, hi)
            ranges.append((lo, hi))

    def any_pinned(self, prefix: Optional[Stream], own: Stream, start: int, end: int) -> bool:
        """Is a block of [start, end) being loaded (pinned) by some request?"""
        for stream, lo, hi in self._segments(prefix, own, start, end):
            for a, b in self._pins.get(stream, ()):
                if a < hi and lo < b:
                    return True
        return False

    def unpin(self, prefix: Optional[Stream], own: Stream, start: int, end: int) -> None:
        for stream, lo, hi in self._segments(prefix, own, start, end):
            ranges = self._pins[stream]
            ranges.remove((lo, hi))
            self.num_pinned -= _uncovered(ranges, lo, hi)
            if not ranges:
                del self._pins[stream]

    def usage(self) -> float:
        return self.num_used / self.num_blocks


def _uncovered(ranges: list[tuple[int, int]], lo: int, hi: int) -> int:
    """How many positions of [lo, hi) no range of ``ranges`` covers."""
    covered = 0
    pos = lo
    for a, b in sorted(ranges):
        if b <= pos:
            continue
        if a >= hi:
            break
        covered += min(b, hi) - max(a, pos)
        pos = min(b, hi)
        if pos >= hi:
            break
    return hi - lo - covered


def _remove_position(ivs: list[list[int]], pos: int) -> None:
    for i, (lo, hi) in enumerate(ivs):
        if lo <= pos < hi:
            break
    else:
        raise AssertionError(f"position {pos} is not resident")
    if hi - lo == 1:
        del ivs[i]
    elif pos == hi - 1:
        ivs[i][1] = pos
    elif pos == lo:
        ivs[i][0] = lo + 1
    else:
        ivs[i][1] = pos
        ivs.insert(i + 1, [pos + 1, hi])
