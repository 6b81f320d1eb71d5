"""A fabricated speculative-decoding model for vLLM's engine-core loop: drafts, verification and
what each batch really wrote.

With speculative decoding a decode step of a request schedules its last sampled token and up
to k draft tokens; the model verifies them and samples the accepted drafts plus one token of
its own, so a step yields 1 to k + 1 tokens and vLLM rolls its counts back by the drafts
rejected (`Scheduler.update_from_output`: `num_computed_tokens` and, under async scheduling,
`num_output_placeholders` lose `num_rejected`).

`SpeculativeModel` is the model runner's part, as a real one keeps it:

- **Its own count of each request's output** (`produced`): the tokens its executed steps
  sampled. vLLM's asynchronous scheduler plans a step before the previous step's drafts are
  verified, assuming them all accepted (placeholders); the model runner corrects positions
  itself. So the model numbers its samples from its own count, reset from the scheduler's
  tokens when a request starts or resumes (nothing of it is then in flight: a resumed
  request's stale output has drained or is dropped).
- **Drafts.** Synchronously the engine core hands the drafts proposed after a step to the
  scheduler (`EngineCore.post_step` -> `update_draft_token_ids`); `drafts()` proposes up to k
  for each request of the batch, each the request's true next token with probability
  `DRAFT_RIGHT`, else a token of no request's. Verification then accepts the longest prefix of
  the drafts vLLM scheduled that are the true tokens, so a draft vLLM mislaid would show as a
  wrong acceptance count. Asynchronously the scheduler sees only placeholders (the V2 model
  runner keeps its drafts), and the number accepted is drawn the same way.
- **Skipped drafting** (`drafts_skipped`). vLLM marks a step `skip_drafts` when the drafts
  proposed after it are sure to go unused by every request in it (`Scheduler._drafts_unused`;
  V2 model runner, drafters with a forward pass of their own); the runner then proposes none.
  So no request of that step may verify drafts in its next decode.
- **Rows** (`draft_rows`): a step verifies each draft in a query row of its own after the
  request's last token, so a request scheduled n tokens carries at most n - 1 drafts.
- **Positions** (`decode_position`, synchronous loop): a synchronous model runner takes a
  step's positions from the scheduler's `num_computed_tokens`, so a decode must start at the
  position of the request's last sampled token, the rejected drafts rolled back; under async
  scheduling the scheduler's count is optimistic by design and the runner corrects it.
- **What a batch wrote correctly** (`valid`): per request, the first position its step wrote
  and how many positions from there hold the request's true tokens: the last sampled token and
  the accepted drafts of a decode (its rejected drafts' KV is wrong until rewritten), all the
  scheduled tokens of a prefill chunk. `integrations.vllm.cache_writes` records only those, so
  a prefix-cache hit on a block holding a rejected draft breaks `cache_hit_written`.

- **Structured output** (`integrations.vllm.structured`, `explicit_drafts` under async
  scheduling). A structured-output request samples each token under its bitmask row
  (`integrations.vllm.grammar_rows`: `grammar_mask`) and accepts at most the drafts vLLM
  checked against its grammar (`num_acceptable_drafts`). Asynchronously vLLM checks them only
  for a batch whose sampling it defers, with the drafts the runner hands back
  (`take_drafts`), so the runner keeps real drafts then: after each step it proposes k for
  every request that sampled (none after a `skip_drafts` step), verifies its own, and
  `take_drafts` returns those of the last batch it sampled (-1s when that batch had no
  structured-output request, as vLLM's V2 runner copies them back only then).

Everything is deterministic: the draws come from a `random.Random` seeded per loop and taken
in execution order.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from integrations.vllm.cache_writes import batch_starts
from integrations.vllm.core_loop import EngineCoreViolation, waiting_for_grammar
from integrations.vllm.grammar_rows import GrammarRows
from integrations.vllm.release_api import resumed_req_ids, runner_output, trims_to_first_rejected
from integrations.vllm.structured import REASONING_END, script_span
from integrations.vllm.token_ids import WRONG_DRAFT, wrong_draft

#: The probability that a draft is the request's true next token.
DRAFT_RIGHT = 0.6
#: Wrong drafts: `token_ids.wrong_draft(n)`, never a token of a request.


@dataclass
class DraftCounts:
    """How the drafts went over a loop."""

    drafts_scheduled: int = 0  # draft tokens vLLM scheduled for verification
    drafts_accepted: int = 0  # of those, accepted
    draft_steps: int = 0  # decode steps that verified at least one draft
    guided_drafts_scheduled: int = 0  # of drafts_scheduled, those of structured-output requests
    guided_drafts_accepted: int = 0  # of those, accepted


class SpeculativeModel:
    """The model runner of a speculative engine core over scheduler `sched` (`execute`,
    `drafts`); `token(rid, i)` is request `rid`'s true output number i (1-based), `new_output`
    builds vLLM's `ModelRunnerOutput` and `new_drafts` its `DraftTokenIds`."""

    def __init__(
        self,
        sched: Any,
        k: int,
        *,
        seed: int,
        token: Callable[[str, int], int],
        new_output: Callable[..., Any],
        new_drafts: Callable[[list[str], list[list[int]]], Any],
        async_scheduling: bool,
        explicit_drafts: bool = False,
        keyed_drafts: bool = False,
        turn_of: Mapping[str, int] | None = None,
        grammar_span: Callable[[Any], tuple[int, int]] = script_span,
    ) -> None:
        self.sched = sched
        #: A streaming-input session's current turn, by request id (`grammar_mask` names it).
        self.turn_of: Mapping[str, int] = turn_of if turn_of is not None else {}
        #: The outputs a structured request's grammar constrains in its current turn.
        self.grammar_span = grammar_span
        self.k = k
        self.rnd: random.Random = random.Random(seed)
        self.token = token
        self.new_output = new_output
        self.new_drafts = new_drafts
        self.async_scheduling = async_scheduling
        self.produced: dict[str, int] = {}
        self.decoding: set[str] = set()  # requests past their (re)started prefill
        self.unproposed: set[str] = set()  # requests whose last step skipped drafting
        self.counts: DraftCounts = DraftCounts()
        self._wrong = 0
        self.explicit: bool = explicit_drafts and async_scheduling
        self.keyed: bool = keyed_drafts
        self.proposed: dict[str, list[int]] = {}  # explicit: each request's drafts, kept
        self.last_batch: tuple[list[str], bool] = ([], False)  # ids, any structured request

    def restart(self, out: Any) -> None:
        """Reset the count of every request batch `out` starts or resumes (nothing of it in
        flight) from the scheduler's tokens."""
        sched = self.sched
        restarted = [d.req_id for d in out.scheduled_new_reqs]
        restarted += sorted(resumed_req_ids(out))
        for rid in restarted:
            req = sched.requests.get(rid)
            if req is None:  # ended before this deferred batch is sampled (a failed KV load)
                continue
            self.produced[rid] = len(req.output_token_ids)
            self.decoding.discard(rid)
            self.proposed.pop(rid, None)

    def truncated(self) -> None:
        """After an output is applied: a request whose computed tokens vLLM cut back below its
        last kept output (a KV load that failed under it, recompute policy) recomputes in
        place. vLLM dropped what the failing step sampled (and, async, its steps in flight:
        `stale-after-failed-load`), so its count is the scheduler's again, and its next step
        that samples ends a prefill, not a decode."""
        for rid in list(self.decoding):
            req = self.sched.requests.get(rid)
            if req is None:
                continue
            kept = len(req.output_token_ids)
            if req.num_computed_tokens < req.num_prompt_tokens + kept - 1 or (
                not self.async_scheduling and kept < self.produced[rid]
            ):
                self.produced[rid] = kept
                self.decoding.discard(rid)

    def certain(self, out: Any) -> dict[str, tuple[int, int]]:
        """Per request of batch `out`, the positions it writes correctly whatever the model
        accepts (first position, count): a decode's last sampled token, a prefill chunk's
        scheduled tokens. For a batch sampled later than its forward pass (deferred)."""
        restarted = {d.req_id for d in out.scheduled_new_reqs}
        restarted |= resumed_req_ids(out)
        starts = batch_starts(out)
        certain: dict[str, tuple[int, int]] = {}
        for rid, n in out.num_scheduled_tokens.items():
            req = self.sched.requests[rid]
            drafts = len(out.scheduled_spec_decode_tokens.get(rid, ()))
            if rid in self.decoding and rid not in restarted:
                certain[rid] = (req.num_prompt_tokens + self.produced[rid] - 1, 1)
            else:
                certain[rid] = (starts[rid], n - drafts)
        return certain

    def execute(
        self,
        out: Any,
        rows: GrammarRows | None = None,
        *,
        deferred: bool = False,
        ahead: Mapping[str, int] | None = None,
    ) -> tuple[Any, dict[str, tuple[int, int]]]:
        """Run batch `out` as it is sampled, under its grammar `rows` (structured output): its
        `ModelRunnerOutput` and, per request, the positions it wrote correctly (first position,
        count). A `deferred` batch is sampled once the output before it is applied; `ahead`
        names each request's tokens in the batches still in flight before it (with pipeline
        stages there may be some). vLLM drains a request's stale output (a turn that ended or
        a failed KV load since, in drop mode) batch by batch in that order, so where more
        stale tokens are left than those batches hold, this batch's output is dropped: the
        model samples nothing for it and counts nothing written."""
        sched = self.sched
        self.restart(out)
        starts = batch_starts(out)
        ids = list(out.num_scheduled_tokens)
        sampled: list[list[int]] = []
        valid: dict[str, tuple[int, int]] = {}
        for rid in ids:
            req = sched.requests.get(rid)
            n = out.num_scheduled_tokens[rid]
            if req is None:  # finished before this deferred batch is sampled: output unused
                sampled.append([])
                continue
            tokens_ahead = (ahead or {}).get(rid, 0)
            if deferred and req.drop_stale_output and req.num_stale_output_tokens > tokens_ahead:
                sampled.append([])
                valid[rid] = (starts[rid], 0)
                continue
            if req.is_prefill_chunk:
                _check_rows(rid, n, out.scheduled_spec_decode_tokens.get(rid, ()))
                sampled.append([])
                valid[rid] = (starts[rid], n)
                continue
            drafts = list(out.scheduled_spec_decode_tokens.get(rid, ()))
            base = self.produced[rid]
            if rid in self.decoding and rid in self.unproposed and drafts:
                raise EngineCoreViolation(
                    "drafts_skipped",
                    f"{rid!r} verifies {len(drafts)} drafts right after a step vLLM marked "
                    "skip_drafts, after which no drafts were proposed (that step's requests "
                    "were to be sure not to use them)",
                )
            if req.use_structured_output:
                self._check_grammar_drafts(rid, base, drafts, self.grammar_span(req)[0])
            if rid in self.decoding:
                # a decode writes the last sampled token (output `base`) and its drafts
                position = req.num_prompt_tokens + base - 1
                if not self.async_scheduling and starts[rid] != position:
                    raise EngineCoreViolation(
                        "decode_position",
                        f"{rid!r} is scheduled a decode from position {starts[rid]}, but its "
                        f"last sampled token (output {base}) lies at position {position}",
                    )
                _check_rows(rid, n, drafts)
                accepted = self._accepted(rid, base, drafts)
                if req.use_structured_output and rows is not None:
                    accepted = rows.limit(rid, accepted)
                valid[rid] = (position, 1 + accepted)
            else:
                _check_rows(rid, n, drafts)
                # The step that ends a (re)started prefill: its tokens are the request's own,
                # and any draft slots are vLLM's padding (no draft was proposed yet): rejected.
                accepted = 0
                self.decoding.add(rid)
                valid[rid] = (starts[rid], n - len(drafts))
            if req.use_structured_output and not waiting_for_grammar(req):
                (rows or GrammarRows(None)).check(
                    rid, base + 1, accepted + 1, self.grammar_span(req), self.turn_of.get(rid, 1)
                )
            sampled.append([self.token(rid, base + 1 + j) for j in range(accepted + 1)])
            self.produced[rid] = base + accepted + 1
            if drafts:
                self.counts.draft_steps += 1
                self.counts.drafts_scheduled += len(drafts)
                self.counts.drafts_accepted += accepted
                if req.use_structured_output:
                    self.counts.guided_drafts_scheduled += len(drafts)
                    self.counts.guided_drafts_accepted += accepted
        # A V2 model runner proposes no drafts after a step vLLM marks `skip_drafts`.
        skipped = set(ids) if getattr(out, "skip_drafts", False) else set()
        self.unproposed = (self.unproposed - set(ids)) | skipped
        if self.explicit:
            self._propose(ids, skipped)
        output = runner_output(self.new_output, ids, sampled_token_ids=sampled)
        return output, valid

    def _check_grammar_drafts(self, rid: str, base: int, drafts: list[int], start: int) -> None:
        """`draft_grammar`: the drafts vLLM schedules for a structured-output request, up to
        the first -1 (a draft it found invalid, or a placeholder it never checked), are ones
        its grammar admits once its reasoning has ended (grammar from output `start` on; by
        the outputs so far, or by a reasoning end among the drafts): with
        `integrations.vllm.structured`'s grammar, its true next tokens. vLLM 0.34.0 keeps the
        first draft the grammar rejects (its row is masked, so rejection sampling turns it
        down) and drops those after it; a deferred batch's drafts it does not check at all
        ("rejection sampling handles grammar violations"), so there the rule is `grammar_mask`
        alone."""
        trims = trims_to_first_rejected(self.sched.structured_output_manager)
        if trims and self.async_scheduling:
            return  # vLLM 0.34.0 keeps a deferred batch's drafts unchecked, by design
        ended = start == 1 or base >= start - 1
        rejected = False
        for j, draft in enumerate(drafts):
            if draft == -1:
                return
            if not ended:
                ended = draft == REASONING_END
                continue
            right = draft == self.token(rid, base + 1 + j)
            if not right and (rejected or not trims):
                raise EngineCoreViolation(
                    "draft_grammar",
                    f"{rid!r} is scheduled draft {j + 1} for output {base + 1 + j}, which its "
                    "grammar does not admit (vLLM checks drafts against the grammar before "
                    "scheduling them, and marks those it rejects -1)"
                    + (", past the first rejected one, which vLLM 0.34.0 keeps" if trims else ""),
                )
            rejected = rejected or not right

    def _propose(self, ids: list[str], skipped: set[str]) -> None:
        """Explicit drafts: after a step, k drafts for each request of it that sampled (none
        after a `skip_drafts` step), for its next outputs."""
        structured = False
        for rid in ids:
            req = self.sched.requests.get(rid)
            if req is None:
                continue
            structured = structured or req.use_structured_output
            if req.is_prefill_chunk or rid in skipped:
                self.proposed[rid] = []
                continue
            base = self.produced[rid]
            self.proposed[rid] = [self._draft(rid, base + 1 + j) for j in range(self.k)]
        self.last_batch = (ids, structured)

    def take_drafts(self) -> Any:
        """The drafts the runner hands the engine core for a deferred batch
        (`take_draft_token_ids`): those of the last batch it sampled, per request; all -1 when
        that batch had no structured-output request (vLLM's V2 runner copies drafts back for
        grammar checks only then). With `keyed_drafts`, every request's latest drafts
        instead (a hand-off that names its requests, as vLLM PR #56802 proposes)."""
        if self.keyed:
            live = [r for r in self.proposed if r in self.sched.requests]
            return self.new_drafts(live, [list(self.proposed[r]) for r in live])
        ids, structured = self.last_batch
        drafts = [list(self.proposed.get(rid, [])) if structured else [-1] * self.k for rid in ids]
        return self.new_drafts(list(ids), drafts)

    def _draft(self, rid: str, index: int) -> int:
        """A draft for output `index` of `rid`: its true token with probability DRAFT_RIGHT."""
        if self.rnd.random() < DRAFT_RIGHT:
            return self.token(rid, index)
        self._wrong += 1
        return wrong_draft(self._wrong)

    def _accepted(self, rid: str, base: int, drafts: list[int]) -> int:
        """How many of `drafts` (for outputs base + 1, ...) the model accepts: the longest
        prefix of true tokens (synchronous; asynchronous with explicit drafts, its own, as many
        as vLLM scheduled), or as many draws as come out right in a row (asynchronous: the
        drafts are placeholders)."""
        if self.explicit:
            drafts = self.proposed.get(rid, [])[: len(drafts)]
        accepted = 0
        for j, draft in enumerate(drafts):
            if self.async_scheduling and not self.explicit:
                right = self.rnd.random() < DRAFT_RIGHT
            else:
                right = draft == self.token(rid, base + 1 + j)
            if not right:
                break
            accepted += 1
        return accepted

    def drafts(self, out: Any) -> Any:
        """The drafts proposed after batch `out` (synchronous loop, `EngineCore.post_step`): for
        each request it sampled for, still live, 0 to k drafts for its next outputs."""
        ids: list[str] = []
        proposals: list[list[int]] = []
        for rid in out.num_scheduled_tokens:
            req = self.sched.requests.get(rid)
            if req is None or req.is_finished() or req.is_prefill_chunk:
                continue
            if rid in self.unproposed:
                ids.append(rid)
                proposals.append([])
                continue
            base = self.produced[rid]
            count = self.rnd.randint(0, self.k)
            proposal = [self._draft(rid, base + 1 + j) for j in range(count)]
            ids.append(rid)
            proposals.append(proposal)
        return self.new_drafts(ids, proposals)


def _check_rows(rid: str, n: int, drafts: Sequence[int]) -> None:
    """`draft_rows`: a request scheduled `n` tokens carries at most n - 1 drafts."""
    if len(drafts) > n - 1:
        raise EngineCoreViolation(
            "draft_rows",
            f"{rid!r} is scheduled {n} token(s) with {len(drafts)} drafts: each draft needs a "
            f"row of its own after the request's last token (at most {n - 1})",
        )


__all__ = ["DRAFT_RIGHT", "WRONG_DRAFT", "DraftCounts", "SpeculativeModel"]
