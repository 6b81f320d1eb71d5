"""`spec.ar.routing`: the routing rule, by hand and against the project's global scheduler."""

from __future__ import annotations

import pytest

from reference.ar.cluster import GlobalScheduler
from reference.ar.vllm_v1 import make_vllm_v1
from spec.ar.config import ArConfig, ArRequest
from spec.ar.routing import ROUTING_RULES, RoutingRule, check_routing, expected_routes
from spec.errors import ConfigError, SpecViolation


def test_round_robin_takes_turns_across_rounds() -> None:
    assert expected_routes("round_robin", 4, [9, 0, 0], 4) == [1, 2, 0, 1]


def test_lor_counts_the_requests_routed_earlier_in_the_round() -> None:
    # replica 1 waits least; once it has two more, replica 0 and 1 tie and 0 wins the tie
    assert expected_routes("lor", 0, [2, 0, 5], 4) == [1, 1, 0, 1]


def test_a_wrong_route_names_the_rule_and_the_counts() -> None:
    check_routing("lor", 0, [2, 0, 5], [("a", 1), ("b", 1)])
    with pytest.raises(SpecViolation) as err:
        check_routing("lor", 3, [2, 0, 5], [("a", 1), ("b", 2)])
    assert err.value.rule == RoutingRule.ROUTING_ORDER
    assert "'b' went to replica 2, not 1 (lor; 3 requests routed before this round, " in str(
        err.value
    )
    assert "waiting per replica [2, 0, 5]; this round [1, 2])" in str(err.value)
    assert set(ROUTING_RULES) == set(RoutingRule)


def test_an_unknown_routing_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="one of round_robin, lor"):
        expected_routes("random", 0, [0, 0], 1)


@pytest.mark.parametrize("routing", ["round_robin", "lor"])
def test_the_projects_global_scheduler_routes_by_the_rule(routing: str) -> None:
    """`reference.ar.cluster.GlobalScheduler` routes one request at a time (a round of one),
    between steps of its replicas; each choice is the rule's, given the replicas' waiting
    counts just before it."""
    config = ArConfig(num_blocks=40, max_num_seqs=2, num_replicas=3)
    cluster = GlobalScheduler(config, lambda i: lambda e: None, make_vllm_v1, routing=routing)
    for i in range(30):
        waiting = [len(r.snapshot().waiting) for r in cluster.replicas]
        replica = cluster.submit(ArRequest(f"r{i}", 3 + i % 5, 2 + i % 3))
        check_routing(routing, i, waiting, [(f"r{i}", replica)])
        if i % 4 == 3:
            cluster.step()
