"""The prefix-aware router's overload rule (scale/ray_serve/router.overloaded): when a request that shares a
replica's prefix still goes there. The routing itself runs on a local cluster in test_ray_serve.py."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.serve.request_router")

from vsurge.scale.ray_serve.router import overloaded  # noqa: E402


def test_a_replica_with_a_free_slot_takes_its_prefix_whatever_the_gap():
    # a burst of one conversation's turns: 7 of 8 slots taken, the other replica idle: still here
    assert not overloaded(queue=7, shortest=0, slots=8, max_ongoing=64, imbalance=4)


def test_a_replica_with_every_slot_taken_spills_once_the_gap_reaches_imbalance():
    assert not overloaded(queue=8, shortest=5, slots=8, max_ongoing=64, imbalance=4)  # gap 3: wait here
    assert overloaded(queue=8, shortest=4, slots=8, max_ongoing=64, imbalance=4)  # gap 4: go elsewhere
    assert overloaded(queue=12, shortest=0, slots=8, max_ongoing=64, imbalance=4)


def test_a_full_replica_is_overloaded_even_when_every_other_is_as_full():
    assert overloaded(queue=64, shortest=64, slots=8, max_ongoing=64, imbalance=4)


def test_slots_not_yet_reported_leave_the_gap_alone_to_decide():
    assert not overloaded(queue=3, shortest=0, slots=0, max_ongoing=64, imbalance=4)
    assert overloaded(queue=4, shortest=0, slots=0, max_ongoing=64, imbalance=4)


def test_recent_choices_count_what_was_given_in_the_window():
    from vsurge.scale.ray_serve.router import RecentChoices

    now = [100.0]
    recent = RecentChoices(window=0.5, clock=lambda: now[0])
    for _ in range(3):
        recent.add("a")
    recent.add("b")
    assert (recent.count("a"), recent.count("b"), recent.count("c")) == (3, 1, 0)
    now[0] += 0.4
    recent.add("a")
    now[0] += 0.2  # the first three are older than the window
    assert (recent.count("a"), recent.count("b")) == (1, 0)
