"""A factory that builds something lacking part of its family's adapter protocol is refused where
the harness builds it, from pytest as from the command line: the message names the protocol's
members and the ones missing (a reviewer's adapter without `drain` got only "it returned
NoDrain" in pytest, where `verify` said "lacking drain")."""

from __future__ import annotations

from typing import Any

import pytest

from properties.adapter_check import protocol_members
from properties.ar.harness import ArHarness
from properties.harness import Harness
from reference.ar.vllm_v1 import make_vllm_v1
from reference.dllm import make_scheduler
from spec.adapter import SchedulerAdapter
from spec.ar.adapter import ArSchedulerAdapter
from spec.ar.config import ArConfig
from spec.config import DllmConfig, Mode
from spec.errors import ConfigError

DLLM = DllmConfig(
    block_size=2, page_size=2, kv_pages=8, req_pool_rows=2, max_running_requests=2, mode=Mode.FDFO
)


class _WithoutDrain:
    """Forwards every member but `drain` to a working adapter."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name == "drain":
            raise AttributeError(name)
        return getattr(self._inner, name)


def test_a_dllm_adapter_without_drain_is_named_lacking_it() -> None:
    def no_drain(config: DllmConfig, sink: Any) -> Any:
        return _WithoutDrain(make_scheduler(config, sink))

    with pytest.raises(ConfigError) as err:
        Harness(no_drain, DLLM)
    message = str(err.value)
    assert "invalid impl='no_drain'" in message, message
    assert "a factory returning a SchedulerAdapter (" in message, message
    assert message.endswith("it returned _WithoutDrain, lacking drain"), message


def test_an_ar_adapter_without_drain_is_named_lacking_it() -> None:
    """The AR harness checked nothing: a missing method was an AttributeError at its first
    call, reported as the implementation's error."""

    def no_drain(config: ArConfig, sink: Any) -> Any:
        return _WithoutDrain(make_vllm_v1(config, sink))

    with pytest.raises(ConfigError) as err:
        ArHarness(no_drain, ArConfig())
    message = str(err.value)
    assert "a factory returning an ArSchedulerAdapter (" in message, message
    assert message.endswith("it returned _WithoutDrain, lacking drain"), message


def test_the_protocols_members_are_the_contracts_own() -> None:
    dllm = protocol_members(SchedulerAdapter)
    ar = protocol_members(ArSchedulerAdapter)
    assert {"config", "submit", "abort", "run_round", "drain", "snapshot"} <= set(dllm), dllm
    assert {"submit", "abort", "step", "drain", "snapshot", "rules"} <= set(ar), ar
    assert not [name for name in dllm + ar if name.startswith("_")]
