"""The approximate prefix tree behind cache_aware routing."""

from __future__ import annotations

import random
import string

from inference.routing.prefix_tree import PrefixTree

EVERYONE = {"a", "b", "c"}


def test_empty_tree_matches_nothing() -> None:
    assert PrefixTree().match("hello", EVERYONE) == (0, [])


def test_longest_prefix_and_its_owner() -> None:
    tree = PrefixTree()
    tree.insert("the quick brown fox", "a", 1.0)
    tree.insert("the quick red fox", "b", 2.0)
    assert tree.match("the quick brown dog", EVERYONE) == (len("the quick brown "), ["a"])
    assert tree.match("the quick red", EVERYONE) == (len("the quick red"), ["b"])
    matched, owners = tree.match("the quick yellow", EVERYONE)
    assert matched == len("the quick ") and sorted(owners) == ["a", "b"]
    assert tree.match("zebra", EVERYONE) == (0, [])


def test_match_ignores_workers_not_allowed() -> None:
    tree = PrefixTree()
    tree.insert("shared system prompt, then a", "a", 1.0)
    tree.insert("shared system prompt, then b", "b", 1.0)
    assert tree.match("shared system prompt, then a!", {"b"}) == (len("shared system prompt, then "), ["b"])
    assert tree.match("shared system prompt", {"c"}) == (0, [])


def test_sizes_count_characters_per_worker() -> None:
    tree = PrefixTree()
    tree.insert("abcdef", "a", 1.0)
    tree.insert("abcxyz", "a", 1.0)
    tree.insert("abcdef", "b", 1.0)
    assert tree.size("a") == len("abcdef") + len("xyz") == tree.chars_owned_by("a")
    assert tree.size("b") == len("abcdef") == tree.chars_owned_by("b")
    tree.insert("abcdef", "a", 2.0)  # again: nothing new
    assert tree.size("a") == 9


def test_text_that_ends_inside_an_edge_splits_it() -> None:
    tree = PrefixTree()
    tree.insert("hello world", "a", 1.0)
    tree.insert("hello", "b", 1.0)
    assert tree.size("b") == 5 and tree.size("a") == 11
    matched, owners = tree.match("hello", EVERYONE)
    assert matched == 5 and sorted(owners) == ["a", "b"]
    assert tree.match("hello world", {"b"}) == (5, ["b"])


def test_eviction_drops_least_recently_used_leaves_first() -> None:
    tree = PrefixTree()
    tree.insert("prefix-old-branch", "a", 1.0)
    tree.insert("prefix-new-branch", "a", 2.0)
    tree.insert("prefix-newest", "a", 3.0)
    released = tree.evict(max_size=tree.size("a") - 1)
    assert released == len("old-branch")
    assert tree.match("prefix-old-branch", EVERYONE) == (len("prefix-"), ["a"])
    assert tree.match("prefix-new-branch", EVERYONE)[0] == len("prefix-new-branch")
    assert tree.size("a") == tree.chars_owned_by("a")


def test_eviction_keeps_every_worker_within_the_bound() -> None:
    rng = random.Random(7)
    tree = PrefixTree()
    systems = ["".join(rng.choices(string.ascii_lowercase, k=200)) for _ in range(5)]
    for step in range(2000):
        text = rng.choice(systems) + "".join(rng.choices(string.ascii_lowercase, k=rng.randint(1, 300)))
        tree.insert(text, rng.choice("abc"), float(step))
    limit = 5_000
    assert all(tree.size(worker) > limit for worker in "abc")
    tree.evict(limit)
    for worker in "abc":
        assert 0 < tree.size(worker) <= limit
        assert tree.size(worker) == tree.chars_owned_by(worker)
    nodes_after = tree.node_count()
    tree.evict(limit)  # nothing over the limit: no change
    assert tree.node_count() == nodes_after


def test_evicting_everything_leaves_an_empty_tree() -> None:
    tree = PrefixTree()
    tree.insert("one", "a", 1.0)
    tree.insert("two", "a", 2.0)
    tree.evict(0)
    assert tree.size("a") == 0 and tree.node_count() == 0


def test_insert_with_a_limit_trims_the_worker_at_once() -> None:
    rng = random.Random(11)
    tree = PrefixTree()
    for step in range(3000):
        text = "system prompt " * 10 + "".join(rng.choices(string.ascii_lowercase, k=rng.randint(1, 200)))
        worker = rng.choice("ab")
        tree.insert(text, worker, float(step), max_size=2_000)
        assert tree.size(worker) <= 2_000
    for worker in "ab":
        assert tree.size(worker) == tree.chars_owned_by(worker)


def test_trimming_a_wide_fan_out_keeps_the_shared_prefix() -> None:
    tree = PrefixTree()
    for i in range(5_000):
        tree.insert(f"shared prefix|{i:05d}", "a", float(i))
    tree.evict(len("shared prefix|") + 6 * 5)  # room for the prefix and five tails
    assert tree.size("a") == tree.chars_owned_by("a") <= len("shared prefix|") + 30
    assert tree.match("shared prefix|04999", EVERYONE)[0] == len("shared prefix|04999")  # newest kept
    assert tree.match("shared prefix|00000", EVERYONE)[0] < len("shared prefix|00000")


def test_repeating_one_text_does_not_grow_the_bookkeeping() -> None:
    tree = PrefixTree()
    for step in range(10_000):
        tree.insert("the same prompt every time", "a", float(step))
    assert len(tree._heaps["a"]) < 100
    assert tree.size("a") == len("the same prompt every time")


def test_remove_worker_forgets_it_everywhere() -> None:
    tree = PrefixTree()
    tree.insert("common prefix / a's tail", "a", 1.0)
    tree.insert("common prefix / b's tail", "b", 1.0)
    tree.remove_worker("a")
    assert "a" not in tree.workers and tree.size("a") == 0
    assert tree.match("common prefix / a's tail", {"b"}) == (len("common prefix / "), ["b"])
    tree.insert("anything", "b", 2.0)  # inserts release a forgotten worker's nodes a few at a time
    assert tree.chars_owned_by("a") == 0
    assert tree.size("b") == tree.chars_owned_by("b") == len("common prefix / b's tail") + len("anything")
    tree.remove_worker("b")
    tree.insert("x", "c", 3.0)
    assert tree.node_count() == 1


def test_removing_a_large_share_is_spread_over_later_inserts() -> None:
    tree = PrefixTree()
    for i in range(1_000):
        tree.insert(f"prompt {i} " * 3, "a", float(i))
    tree.remove_worker("a")
    tree.insert("one", "b", 2000.0)
    assert 0 < tree.chars_owned_by("a")  # not all at once
    for i in range(100):
        tree.insert(f"more {i}", "b", 2001.0 + i)
    assert tree.chars_owned_by("a") == 0 and not tree._draining


def test_a_worker_that_comes_back_starts_afresh() -> None:
    tree = PrefixTree()
    for i in range(500):
        tree.insert(f"old {i}", "a", float(i))
    tree.remove_worker("a")
    tree.insert("new", "a", 1000.0)
    assert tree.size("a") == tree.chars_owned_by("a") == len("new")
