from tailguard.sim.kv import KVCache, chain_hashes, prefix_block_hashes, text_block_hashes, token_block_hashes


def test_allocate_refuses_without_partial_change() -> None:
    kv = KVCache(10)
    assert kv.allocate(7)
    assert not kv.allocate(4)
    assert kv.used_blocks == 7 and kv.free_blocks == 3
    kv.release(7)
    assert kv.used_blocks == 0 and kv.usage() == 0.0


def test_chained_keys_depend_on_every_earlier_block() -> None:
    a = chain_hashes([b"x", b"y", b"z"])
    b = chain_hashes([b"w", b"y", b"z"])
    assert a[0] != b[0] and a[1] != b[1] and a[2] != b[2]
    assert chain_hashes([b"x", b"y"]) == a[:2]
    assert all(0 <= h < 2**63 for h in a)


def test_text_keys_cover_only_full_blocks_and_shared_prefixes_match() -> None:
    sys_prompt = "s" * 64 * 3
    one = text_block_hashes(sys_prompt + "question one " * 10, block_size=16)
    two = text_block_hashes(sys_prompt + "another question" * 10, block_size=16)
    assert one[:3] == two[:3] and one[3] != two[3]
    assert len(text_block_hashes("a" * 63)) == 0
    assert len(text_block_hashes("a" * 640, max_blocks=4)) == 4
    assert len(token_block_hashes(list(range(40)), block_size=16)) == 2
    assert token_block_hashes(list(range(32))) == token_block_hashes(list(range(40)))[:2]
    assert prefix_block_hashes("doc", 100) == prefix_block_hashes("doc", 64) + prefix_block_hashes("doc", 100)[4:]
    assert len(prefix_block_hashes("doc", 100)) == 6


def test_prefix_cache_hit_acquire_release_and_lru_eviction() -> None:
    kv = KVCache(4, enable_prefix_caching=True)
    keys = chain_hashes([b"a", b"b", b"c"])
    assert kv.allocate(3)
    for k in keys:
        assert kv.promote(k)
    assert kv.lookup(keys, 3) == (3, 0)  # cached and referenced by the first sequence
    kv.release(0, list(reversed(keys)))
    assert kv.used_blocks == 0 and kv.free_blocks == 4 and kv.cached_blocks == 3
    assert kv.lookup(keys, 2) == (2, 2)
    kv.acquire(keys[:2])
    assert kv.used_blocks == 2 and kv.free_blocks == 2
    kv.release(0, [keys[1], keys[0]])
    # One free block plus three evictable (c, then b, a): taking two uses the free one and evicts
    # the least recently released, the tail block c.
    assert kv.allocate(2)
    assert kv.evictions == 1
    assert kv.lookup(keys, 3) == (2, 2)
    assert kv.allocate(2)
    assert kv.lookup(keys, 3) == (0, 0)
    assert kv.used_blocks == 4


def test_promote_keeps_a_duplicate_private() -> None:
    kv = KVCache(4, enable_prefix_caching=True)
    key = chain_hashes([b"a"])[0]
    kv.allocate(2)
    assert kv.promote(key)
    assert not kv.promote(key)
    kv.release(1, [key])
    assert kv.used_blocks == 0 and kv.cached_blocks == 1


def test_without_prefix_caching_nothing_is_found_or_kept() -> None:
    kv = KVCache(4)
    key = chain_hashes([b"a"])[0]
    kv.allocate(1)
    assert not kv.promote(key)
    assert kv.lookup([key], 1) == (0, 0)
