"""Engine, KV-cache block reuse — a finished request's full blocks of keys and values kept in a bounded pool, found
again by a hash chained over the blocks, so that a later request computes only what follows its longest cached prefix.

As TensorRT-LLM's block reuse, vLLM's prefix caching and SGLang's radix cache do (docs/engine.md quotes them): a
request's ids are cut into blocks of `block_size`; block j's key is a hash of block j-1's key and block j's own ids,
so a key stands for the whole prefix up to the block's end. What else goes into the key is `kv_cache_key`:

| kv_cache_key | block j's key hashes, beside block j-1's key | as |
|---|---|---|
| "ids" | its ids, and its input_token_extra_ids when the request gives them | TensorRT-LLM's TensorRT engines |
| "pad_value" | its ids, each picture's fake ids replaced by the picture's pad value (its hash % 2**30) | SGLang |
| "mm_hash" | its ids, and for each picture it holds part of: the picture's hash and the block's offset in it | vLLM; TensorRT-LLM's PyTorch backend |

Fake prompt ids restart at vocab_size in every request (the executor's convention), so under "ids" without extra ids
two different pictures asked about with the same words have the same keys: the second request is served the first
picture's keys and values. A picture's hash is the request's `multimodal_hashes` entry, else the sha256 of the
prompt-table rows its fake ids read (what the engine embeds).
"""

import hashlib
from collections import Counter, OrderedDict
from dataclasses import dataclass, replace

import numpy as np
import torch

from ..fake_ids import fake_id_runs

KV_CACHE_KEYS = ("ids", "pad_value", "mm_hash")
DEFAULT_BLOCK_SIZE = 32  # ids a block: a Qwen-VL picture (256 fake ids) spans 8 or 9 blocks
PAD_VALUE_RANGE = 1 << 30  # SGLang's pad value: the picture's hash modulo 2**30


def rows_hash(table: torch.Tensor, rows: torch.Tensor) -> bytes:
    """sha256 of the prompt-table rows `rows` [n] of `table` [R, H], as the engine stores them."""
    picked = table[rows.to(table.device)].contiguous().cpu()  # [n, H]
    return hashlib.sha256(picked.view(torch.uint8).numpy()).digest()


def pad_value(picture_hash: bytes) -> int:
    """SGLang's pad value of a picture: the first 8 bytes of its hash as a big-endian int, modulo 2**30."""
    return int.from_bytes(picture_hash[:8], "big") % PAD_VALUE_RANGE


@dataclass(frozen=True)
class RequestKey:
    """What a request's block keys are made of: key ids [L] (int64), extra ids [L] (uint64) or None, and the pictures
    mixed into the blocks that hold them: (start, end, hash) each ("mm_hash" only)."""

    ids: np.ndarray
    extra_ids: np.ndarray | None
    pictures: tuple[tuple[int, int, bytes], ...] = ()

    @classmethod
    def of(cls, kv_cache_key: str, ids, vocab_size: int, extra_ids=None, picture_hashes=()) -> "RequestKey":
        """The key of ids [L] whose runs of fake ids are pictures with hashes `picture_hashes` (in order)."""
        key_ids = torch.as_tensor(ids).cpu().numpy().astype(np.int64)  # a copy: pad values go in below
        runs = fake_id_runs(ids, vocab_size)
        pictures = tuple((a, b, h) for (a, b), h in zip(runs, picture_hashes))
        if kv_cache_key == "pad_value":
            for a, b, picture in pictures:
                key_ids[a:b] = pad_value(picture)
        extra = None if extra_ids is None else np.asarray(extra_ids, dtype=np.uint64)
        return cls(key_ids, extra, pictures if kv_cache_key == "mm_hash" else ())

    def followed_by(self, new_ids) -> "RequestKey":
        """The key of the request followed by generated ids (text: extra id 0, no picture)."""
        new = np.asarray(new_ids, dtype=np.int64)
        extra = None if self.extra_ids is None else np.concatenate([self.extra_ids, np.zeros(len(new), np.uint64)])
        return replace(self, ids=np.concatenate([self.ids, new]), extra_ids=extra)

    def block_hashes(self, block_size: int, blocks: int) -> list[bytes]:
        """The chained keys of the first `blocks` full blocks: key j is sha256(key j-1, block j's ids, …)."""
        hashes, parent = [], b""
        for j in range(blocks):
            a, b = j * block_size, (j + 1) * block_size
            h = hashlib.sha256(parent)
            h.update(self.ids[a:b].tobytes())
            if self.extra_ids is not None:
                h.update(b"extra ids")
                h.update(self.extra_ids[a:b].tobytes())
            for start, end, picture in self.pictures:
                if start < b and a < end:  # the block holds part of this picture: its hash and where in it
                    h.update(b"picture" + len(picture).to_bytes(4, "big") + picture)
                    h.update(max(0, a - start).to_bytes(8, "big"))
            parent = h.digest()
            hashes.append(parent)
        return hashes


