"""Benchmark 13's own parts: the history it generates is what agents send (every record
passes the consumer's check), and a replay of it with the policy that decided it finds
nothing that differs, as the benchmark expects of its million records."""

from __future__ import annotations

from bridge.config import ConsumerSettings
from bridge.consumer import validation
from bridge.consumer.replay import History, Replayer, replay
from bridge.policy.file import loads
from tests.benchmarks.bench_replay import POLICY, START, history, measure


def test_the_generated_history_is_records_agents_send() -> None:
    records = history(3_000)
    assert len(records) == 3_000
    assert [validation.problem(r) for r in records if validation.problem(r)] == []
    kinds = {r["RecordType"] for r in records}
    assert kinds == {"Heartbeat", "Event", "Approval"}
    times = [r["TimeGenerated"] for r in records]
    assert times == sorted(times)


def test_a_replay_of_it_with_its_own_decisions_finds_nothing_that_differs() -> None:
    policy = loads(POLICY, "policy.yaml")
    agents = history(6_000)
    recorder = Replayer(policy, ConsumerSettings(), START)
    recorder.feed(History.of(agents).agents)
    recorder.close()
    assert {d["DecisionAction"] for d in recorder.decisions} == {"Approve"}
    done = replay([*agents, *recorder.decisions], policy, ConsumerSettings())
    assert done.decisions == len(recorder.decisions) > 5
    assert [e.event_id for e in done.events if e.differs] == []


def test_the_whole_command_it_times_reads_the_file_and_finds_nothing_that_differs() -> None:
    # 13c runs `se-bridge policy replay` on the file 13b reads: a command that failed or
    # found a difference would make its time meaningless, and 13c says so (not met).
    found = measure(2_000)
    assert found.command_exit == 0
    assert found.differing == 0
    assert found.command > 0
    assert found.command_cpu > 0
