"""Paged KV cache with prefix caching by block hashing, as vLLM V1's KVCacheManager does it.

Blocks hold ``block_size`` tokens. A full block of a prompt is identified by the hash of its
tokens chained with the previous block's hash, so equal prefixes map to equal hashes. Freed
blocks keep their hash while they sit in the free queue (least recently freed first out), so a
later request with the same prefix can take them back instead of recomputing them.
"""

from __future__ import annotations

from collections import OrderedDict


class KVCache:
    """Block pool with reference counts and a hash → block map for prefix reuse."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.ref = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}  # hash → block id
        # Free blocks in eviction order; an OrderedDict gives O(1) removal of a revived block.
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.queries = 0  # tokens looked up in the prefix cache
        self.hits = 0  # tokens found

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def usage(self) -> float:
        return 1.0 - len(self.free) / self.num_blocks if self.num_blocks else 0.0

    def lookup(self, block_hashes: list[int], num_tokens: int) -> list[int]:
        """Cached blocks for the longest prefix of ``block_hashes``; at least one token is
        always left to compute (the last one produces the first output token)."""
        if not self.prefix_caching:
            return []
        max_blocks = (num_tokens - 1) // self.block_size
        found = []
        for block_hash in block_hashes[:max_blocks]:
            block = self.cached.get(block_hash)
            if block is None:
                break
            found.append(block)
        return found

    def count_lookup(self, num_tokens: int, hit_tokens: int) -> None:
        """Count a lookup whose request was admitted (the engines' query/hit counters)."""
        self.queries += num_tokens
        self.hits += hit_tokens

    def can_allocate(self, n: int, revived: list[int] = ()) -> bool:
        # Revived cached blocks that sit in the free queue stop being free when taken.
        in_free = sum(1 for b in revived if self.ref[b] == 0)
        return n <= len(self.free) - in_free

    def take_cached(self, blocks: list[int]) -> None:
        for block in blocks:
            if self.ref[block] == 0:
                del self.free[block]
            self.ref[block] += 1

    def allocate(self, n: int) -> list[int]:
        """``n`` fresh blocks (caller checked ``can_allocate``); evicts their old hashes."""
        out = []
        free = self.free
        for _ in range(n):
            block, _ = free.popitem(last=False)
            old = self.block_hash[block]
            if old is not None:
                if self.cached.get(old) == block:
                    del self.cached[old]
                self.block_hash[block] = None
            self.ref[block] = 1
            out.append(block)
        return out

    def cache_blocks(self, blocks: list[int], block_hashes: list[int], start: int, end: int):
        """Register full blocks ``start``..``end`` of a request under their hashes."""
        if not self.prefix_caching:
            return
        for i in range(start, min(end, len(block_hashes), len(blocks))):
            block_hash = block_hashes[i]
            if block_hash in self.cached:
                continue
            self.cached[block_hash] = blocks[i]
            self.block_hash[blocks[i]] = block_hash

    def release(self, blocks: list[int]) -> None:
        """Drop one reference to each block; unreferenced blocks become free, the tail of a
        request first out so that shared prefixes stay cached longest."""
        for block in reversed(blocks):
            self.ref[block] -= 1
            if self.ref[block] == 0:
                self.free[block] = None

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash (SGLang's /flush_cache); refused while blocks are in use."""
        if len(self.free) != self.num_blocks:
            return False
        self.cached.clear()
        self.block_hash = [None] * self.num_blocks
        return True
