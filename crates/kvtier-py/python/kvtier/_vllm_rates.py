"""What the vLLM connector's workers measure for the load-or-recompute plans
(``kvtier.rates``), and how it reaches the scheduler, where the plans are made.

vLLM's scheduler decides how many tokens a request loads (``get_num_new_matched_tokens``)
in the engine-core process; the loads and the forward passes run on the workers, maybe in
other processes. So each worker measures, step by step, what kvtier took to deliver each
load (its tiers, block size and seconds) and how long steps without loads took for the
tokens they computed, and hands it back through vLLM's worker-to-scheduler metadata
(``build_connector_worker_meta``), which vLLM aggregates over the workers and gives the
scheduler's connector in ``update_connector_output``.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorWorkerMetadata

# torch.cuda's event constructor is untyped: called through this.
_cuda: Any = torch.cuda


@dataclasses.dataclass
class Measured(KVConnectorWorkerMetadata):
    """One step's measurements of one worker (or several, aggregated)."""

    #: (tiers of the blocks loaded, bytes per block, seconds kvtier took to deliver them)
    loads: list[tuple[list[str], int, float]] = dataclasses.field(default_factory=list)
    #: (tokens computed, seconds) of steps that loaded nothing
    steps: list[tuple[int, float]] = dataclasses.field(default_factory=list)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        if isinstance(other, Measured):
            return Measured(self.loads + other.loads, self.steps + other.steps)
        return self

    def __bool__(self) -> bool:
        return bool(self.loads or self.steps)


class StepClock:
    """Times the forward passes of steps that load nothing: wall time on the CPU; on a GPU
    a pair of CUDA events per step, read once they have completed (a later step), so
    timing never waits for the device."""

    #: Steps of fewer tokens than this are not prefills worth measuring.
    MIN_TOKENS = 16

    def __init__(self) -> None:
        self._open: tuple[int, float, Any] | None = None
        self._pending: list[tuple[int, Any, Any]] = []
        self._done: list[tuple[int, float]] = []

    def start(self, tokens: int, device: torch.device | None) -> None:
        self._open = None
        if tokens < self.MIN_TOKENS:
            return
        if device is not None and device.type == "cuda":
            event = _cuda.Event(enable_timing=True)
            event.record()
            self._open = (tokens, 0.0, event)
        else:
            self._open = (tokens, time.perf_counter(), None)

    def stop(self) -> None:
        opened, self._open = self._open, None
        if opened is None:
            return
        tokens, started, event = opened
        if event is None:
            self._done.append((tokens, time.perf_counter() - started))
            return
        end = _cuda.Event(enable_timing=True)
        end.record()
        self._pending.append((tokens, event, end))

    def take(self) -> list[tuple[int, float]]:
        """The steps measured since the last call (GPU steps once their events ended)."""
        still = []
        for tokens, start, end in self._pending:
            if end.query():
                self._done.append((tokens, start.elapsed_time(end) / 1e3))
            else:
                still.append((tokens, start, end))
        self._pending = still
        done, self._done = self._done, []
        return done
