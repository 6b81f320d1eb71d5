"""AR decision twins: one run's operations through a second AR implementation, decisions compared.

An AR scheduler is deterministic given its operations (a request's `stop_after` is part of
the request), so an AR twin is simply another implementation factory: a re-implementation of
an engine's policy (`vllm-v1` for vLLM's own scheduler), or the same engine with a fix. The
harness records every operation it was asked for (`ArHarness.ops`); `twin_difference` runs them
through the twin, checked against the spec under the twin's own policy, and compares the two
event streams' decisions step by step (`spec.ar.decisions`). `ar_conformance_machine(...,
twin=...)` does this at the end of every example (rule `twin_decisions`).

A recorded log (`schedspec check-trace --twin`) holds its operations too: `operations(events)`
reads them back (a submission per `ArSubmitted`, an abort per `ArAborted`, a step per
`ArStepEnd`), so the same comparison runs on a log with no implementation at hand.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from properties.ar.harness import (
    ArAbort,
    ArAwait,
    ArHarness,
    ArInputReady,
    ArOp,
    ArPause,
    ArPropose,
    ArResetCache,
    ArStep,
    ArSubmit,
)
from properties.deadline import CallDeadlineExceeded, TwinHung, call_deadline
from spec.ar.adapter import ArImplementationFactory
from spec.ar.config import ArConfig, ArRequest
from spec.ar.decisions import first_difference, step_decisions
from spec.ar.events import (
    ArAborted,
    ArAwaiting,
    ArCacheHit,
    ArCacheReset,
    ArDraftsProposed,
    ArDraftsVerified,
    ArEvent,
    ArFinished,
    ArOutputTokens,
    ArPauseSet,
    ArPreempted,
    ArReady,
    ArScheduled,
    ArStepEnd,
    ArSubmitted,
)
from spec.ar.profile import ArPolicy
from spec.errors import CannotDrive, ConfigError


def operations(
    events: Sequence[ArEvent],
    sampled_stops: Mapping[str, int] | None = None,
    config: ArConfig | None = None,
    policy: ArPolicy | None = None,
    replay_outputs: bool = False,
    replay_pauses: bool = False,
    replay_drafts: bool = False,
) -> list[ArOp]:
    """The operations that reproduce `events`' run, in stream order: a submission per
    `ArSubmitted` (arrival = submission order, as the harness numbers them), an abort per
    `ArAborted`, a request held back per `ArAwaiting` and its input ready at its first
    `ArReady` (one in a step: before that step; its promotion the twin decides itself), a
    step per `ArStepEnd` (`CannotDrive` at a pause, a cache reset's preemption or draft
    tokens, which the twin does not replay without the flag for each below, and, given the
    log's `config` and `policy` and without `replay_outputs`, at a cache hit on another
    request's named outputs: `NamedOutputHits`). A rejected submission or an abort that
    changed nothing left no event and changes nothing; a drain shows as the steps it
    ran. A request whose stop the log's engine sampled (`stop_sampled`) is scripted to stop
    where it did: its outputs at that finish, `sampled_stops` (`check_ar_trace(...,
    keep=...)` reads them off the log). With `replay_outputs` (a twin whose adapter sets
    `names_outputs`), each request is scripted to sample the outputs the log names
    (`ArRequest.outputs`), so the twin keys and names them as the log's engine did and may
    take the same hits on them: no hit is refused then. With `replay_pauses` (a twin that is
    an `ArPausingAdapter`), a pause is an operation (`ArPause`), and so is a cache reset
    (`ArResetCache`, at its first preemption, or at its `ArCacheReset` where it preempted
    nothing), not `CannotDrive`. Without it an `ArCacheReset` that preempted nothing is
    `CannotDrive` where prefix caching is on (the twin's cache would outlive it), and changes
    nothing otherwise. With `replay_drafts` (a twin that is an `ArDraftingAdapter`), each
    `ArDraftsProposed` is a proposal (`ArPropose`) whose acceptance is the one the log
    verified after the request's next schedule (`_proposal_acceptances`); a log that names
    no proposal gets one per schedule that carried drafts, of the drafts it carried, just
    before that step (so a twin cannot then schedule more drafts than the log did)."""
    stops = sampled_stops or {}
    named = _named_outputs(events) if replay_outputs else {}
    accepted = _proposal_acceptances(events) if replay_drafts else {}
    proposals_named = any(isinstance(e, ArDraftsProposed) for e in events)
    ops: list[ArOp] = []
    pending: set[str] = set()  # awaiting an input the log has not said is ready
    submitted = 0
    ahead = policy.hash_lookahead_tokens if policy is not None else 0
    resetting = False  # between a reset's first preemption and its `ArCacheReset`
    guard = config is not None and not replay_outputs  # no twin takes a hit on named outputs
    hits = NamedOutputHits(config.block_size, ahead) if config is not None and guard else None
    running: set[str] = set()  # requests scheduled since their admission (drafts replayed)
    for i, e in enumerate(events):
        if isinstance(e, ArPreempted | ArFinished | ArAborted):
            running.discard(e.request_id)
        if isinstance(e, ArOutputTokens) and hits is not None:
            hits.named(e)
        earlier = hits.covered_by(e) if isinstance(e, ArCacheHit) and hits else None
        if isinstance(e, ArCacheHit) and earlier is not None:
            raise CannotDrive(
                f"the cache hit of {e.request_id!r} takes blocks holding outputs of {earlier!r}, "
                "whose ids the log names (a conversation's next turn): a twin whose adapter "
                "does not set `names_outputs` samples outputs of its own, which no prompt "
                "continues, so it could not hit them. Check the log without --twin, or with a "
                "reference twin (vllm-v1-prefix replays the named outputs)"
            )
        if isinstance(e, ArSubmitted):
            if hits is not None:
                hits.submitted(e)
            request = ArRequest(
                e.request_id,
                e.prompt_len,
                e.max_tokens,
                stop_after=stops.get(e.request_id) if e.stop_sampled else e.stop_after,
                priority=e.priority,
                predicted_len=e.predicted_len,
                arrival_time=float(submitted),
                prompt=e.prompt,
                cache_read_limit=e.cache_read_limit,
                lora=e.lora,
                outputs=named.get(e.request_id),
            )
            ops.append(ArSubmit(request))
            submitted += 1
        elif isinstance(e, ArAborted):
            ops.append(ArAbort(e.request_id))
        elif isinstance(e, ArAwaiting):
            ops.append(ArAwait(e.request_id, e.what))
            pending.add(e.request_id)
        elif isinstance(e, ArReady) and e.request_id in pending:
            # its input is ready: between steps, or found so at the start of the pass that
            # promoted it (before that step); a promotion alone the twin decides itself
            ops.append(ArInputReady(e.request_id))
            pending.discard(e.request_id)
        elif isinstance(e, ArPauseSet) and replay_pauses:
            ops.append(ArPause(e.state))
        elif isinstance(e, ArPreempted) and e.reset and replay_pauses:
            if not resetting:  # the reset's first preemption: the operation, once
                ops.append(ArResetCache())
                resetting = True
        elif isinstance(e, ArCacheReset) and replay_pauses:
            if not resetting:  # a reset with nothing running
                ops.append(ArResetCache())
            resetting = False
        elif (
            (isinstance(e, ArPreempted) and e.reset)
            or isinstance(e, ArPauseSet)
            # a reset that preempted nothing changes a twin's decisions only through its cache
            or (isinstance(e, ArCacheReset) and config is not None and config.enable_prefix_caching)
        ):
            what = "pauses the scheduler" if isinstance(e, ArPauseSet) else "resets its cache"
            raise CannotDrive(
                f"the log {what} between steps, an operator's operation this twin does not "
                "replay (it has no set_pause and reset_cache): check the log without --twin, "
                "or name a twin that has them (vllm-v1)"
            )
        elif isinstance(e, ArDraftsProposed) and replay_drafts:
            ops.append(ArPropose(e.request_id, e.drafts, accepted.get(i, 0)))
        elif isinstance(e, ArScheduled) and e.drafts and replay_drafts:
            # the drafts a running request carried, proposed just before its step (a waiting
            # one's are the engine's padding of a new decode, which the twin decides itself)
            if not proposals_named and e.request_id in running:
                ops.append(ArPropose(e.request_id, e.drafts, accepted.get(i, 0)))
        elif (isinstance(e, ArScheduled) and e.drafts) or isinstance(e, ArDraftsProposed):
            raise CannotDrive(
                f"the log schedules draft tokens ({e.request_id!r} in a step), and this twin "
                "does not replay a drafter (it has no propose_drafts): check the log without "
                "--twin, or name a twin that has it (vllm-v1)"
            )
        elif isinstance(e, ArStepEnd):
            ops.append(ArStep())
        if isinstance(e, ArScheduled):
            running.add(e.request_id)
    return ops


def _proposal_acceptances(events: Sequence[ArEvent]) -> dict[int, int]:
    """Index of each `ArDraftsProposed`, and of each `ArScheduled` with drafts, -> the
    drafts the model accepted in the request's verification after that proposal's schedule
    (the first `ArScheduled` of the request after the proposal, and that schedule itself):
    the model accepts a prefix of the drafts, so a twin that schedules another number of
    them accepts at most as many. 0 where the proposal was never scheduled with drafts."""
    out: dict[int, int] = {}
    proposal: dict[str, int] = {}  # request -> index of its open proposal
    verifying: dict[str, list[int]] = {}  # request -> indices its next verification settles
    for i, e in enumerate(events):
        if isinstance(e, ArDraftsProposed):
            proposal[e.request_id] = i
            out[i] = 0
        elif isinstance(e, ArScheduled):
            opened = proposal.pop(e.request_id, None)
            if e.drafts:
                verifying[e.request_id] = [i] + ([opened] if opened is not None else [])
                out[i] = 0
        elif isinstance(e, ArDraftsVerified):
            for j in verifying.pop(e.request_id, []):
                out[j] = e.accepted
    return out


def _named_outputs(events: Sequence[ArEvent]) -> dict[str, tuple[int, ...]]:
    """Each request's outputs the log names (`ArOutputTokens`), in order, at most its
    `max_tokens` (a log that named more breaks `output_tokens` before any twin runs)."""
    named: dict[str, list[int]] = {}
    most: dict[str, int] = {}
    for e in events:
        if isinstance(e, ArSubmitted):
            most[e.request_id] = e.max_tokens
        elif isinstance(e, ArOutputTokens):
            named.setdefault(e.request_id, []).extend(e.tokens)
    return {rid: tuple(ids[: most.get(rid, len(ids))]) for rid, ids in named.items()}


class NamedOutputHits:
    """Which cache hit covers another request's named outputs (`ArOutputTokens`): a hit whose
    blocks, with the `hash_lookahead_tokens` after them, reach past an earlier request's
    prompt into its first named output, the hitting request's tokens (its prompt, then its own
    named outputs) starting with that prompt and output. A twin that does not sample the
    outputs a request scripts (its adapter sets no `names_outputs`) keeps its outputs private
    to their requests, so it could take no such hit. Each request's prompt and first named output is
    kept as a rolling hash per length: a hit is tested in time linear in its length however
    many requests came before (a hash match is then compared token by token)."""

    _MOD = (1 << 61) - 1
    _BASE = 1_000_003

    def __init__(self, block_size: int, hash_lookahead_tokens: int = 0) -> None:
        self._block_size = block_size
        self._ahead = hash_lookahead_tokens
        self._tokens: dict[str, list[int]] = {}  # per request with prompt ids: them, its outputs
        self._prompt_len: dict[str, int] = {}
        # length -> rolling hash of (prompt, first output) -> (request, those tokens)
        self._starts: dict[int, dict[int, tuple[str, tuple[int, ...]]]] = {}

    def _hashes(self, tokens: Sequence[int]) -> list[int]:
        """The rolling hash of every prefix of `tokens` (index i: the first i + 1)."""
        h, out = 0, []
        for t in tokens:
            h = (h * self._BASE + t % self._MOD + 1) % self._MOD
            out.append(h)
        return out

    def submitted(self, e: ArSubmitted) -> None:
        """Keep the prompt of `e` (a request without prompt ids shares nothing)."""
        if e.prompt is not None:
            self._tokens[e.request_id] = list(e.prompt)
            self._prompt_len[e.request_id] = len(e.prompt)

    def named(self, e: ArOutputTokens) -> None:
        """Keep the outputs named; at its first, its prompt and that output."""
        tokens = self._tokens.get(e.request_id)
        if tokens is None or not e.tokens:
            return
        if len(tokens) == self._prompt_len[e.request_id]:
            start = (*tokens, e.tokens[0])
            # the first request with this start stands for all (another's hit is on its blocks)
            by_hash = self._starts.setdefault(len(start), {})
            by_hash.setdefault(self._hashes(start)[-1], (e.request_id, start))
        tokens.extend(e.tokens)

    def covered_by(self, e: ArCacheHit) -> str | None:
        """The other request whose prompt and first named output the hit `e` covers, if any."""
        tokens = self._tokens.get(e.request_id)
        if tokens is None or not self._starts:
            return None
        within = min(len(e.blocks) * self._block_size + self._ahead, len(tokens))
        hashes = self._hashes(tokens[:within])
        for length, starts in self._starts.items():
            hit = starts.get(hashes[length - 1]) if length <= within else None
            if hit is not None and hit[0] != e.request_id and tuple(tokens[:length]) == hit[1]:
                return hit[0]
        return None


def apply_ar_ops(harness: ArHarness, ops: Sequence[ArOp]) -> None:
    """Run `ops` on `harness` (a rejected submission or an unknown abort is the harness's
    typed return, not an error: the twin may rightly refuse what the other refused too)."""
    for op in ops:
        if isinstance(op, ArSubmit):
            harness.submit(op.request)
        elif isinstance(op, ArAbort):
            harness.abort(op.request_id)
        elif isinstance(op, ArStep):
            harness.step()
        elif isinstance(op, ArAwait):
            harness.await_input(op.request_id, op.what)
        elif isinstance(op, ArInputReady):
            harness.input_ready(op.request_id)
        elif isinstance(op, ArPause):
            harness.set_pause(op.state)
        elif isinstance(op, ArResetCache):
            harness.reset_cache()
        elif isinstance(op, ArPropose):
            harness.propose_drafts(op.request_id, op.drafts, op.accepted)
        else:
            harness.drain(op.max_steps)


def twin_harness(
    twin: ArImplementationFactory, config: ArConfig, policy: ArPolicy | None
) -> ArHarness:
    """The twin under `policy`, whose ordering rules, when it leaves them open (`rules` None),
    are the twin adapter's own (as the conformance machine does for the implementation)."""
    if policy is not None and policy.rules is None:
        probe = twin(config, lambda e: None)
        policy = dataclasses.replace(policy, rules=probe.rules)
    return ArHarness(twin, config, policy=policy)


def twin_difference(
    ops: Sequence[ArOp],
    events: Sequence[ArEvent],
    config: ArConfig,
    twin: ArImplementationFactory,
    policy: ArPolicy | None = None,
    subject: str = "the implementation",
) -> str | None:
    """None when `ops`, run through `twin` (checked against the spec under `policy`, None: the
    twin's own rules), decide step by step exactly as `events` did; else the first difference
    in one line, calling `events`' author `subject`. A twin that raises (a violation of its
    own) is reported with the first difference up to that point; one that refuses the
    configuration is `CannotDrive` (no check, no finding); a call of its that hangs is
    `TwinHung`."""
    stopped = ""
    twin_events: list[ArEvent] = []
    try:
        with call_deadline("being built"):
            h = twin_harness(twin, config, policy)
        twin_events = h.events
        for op in ops:  # each call under its deadline, as the implementation's are
            with call_deadline(f"its {type(op).__name__.removeprefix('Ar').lower()}"):
                apply_ar_ops(h, [op])
    except CannotDrive:  # an operation the twin has no way to take: no check, no finding
        raise
    except ConfigError as err:  # a configuration the twin does not run: no check, no finding
        raise CannotDrive(
            f"the decision twin refuses the configuration it was given ({err}): name a twin that "
            "runs every configuration the implementation is checked in"
        ) from None
    except Exception as err:  # the twin's own failure is part of the report
        stopped = f" (the twin then stopped: {type(err).__name__}: {err})"
    except CallDeadlineExceeded as hang:  # a twin that hangs must not hang the run
        raise TwinHung(hang.what, hang.seconds) from None
    difference = first_difference(
        step_decisions(events), step_decisions(twin_events), (subject, "its twin")
    )
    if difference is None and not stopped:
        return None
    return f"{difference or 'no decision differed'}{stopped}"


__all__ = ["NamedOutputHits", "apply_ar_ops", "operations", "twin_difference", "twin_harness"]
