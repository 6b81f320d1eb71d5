"""The AR section of docs/spec.md, generated from the AR spec's own data (lifecycle tables and
the `ArRule` statements) plus the decisions the data cannot carry (event order, the resolution
of same-step re-admission). `spec.docs.render()` appends it after the dLLM reference."""

from __future__ import annotations

from spec.ar.invariants import AR_INVARIANTS, BETWEEN_STEPS
from spec.ar.lifecycles import AR_LIFECYCLES
from spec.ar.pipeline import PIPELINE_RULES
from spec.ar.routing import ROUTING_RULES
from spec.ar.rules import AR_RULES

_INTRO = """\
## Autoregressive (AR) specification

The AR half (`spec/ar/`) specifies iteration-level LLM scheduling (vLLM v1, Vidur): a token
budget and a seat cap per step, paged KV blocks, preemption by recomputation, and prefix caching
(shared, reference-counted blocks). Its policy options, and the engine behaviour each cites, are
in docs/schedulers.md.

### Event order within a step

1. **Between steps**: `ArSubmitted`; `ArAborted` after the `ArBlocksFreed` of what the request
   held; an operator's `ArPauseSet(state)` (`unpaused`, `paused_new`: no admission,
   `paused_all`: nothing scheduled; rule `pause`) and a cache reset: `ArPreempted(...,
   reset=true)` for each running request it preempts, the last first (no victim rule; the
   next step may admit it again), then `ArCacheReset` (nothing held; every cached block goes;
   rule `cache_reset`). Optionally, in the gap of a request's `ArSubmitted`,
   `ArAwaiting(request, what)`: it may not be admitted until its `ArReady(request)` (vLLM: a
   structured-output grammar still compiling; rule `awaiting`). `ArReady` comes between steps,
   or with `in_step` in the step's admission pass where the scheduler promoted it (vLLM's
   waiting pass, after its cache-aware reorder); `ArInputFailed(request)` between steps when
   the input will never be ready (the pass that reaches it ends it, `ArAborted`).
2. **Scheduling phase** (the engine's `schedule()`): `ArPreempted` (with every block the victim
   held), and per scheduled request `ArCacheHit` (an admitted request's cached prefix blocks),
   `ArBlocksAllocated` (fresh blocks appended to its table), then `ArScheduled` (its tokens;
   with speculative decoding, `drafts` of them are draft tokens after its known ones).
   `ArCacheEvicted` for cached blocks dropped otherwise than by reallocation. An engine that
   emits no events derives all of them from pool views before and after `schedule()`
   (`spec.ar.reconstruct.scheduling_events`): every preemption first (tail first, or the
   engine's order; a victim the engine had scheduled in the same call, when the adapter can
   tell, scheduled right before its preemption), then the running requests in running order,
   then the admitted ones. A request preempted in the step that scheduled it loses what that
   scheduling cached: no forward writes it.
3. **Model execution**: `ArStepEnd(step_index)`: every scheduled request computes its tokens; a
   request that caught up with its known tokens samples one output token.
4. **Update phase** (the engine's `update_from_output()`): `ArDraftsVerified(request,
   accepted)` for every request whose drafts the step computed (the accepted drafts become
   outputs after the sampled token, the rejected ones are no longer computed; rule
   `speculative_drafts`), then, optionally, `ArOutputTokens(request, tokens)` with the ids
   of the outputs the step produced (rule `output_tokens`; see prefix caching), then
   `ArBlocksFreed`, then `ArFinished` for every request whose finish condition holds
   (`release_events` derives the frees). After it, optionally, `ArDraftsProposed(request,
   drafts)` for each running request the drafter proposed drafts for (vLLM's
   `update_draft_token_ids`): its next schedule carries at most these (`speculative_drafts`),
   and a decision twin replays them.

Between steps (before the first scheduling event of a step, and after the last event) the
between-steps invariants hold and an adapter's snapshot must equal the abstract state.

### Same-step re-admission after preemption

Vidur's Sarathi restarts a request (every block freed, computed tokens discarded, back to the
head of the queue) and may admit it again in the same batch. The spec once said both "a step
that preempted may admit" (Sarathi's declared rules) and "a preempted request holds no KV block"
after every event, so such a run contradicted itself. Resolved: **re-admission in the step of the
preemption is legal exactly where the implementation declares it** (`ArPolicy.
admit_after_preemption`, or `ArRules.admit_after_preemption`). Then the victim may receive a
cache hit and blocks in that same scheduling phase, and must be scheduled in it;
`preempted_holds_nothing` applies only where re-admission is not declared, and between steps no
request is in phase `preempted` (`waiting_holds_nothing` covers a re-admission that allocated
but did not schedule). Where it is not declared, the first `ArBlocksAllocated`, `ArCacheHit` or
`ArScheduled` of the victim in that step breaks `no_admission_after_preemption`.

### Prefix caching

A block is held by every request whose block table lists it; its reference count is the number
of holders, and `free + referenced = usable`. A full block becomes cached, under its content
(the request's tokens up to the block's end), when the step that fills it is scheduled. A cache
hit takes cached blocks holding the request's own prefix, whole blocks, at most its known
tokens less one, and its computed tokens jump by the hit. A free cached block stays cached
until it is allocated afresh (which evicts it) or evicted (`ArCacheEvicted`, unreferenced blocks
only). Requests carry their prompt token ids (`ArRequest.prompt`) for this, and a log names
its requests' output token ids (`ArOutputTokens`, in the update phase of the step that produced
them): a named output keys the blocks holding it as a prompt token does, so a prompt that
continues another request's prompt and outputs (a conversation's next turn) hits them, as in
vLLM. An output no event names is private to its request; a block cached while its outputs
were private (EAGLE's lookahead publication at the step end, a verification's accepted drafts)
is keyed afresh when they are named, held or freed (before the next step, no other request can
have hit it). Where the engine declares `hash_lookahead_tokens` = L (vLLM with an EAGLE
drafter), a block's key also covers the L tokens after it: it is cached only once they are
known (a last prompt block once its first output is sampled), and a hit takes it only where the
request's own next L tokens match too; the block just before a request's outputs is keyed by
the first of them once named. The check asks only that a hit be cached content within those
bounds; where the engine declares `longest_cache_hit` (vLLM's lookup over one full-attention
group, blocks hashed by their tokens alone) a request admitted from the queue must also take
the longest run of cached blocks holding its prefix (rule `cache_hit_longest`: a prefix cache
that missed).
"""


