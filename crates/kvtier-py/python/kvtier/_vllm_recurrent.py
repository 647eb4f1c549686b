"""How a vLLM model with recurrent layers (Mamba, gated delta nets, …) maps onto one kvtier
layout with a state group, and how its pages and states move between vLLM's caches and
kvtier's payloads. Used by ``kvtier.vllm_connector``; docs/vllm.md, "Recurrent groups".

vLLM keeps such a model in KV cache groups: attention groups (a page of KV per block of
tokens) and recurrent groups (one state per request, which vLLM's ``align`` cache mode keeps
at block boundaries in the block that ends there). kvtier keys the whole model under one
layout: its attention layers as KV blocks, its recurrent layers as one state group. A hit
is then kvtier's composition rule: the deepest boundary where the KV blocks *and* the
state after exactly those blocks are both held (docs/hybrid.md) — never one without the
other.

Payloads:

- a KV block: for each attention layer (attention groups in order, each group's layers in
  order), vLLM's page of that block — the same layer-major payload as a model without
  recurrent layers;
- the state at a boundary: for each recurrent layer (recurrent groups in order, each
  group's layers in order), each of its state tensors' slice for the block holding the
  boundary (on vLLM 0.32 a gated delta net has a convolution state and an SSM state), in
  the order vLLM lists them.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from math import prod
from typing import Any, Sequence

import torch

#: The environment variable that changes how vLLM lays out a convolution state in memory
#: (part of the state's encoding, so part of its kind).
_CONV_LAYOUT_ENV = "VLLM_SSM_CONV_STATE_LAYOUT"


@dataclasses.dataclass(frozen=True)
class RecurrentGroup:
    """One recurrent KV cache group: its index, layers and vLLM's description of a state."""

    index: int
    layers: tuple[str, ...]
    #: vLLM's Mamba type (e.g. ``gdn_attention``), state shapes and dtypes of one layer.
    mamba_type: str
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]

    @property
    def layer_state_bytes(self) -> int:
        return sum(prod(s) * d.itemsize for s, d in zip(self.shapes, self.dtypes))


def state_kind(groups: Sequence[RecurrentGroup]) -> str:
    """The state group's kind: what the state is and how it is encoded, so that a state
    computed by another vLLM layer type, geometry, dtype or memory layout can never be
    read as this one (it is part of the layout's key)."""
    parts = []
    for g in groups:
        tensors = ",".join(f"{'x'.join(map(str, s))}:{str(d).removeprefix('torch.')}" for s, d in zip(g.shapes, g.dtypes))
        parts.append(f"{g.mamba_type}[{tensors}]x{len(g.layers)}")
    layout = os.environ.get(_CONV_LAYOUT_ENV, "default")
    return f"vllm/align/conv-layout={layout}/" + "+".join(parts)


def _raw(buffer: Any) -> torch.Tensor:
    """A uint8 tensor over a read-only buffer of kvtier's (no copy: it is only read)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch warns that it is read-only
        return torch.frombuffer(buffer, dtype=torch.uint8)


class RecurrentModel:
    """A model with attention and recurrent groups, over the KV caches vLLM registered."""

    def __init__(self, attention: Sequence[Any], recurrent: Sequence[RecurrentGroup]) -> None:
        #: Attention groups (``_Group`` of the connector) and recurrent groups, in order.
        self.attention = list(attention)
        self.recurrent = list(recurrent)
        self.attention_layers = [name for g in self.attention for name in g.layers]
        self.state_layers = sum(len(g.layers) for g in self.recurrent)
        self.state_bytes = sum(g.layer_state_bytes * len(g.layers) for g in self.recurrent)
        self.kind = state_kind(self.recurrent)

    # ---- state ----

    def _state_tensors(self, caches: dict[str, Any], group: RecurrentGroup, block: int) -> list[torch.Tensor]:
        """The state tensors of `group`'s layers for `block`, in payload order, checked
        against vLLM's description (a mismatch is an error: nothing is guessed)."""
        out = []
        for name in group.layers:
            tensors = caches[name]
            if isinstance(tensors, torch.Tensor):
                tensors = [tensors]
            if len(tensors) != len(group.shapes):
                raise RuntimeError(f"{name}: {len(tensors)} state tensors, vLLM's spec lists {len(group.shapes)}")
            for t, shape, dtype in zip(tensors, group.shapes, group.dtypes):
                view = t[block]
                if tuple(view.shape) != tuple(shape) or view.dtype != dtype:
                    raise RuntimeError(
                        f"{name}: a state tensor of {tuple(view.shape)} {view.dtype}, vLLM's spec says {shape} {dtype}"
                    )
                out.append(view)
        return out

    def gather_state(self, caches: dict[str, Any], blocks: dict[int, int]) -> torch.Tensor:
        """The state payload: each recurrent group's state in block ``blocks[group]``."""
        parts = [
            t.contiguous().reshape(-1).view(torch.uint8)
            for g in self.recurrent
            for t in self._state_tensors(caches, g, blocks[g.index])
        ]
        state = torch.cat(parts)
        assert state.numel() == self.state_bytes
        return state

    def scatter_state(self, caches: dict[str, Any], blocks: dict[int, int], state: Any) -> None:
        """Writes a state payload into each recurrent group's block ``blocks[group]``."""
        raw = _raw(state)
        if raw.numel() != self.state_bytes:
            raise RuntimeError(f"a state of {raw.numel()} bytes, this model's is {self.state_bytes}")
        offset = 0
        for g in self.recurrent:
            for view in self._state_tensors(caches, g, blocks[g.index]):
                n = view.numel() * view.element_size()
                view.copy_(raw[offset : offset + n].view(view.dtype).view(view.shape))
                offset += n

    # ---- KV ----

    def gather_kv(self, caches: dict[str, Any], block_ids: list[list[int]], n: int) -> torch.Tensor:
        """The first `n` blocks of every attention group as one payload, [blocks, layers, …]
        (each block layer-major across the model's attention layers)."""
        pages = []
        for g in self.attention:
            for name in g.layers:
                cache = caches[name]
                index = torch.tensor(block_ids[g.index][:n], dtype=torch.long, device=cache.device)
                pages.append(cache.index_select(0, index))
        return torch.stack(pages, dim=1).contiguous()

    def scatter_kv(self, caches: dict[str, Any], block_ids: list[list[int]], blocks: Sequence[Any], skip: int) -> None:
        """Writes KV blocks ``skip..`` (kvtier's payloads, in order) into every attention
        group's blocks."""
        like = caches[self.attention_layers[0]]
        page = like[0].numel() * like.element_size()
        per = torch.stack([_raw(b) for b in blocks[skip:]]).view(len(blocks) - skip, len(self.attention_layers), page)
        li = 0
        for g in self.attention:
            for name in g.layers:
                cache = caches[name]
                dst = torch.tensor(block_ids[g.index][skip : len(blocks)], dtype=torch.long, device=cache.device)
                pages = per[:, li].contiguous().view(cache.dtype).view(-1, *cache.shape[1:])
                cache.index_copy_(0, dst, pages.to(cache.device))
                li += 1
