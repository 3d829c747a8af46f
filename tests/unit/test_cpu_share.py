"""The compute-thread governor: how it reads the kernel's counters and how it sizes the team."""

from __future__ import annotations

import os
import threading

import torch

from sgl.runtime.cpu_share import CpuShare, cpu_ticks, threads_for


def test_threads_for_takes_a_core_away_only_when_another_process_holds_it():
    assert threads_for(2, 0.0, 2) == 2
    assert threads_for(2, 0.3, 2) == 2  # a server's HTTP front in bursts
    assert threads_for(2, 0.7, 2) == 1  # a busy loop that our spinning threads squeezed
    assert threads_for(2, 1.0, 2) == 1
    assert threads_for(2, 2.0, 2) == 1  # never below one
    assert threads_for(32, 1.0, 32) == 31
    assert threads_for(8, 4.0, 4) == 4  # the other tensor-parallel rank's share is not "taken"


def test_cpu_ticks_reads_the_cpus_it_is_given(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(
        "cpu  9 9 9 9 9 9 9 9 0 0\n"
        "cpu0 10 1 5 100 2 1 1 3 0 0\n"
        "cpu1 20 0 10 50 0 0 0 0 0 0\n"
        "cpu2 1000 0 0 0 0 0 0 0 0 0\n"
        "intr 5 6\n"
    )
    me = tmp_path / "self"
    me.write_text("42 (a (strange) name) S " + " ".join(["0"] * 10) + " 7 4 0 0\n")
    total, busy, own = cpu_ticks({0, 1}, str(stat), str(me))
    assert (total, busy, own) == (123 + 80, 21 + 30, 11)


def test_cpu_ticks_reads_this_machine():
    total, busy, own = cpu_ticks(set(os.sched_getaffinity(0)))
    assert total >= busy >= 0 and own >= 0


class Counters:
    """Kernel counters advanced by hand: each `advance` is one interval on `cpus` CPUs."""

    def __init__(self, cpus: int) -> None:
        self.cpus, self.reading, self.now = cpus, (0, 0, 0), 0.0

    def advance(self, others: float, own: float, ticks_per_cpu: int = 50) -> None:
        total, busy, mine = self.reading
        span = ticks_per_cpu * self.cpus
        self.reading = (
            total + span,
            busy + int((others + own) * ticks_per_cpu),
            mine + int(own * ticks_per_cpu),
        )
        self.now += 0.5


def governor(counters: Counters, max_threads: int) -> tuple[CpuShare, list[int]]:
    calls: list[int] = []
    share = CpuShare(
        max_threads,
        calls.append,
        read=lambda: counters.reading,
        clock=lambda: counters.now,
        cpus=set(range(counters.cpus)),
    )
    share.tick()  # the first reading
    return share, calls


def test_the_team_shrinks_when_a_core_is_taken_and_grows_back():
    c = Counters(2)
    share, calls = governor(c, 2)
    c.advance(others=0.1, own=1.9)
    share.tick()
    assert calls == [] and share.threads == 2
    c.advance(others=0.8, own=1.2)  # a busy loop arrives
    share.tick()
    assert calls == [1]
    c.advance(others=1.0, own=1.0)  # it stays: no change
    share.tick()
    assert calls == [1]
    c.advance(others=0.0, own=1.0)  # it leaves
    share.tick()
    assert calls == [1, 2] and share.threads == 2


def test_no_decision_between_intervals_or_on_too_few_ticks():
    c = Counters(2)
    share, calls = governor(c, 2)
    c.reading = (c.reading[0] + 10, c.reading[1] + 10, c.reading[2])  # 0.05 s of a busy loop
    c.now += 0.5
    share.tick()
    assert calls == []  # too short to tell
    c.advance(others=2.0, own=0.0)
    share.tick()
    assert calls == [1]
    c.reading = (
        c.reading[0] + 100,
        c.reading[1],
        c.reading[2],
    )  # quiet again, but within the interval
    share.tick()
    assert calls == [1]


def test_off_by_environment(monkeypatch):
    monkeypatch.setenv("SGL_CPU_SHARE", "0")
    assert CpuShare.for_this_thread() is None


def test_for_this_thread_sizes_only_its_own_team(monkeypatch):
    """The governor changes the calling thread's OpenMP team; other threads, and threads started
    later (another engine's scheduler), keep torch's count."""
    monkeypatch.delenv("SGL_CPU_SHARE", raising=False)
    seen: dict[str, int] = {}

    def scheduler_thread() -> None:
        torch.set_num_threads(2)  # what an engine's scheduler thread starts with on two cores
        share = CpuShare.for_this_thread()
        assert share is not None and share.max_threads == 2
        share.set_threads(1)
        seen["governed"] = torch.get_num_threads()

    before = torch.get_num_threads()
    try:
        t = threading.Thread(target=scheduler_thread)
        t.start()
        t.join()
        later = threading.Thread(target=lambda: seen.update(later=torch.get_num_threads()))
        later.start()
        later.join()
        assert seen == {"governed": 1, "later": 2}
    finally:
        torch.set_num_threads(before)