_PIPELINE_INTRO = """\
### Pipelined replicas

A replica split into S pipeline stages (Vidur's `num_pipeline_stages`) runs up to S micro-batches
at once, one per stage; a request computes its tokens S ticks (stage times) after it was
scheduled, which the one-batch-per-step rules above do not model. What holds instead is checked
on a snapshot of the pipeline between ticks (`spec.ar.pipeline.PipelineSnapshot`: the batches in
flight with the tick each formed in and the stage it runs, the waiting, pending, finished and
aborted requests, the blocks each holds and the tokens of KV they hold, and the free count) by
`spec.ar.pipeline.check_pipeline`,
whose violations name one of these (`PipelineRule`). One option is declared in the snapshot
(`sequence_parallel`): sequence pipeline parallelism (Vidur's `enable_sequence_pipeline_parallel`,
from Mnemosyne) forms a request's next prefill chunk once its previous one has left stage 0, so
several batches in flight may hold prefill chunks of one request; each batch names the requests it
decodes (`BatchInFlight.decodes`), and a decode still overlaps nothing.
"""


_ROUTING_INTRO = """\
### Routing over replicas

A global scheduler sends each arriving request to one replica (`spec.ar.routing`: round robin,
or least outstanding requests as Vidur counts them, the requests waiting at each replica).
`check_routing` checks a routing round against `expected_routes`:
"""


def render_ar_section() -> str:
    """The AR part of docs/spec.md: its lifecycles, rules and invariants, as Markdown."""
    parts = [_INTRO, "### AR lifecycles\n"]
    for lc in AR_LIFECYCLES:
        parts.append(f"#### {lc.name}\n")
        parts.append("| from | trigger | to | guard |\n|---|---|---|---|")
        for t in lc.transitions:
            parts.append(f"| {t.source} | `{t.trigger}` | {t.target} | {t.guard} |")
        parts.append("")
    parts.append("### AR rules\n")
    parts.append("Each AR violation names one of these (`spec.ar.rules.ArRule`).\n")
    parts.append("| rule | statement | state invariant |\n|---|---|---|")
    for rule, text in AR_RULES.items():
        inv = "between steps" if rule in BETWEEN_STEPS else ("yes" if rule in AR_INVARIANTS else "")
        parts.append(f"| `{rule}` | {text} | {inv} |")
    parts.append("")
    parts.append(_PIPELINE_INTRO)
    parts.append("| rule | statement |\n|---|---|")
    for pipeline_rule, statement in PIPELINE_RULES.items():
        parts.append(f"| `{pipeline_rule}` | {statement} |")
    parts.append("")
    parts.append(_ROUTING_INTRO)
    parts.append("| rule | statement |\n|---|---|")
    for routing_rule, statement in ROUTING_RULES.items():
        parts.append(f"| `{routing_rule}` | {statement} |")
    parts.append("")
    return "\n".join(parts)


__all__ = ["render_ar_section"]