class BlockPool:
    """At most `capacity` blocks of keys and values [layers, 2, blocks, heads, block_size, head size] on the engine's
    device, each found by its chained key; full, it evicts the least recently used block that no kept block continues
    (a leaf), so every kept block's prefix is kept too."""

    def __init__(self, kv_cache: torch.Tensor, block_size: int, capacity: int):
        layers, _, _, heads, _, head_dim = kv_cache.shape  # the engine's [layers, 2, rows, heads, S, hd]
        self.block_size, self.capacity = block_size, capacity
        self.kv = torch.zeros(
            layers, 2, capacity, heads, block_size, head_dim, dtype=kv_cache.dtype, device=kv_cache.device
        )
        self.clear()

    @property
    def nbytes(self) -> int:
        """Bytes the pool holds on its device."""
        return self.kv.numel() * self.kv.element_size()

    def clear(self) -> None:
        """Forget every block."""
        self.slots: OrderedDict[bytes, int] = OrderedDict()  # key → slot, least recently used first
        self.parent: dict[bytes, bytes | None] = {}
        self.children: Counter = Counter()  # key → kept blocks that continue it
        self.free = list(range(self.capacity - 1, -1, -1))

    def __len__(self) -> int:
        return len(self.slots)

    def match(self, hashes: list[bytes]) -> list[int]:
        """The slots of the longest run of `hashes` kept from the first on, each marked as just used."""
        found = []
        for h in hashes:
            if h not in self.slots:
                break
            self.slots.move_to_end(h)
            found.append(self.slots[h])
        return found

    def load(self, slots: list[int], kv_cache: torch.Tensor, rows: range) -> None:
        """Copy the blocks `slots` into the first len(slots) · block_size positions of cache rows `rows`."""
        if not slots:
            return
        layers, _, _, heads, size, head_dim = self.kv.shape
        index = torch.tensor(slots, device=self.kv.device)
        blocks = self.kv.index_select(2, index).permute(0, 1, 3, 2, 4, 5)  # [layers, 2, heads, n, size, hd]
        kv_cache[:, :, rows.start : rows.stop, :, : len(slots) * size] = blocks.reshape(
            layers, 2, heads, len(slots) * size, head_dim
        )[:, :, None]

    def store(self, hashes: list[bytes], kv_cache: torch.Tensor, row: int) -> int:
        """Keep block j of cache row `row` under hashes[j], for each j in order (a kept one is only marked as used);
        stops where the pool is full of blocks this chain needs. Returns the blocks newly kept."""
        size, kept = self.block_size, 0
        for j, h in enumerate(hashes):
            if h in self.slots:
                self.slots.move_to_end(h)
                continue
            slot = self._free_slot(protected=set(hashes[:j]))
            if slot is None:
                break
            self.kv[:, :, slot] = kv_cache[:, :, row, :, j * size : (j + 1) * size]
            self.slots[h], self.parent[h] = slot, hashes[j - 1] if j else None
            self.children[self.parent[h]] += 1
            kept += 1
        return kept

    def _free_slot(self, protected: set) -> int | None:
        """A free slot, else the slot of the least recently used leaf outside `protected` (evicted), else None."""
        if self.free:
            return self.free.pop()
        victim = next((h for h in self.slots if not self.children[h] and h not in protected), None)
        if victim is None:
            return None
        parent = self.parent.pop(victim)
        self.children[parent] -= 1
        del self.children[victim]
        return self.slots.pop(victim)


@dataclass(frozen=True)
class PrefillStats:
    """One generate call's prefill: each request's input ids and how many of them came from reused blocks."""

    input_ids: tuple[int, ...]
    reused_ids: tuple[int, ...]

    @property
    def computed_ids(self) -> tuple[int, ...]:
        """Ids each request's prefill computed: its input ids past the reused ones."""
        return tuple(n - m for n, m in zip(self.input_ids, self.reused_ids))
