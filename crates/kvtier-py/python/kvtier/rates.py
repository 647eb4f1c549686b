"""Load or recompute: whether a cached prefix is worth loading, from rates measured while
running (docs/python.md, "Load or recompute").

A hit is not always faster than no cache at all: 32K tokens of a 3B model read from an SSD
at 1.2 GB/s take seconds, where a GPU prefills them in under one. So a connector asks
``Rates.plan`` how many of a hit's leading blocks to load; the others are recomputed by
the engine (and stored again, which puts them in RAM: the next hit comes from the faster
tier). The plan compares, block by block along the prefix, two measured rates:

- the bytes per second kvtier delivered from each tier (``observe_load``: a load's bytes
  and wall time, named by the tiers its blocks came from);
- the tokens per second the engine prefilled when it had nothing loaded
  (``observe_prefill``).

Nothing is configured: a tier never measured is taken as fast (its first load measures
it), and while the engine's prefill was never measured everything is loaded. Rates are
smoothed (an exponential moving average) so one slow read does not turn a tier off, and
every decision is counted (``counters``)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

#: Tiers from fastest to slowest (``Hit.tiers`` names); an unknown name is taken as the
#: slowest.
TIER_ORDER = ("ram", "ssd", "remote")

#: The weight of a new measurement in a smoothed rate.
SMOOTHING = 0.3


def _rank(tier: str) -> int:
    return TIER_ORDER.index(tier) if tier in TIER_ORDER else len(TIER_ORDER)


class Rates:
    """Measured read rates per tier and the engine's prefill rate, and the plans made from
    them. Safe to share between threads (a scheduler plans while workers observe)."""

    def __init__(self, smoothing: float = SMOOTHING) -> None:
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"smoothing must be in (0, 1], not {smoothing}")
        self._smoothing = smoothing
        self._lock = threading.Lock()
        self._tier_bytes_per_s: dict[str, float] = {}
        self._prefill_tokens_per_s: float | None = None
        self._counters = {
            "planned_hits": 0,
            "tokens_loaded": 0,
            "tokens_recomputed": 0,
        }

    # ---- measurements ----

    def _smooth(self, old: float | None, new: float) -> float:
        return new if old is None else old + self._smoothing * (new - old)

    def observe_load(self, tiers: Sequence[str], block_bytes: int, seconds: float) -> None:
        """A load of ``len(tiers)`` blocks of ``block_bytes`` each, block ``j`` read from
        ``tiers[j]``, took ``seconds``. A load from one tier measures it; from several,
        the time the faster ones are known to take is set aside and the rest is the
        slowest one's (at least a tenth of the load: never an infinite rate)."""
        if not tiers or seconds <= 0.0 or block_bytes <= 0:
            return
        counts: dict[str, int] = {}
        for t in tiers:
            counts[t] = counts.get(t, 0) + 1
        slowest = max(counts, key=_rank)
        with self._lock:
            left = seconds
            for tier, n in counts.items():
                rate = self._tier_bytes_per_s.get(tier)
                if tier != slowest and rate:
                    left -= n * block_bytes / rate
            left = max(left, seconds / 10)
            rate = counts[slowest] * block_bytes / left
            self._tier_bytes_per_s[slowest] = self._smooth(self._tier_bytes_per_s.get(slowest), rate)

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        """The engine prefilled ``tokens`` tokens in ``seconds`` with nothing loaded."""
        if tokens <= 0 or seconds <= 0.0:
            return
        with self._lock:
            self._prefill_tokens_per_s = self._smooth(self._prefill_tokens_per_s, tokens / seconds)

    # ---- decisions ----

    def plan(self, tiers: Sequence[str], block_bytes: int, block_tokens: int, *, count: bool = True) -> int:
        """How many of a hit's leading blocks to load (block ``j`` held by ``tiers[j]``):
        the ``k`` for which loading blocks ``0..k`` and prefilling the rest takes least
        time at the measured rates (ties: the longer load). Only a prefix can be loaded —
        the KV of a block depends on every token before it — so a slow first block makes
        the whole hit a recompute even when later blocks are in RAM. Counted, unless
        ``count`` is false (a caller that may plan a request more than once counts what
        it did with ``count``)."""
        n = len(tiers)
        with self._lock:
            prefill = self._prefill_tokens_per_s
            rates = dict(self._tier_bytes_per_s)
        best = n
        if n and prefill:
            recompute = block_tokens / prefill  # seconds per block
            cost = n * recompute  # load nothing
            best, best_cost = 0, cost
            for j, tier in enumerate(tiers):
                rate = rates.get(tier)
                cost += (block_bytes / rate if rate else 0.0) - recompute
                if cost <= best_cost:
                    best, best_cost = j + 1, cost
        if count:
            self.count(best * block_tokens, (n - best) * block_tokens)
        return best

    def count(self, loaded: int, recomputed: int) -> None:
        """Counts one planned hit: ``loaded`` tokens loaded, ``recomputed`` left to the
        engine by the plan."""
        if loaded or recomputed:
            with self._lock:
                self._counters["planned_hits"] += 1
                self._counters["tokens_loaded"] += loaded
                self._counters["tokens_recomputed"] += recomputed

    # ---- what was measured and decided ----

    def tier_rate(self, tier: str) -> float | None:
        """The smoothed bytes per second measured from ``tier`` (``None``: never)."""
        with self._lock:
            return self._tier_bytes_per_s.get(tier)

    @property
    def prefill_rate(self) -> float | None:
        """The smoothed tokens per second the engine prefilled (``None``: never measured)."""
        with self._lock:
            return self._prefill_tokens_per_s

    @property
    def counters(self) -> dict[str, int]:
        """``planned_hits``; ``tokens_loaded`` and ``tokens_recomputed``: the hits' tokens
        the plans loaded and left to the engine to recompute."""
        with self._lock:
            return dict(self._counters)
