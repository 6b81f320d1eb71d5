"""Structured output (guided decoding) in vLLM's engine-core loop: a grammar backend whose
grammars admit exactly each request's own tokens, and the model runner's bitmask check.

vLLM 0.33.0 constrains a structured-output request's sampling with a token bitmask per sampled
position, which its scheduler computes from the request's grammar (`Scheduler.
get_grammar_bitmask` -> `StructuredOutputManager.grammar_bitmask`). The grammar must then stand
where the request's output stands: after every token it has sampled, and, for a draft row,
after the drafts before it. Under async scheduling a step is planned while the request's
previous output is still in flight, so the engine core defers sampling a batch with such a
request until that output is applied (`pending_structured_output_tokens`,
`EngineCore.step_with_batch_queue`); with speculative decoding the scheduler also checks the
drafts against the grammar (`update_draft_token_ids`, or `update_draft_token_ids_in_output`
for a deferred batch) and masks the rows after the last valid one.

The grammar here (`ScriptGrammar`, compiled by `ScriptBackend` from the request's token script
given as its grammar text) admits exactly the request's own output tokens 1..end in order, end
its stop index or `max_tokens`, and nothing after. A bitmask row is a set of token classes
over the model's vocabulary (`GRAMMAR_VOCAB`): the fabricated tokens of
`integrations.vllm.adapter` lie far outside it, so output number i belongs to class
`i mod GRAMMAR_VOCAB`, and the row of a grammar that has accepted n tokens allows class
`(n + 1) mod GRAMMAR_VOCAB` alone. vLLM only fills, copies and moves rows (and fills the
unconstrained ones with all ones), so this keeps its bookkeeping whole while making a row
computed from the wrong grammar state visible: rule `grammar_mask`
(`integrations.vllm.grammar_rows`), checked by the model runner for every token it samples for
such a request. A grammar that rejects a
sampled token makes vLLM finish the request with an error, which `finish_reason` reports.

Depends on vLLM's scheduler only through duck typing (vLLM checks the grammar and backend
classes only for type checkers); torch is vLLM's. vLLM has no public way to plug a backend in,
so `install` sets the manager's `backend` and `backend_name`, and its private
`_use_async_grammar_compilation` (no thread pool: compilation is synchronous, or completed by
the loop at a drawn step, `LateGrammars`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from integrations.vllm.token_ids import REASONING_END, REASONING_START

#: vLLM's backend name for this grammar (`StructuredOutputsParams._backend`).
BACKEND = "schedspec-script"
#: Token classes a bitmask row covers: the tiny model's vocabulary size.
GRAMMAR_VOCAB = 128
_WORDS = GRAMMAR_VOCAB // 32


def token_class(index: int) -> int:
    """The bitmask class of output number `index` (1-based)."""
    return index % GRAMMAR_VOCAB


class ScriptGrammar:
    """vLLM's `StructuredOutputGrammar` contract over one token script: after n accepted tokens
    it admits `script[n]` alone, and nothing once the script is done (terminated). The script
    is the request's outputs `first`, `first` + 1, ... (`first` > 1 after a reasoning part,
    which the grammar does not see)."""

    def __init__(self, script: Sequence[int], first: int = 1) -> None:
        self.script: tuple[int, ...] = tuple(script)
        self.first: int = first
        self.accepted: int = 0

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        """Advance over `tokens` while each is the next of the script; False at the first that
        is not (the ones before it stay accepted, as xgrammar's matcher keeps them)."""
        for token in tokens:
            if self.is_terminated() or token != self.script[self.accepted]:
                return False
            self.accepted += 1
        return True

    def validate_tokens(self, tokens: list[int]) -> list[int]:
        """The longest prefix of `tokens` the grammar admits from here, not advancing."""
        rest = self.script[self.accepted :]
        n = 0
        while n < len(tokens) and n < len(rest) and tokens[n] == rest[n]:
            n += 1
        return list(tokens[:n])

    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens."""
        if not 0 <= num_tokens <= self.accepted:
            raise ValueError(f"rollback of {num_tokens} tokens after {self.accepted} accepted")
        self.accepted -= num_tokens

    def fill_bitmask(self, bitmask: Any, batch_index: int) -> None:
        """Row `batch_index` of `bitmask` (int32, `_WORDS` words): the class of the next output
        alone (vLLM fills a terminated grammar's row itself)."""
        row = bitmask[batch_index]
        row.fill_(0)
        cls = token_class(self.first + self.accepted)
        row[cls // 32] = _signed(1 << (cls % 32))

    def is_terminated(self) -> bool:
        """The script is done."""
        return self.accepted >= len(self.script)

    def reset(self) -> None:
        """Back to no token accepted."""
        self.accepted = 0


class ScriptBackend:
    """vLLM's `StructuredOutputBackend` contract for `ScriptGrammar`: the grammar text is the
    output index of the script's first token and the script, "first:t1,t2,..."; bitmasks are
    int32 tensors of `_WORDS` words."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch

    def compile_grammar(
        self, request_type: Any, grammar_spec: str, stop_token_ids: Any = None
    ) -> ScriptGrammar:
        """The grammar of `grammar_spec` ("first:t1,t2,...")."""
        first, _, script = grammar_spec.partition(":")
        return ScriptGrammar([int(t) for t in script.split(",") if t], int(first))

    def allocate_token_bitmask(self, max_num_seqs: int) -> Any:
        """`max_num_seqs` rows, all allowed."""
        return self.torch.full((max_num_seqs, _WORDS), -1, dtype=self.torch.int32)

    def destroy(self) -> None:
        """Nothing to release."""


def install(sched: Any, torch: Any) -> None:
    """Make `sched`'s structured-output manager compile with `ScriptBackend`, synchronously
    (as vLLM does under the `external_launcher` executor): the grammar is ready when
    `grammar_init` returns, so no thread decides when a request may be scheduled."""
    manager = sched.structured_output_manager
    manager.backend = ScriptBackend(torch)
    manager.backend_name = BACKEND
    manager._use_async_grammar_compilation = False


def grammar_params(v: Any, script: Sequence[int], first: int = 1) -> Any:
    """vLLM's `StructuredOutputsParams` for a request whose grammar is `script`, its outputs
    from number `first` on."""
    text = f"{first}:" + ",".join(str(t) for t in script)
    params = v.sampling.StructuredOutputsParams(grammar=text)
    params._backend = BACKEND
    return params


class LateGrammars:
    """Grammars that compile some engine steps after submission, or fail to: vLLM compiles a
    grammar in a thread pool and the scheduler skips the request while the future is pending
    (`WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR`), and finishes it with an error when compilation
    raised. Here the future is completed by the loop (`complete`) at a step drawn per request
    (0..`MAX_DELAY` engine steps after submission), so both loops of a program see the same
    timing; one request in `FAIL_ONE_IN` (drawn) gets a grammar that does not compile."""

    MAX_DELAY = 3
    FAIL_ONE_IN = 6

    def __init__(self, sched: Any, seed: int) -> None:
        self.sched = sched
        self.rnd: random.Random = random.Random(seed)
        self.pending: list[tuple[int, Any, Future[Any], bool]] = []
        self.failed: set[str] = set()  # requests whose grammar does not compile
        #: request id -> (engine steps until its grammar is ready, whether it fails); drawn
        #: by default, replaceable (tests script the timing)
        self.draw: Callable[[str], tuple[int, bool]] = self._drawn

    def _drawn(self, request_id: str) -> tuple[int, bool]:
        fails = self.rnd.randrange(self.FAIL_ONE_IN) == 0
        return self.rnd.randint(0, self.MAX_DELAY), fails

    def submit(self, request: Any, now: int, *, session_input: bool = False) -> bool:
        """Give `request` a pending grammar (vLLM's `grammar_init` under its thread pool);
        whether it will fail to compile. A request whose grammar fails is noted in `failed`
        (it ends with an error and no token), but not a session's later input: the session's
        ledger expects that turn to end the session with an error after the earlier turns'
        outputs (`SessionLedger.send`)."""
        future: Future[Any] = Future()
        request.structured_output_request.grammar = future
        delay, fails = self.draw(request.request_id)
        self.pending.append((now + delay, request, future, fails))
        if fails and not session_input:
            self.failed.add(request.request_id)
        return fails

    def complete(self, now: int) -> None:
        """Complete every future due by engine step `now`: the compiled grammar, or the error
        a grammar that does not compile raises."""
        due = [entry for entry in self.pending if entry[0] <= now]
        self.pending = [entry for entry in self.pending if entry[0] > now]
        backend = self.sched.structured_output_manager.backend
        for _, request, future, fails in due:
            if fails:
                future.set_exception(
                    ValueError(f"the grammar of {request.request_id!r} does not compile")
                )
            else:
                key = request.structured_output_request.structured_output_key
                future.set_result(backend.compile_grammar(*key))


def script_span(request: Any) -> tuple[int, int]:
    """The outputs vLLM request `request`'s `ScriptGrammar` constrains: (first, last)."""
    grammar = request.structured_output_request.grammar
    if not isinstance(grammar, ScriptGrammar):
        raise TypeError(f"{request.request_id!r} has no ScriptGrammar (got {grammar!r})")
    return grammar.first, grammar.first + len(grammar.script) - 1


# `REASONING_END` (`token_ids`) ends a guided request's reasoning (`ScriptReasoner`), when
# reasoning is on. `REASONING_START` opens a reasoning part (`<think>`): a later input of a
# guided session ends with it when its turn reasons, and with it and `REASONING_END` when the
# turn does not (as a thinking model's chat template opens each assistant turn, with an empty
# part to skip it).


def reasoner_class(base: Any) -> Any:
    """A vLLM `ReasoningParser` (subclass of `base`) whose reasoning opens with the token
    `REASONING_START` and ends with `REASONING_END`, as DeepSeek-R1's parser reads `<think>`
    and `</think>`: no tokenizer needed. A prompt has ended its reasoning when, read from its
    end, an end comes before any start (vLLM's `BaseThinkingReasoningParser`), so a session's
    later turn that opens a part reasons again."""

    class ScriptReasoner(base):  # type: ignore[misc]
        def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
            for token in reversed(input_ids):
                if token == REASONING_START:
                    return False
                if token == REASONING_END:
                    return True
            return False

        def is_reasoning_end_streaming(self, input_ids: Sequence[int], delta_ids: Any) -> bool:
            return REASONING_END in list(delta_ids)

        def extract_content_ids(self, input_ids: list[int]) -> list[int]:
            ids = list(input_ids)
            return ids[ids.index(REASONING_END) + 1 :] if REASONING_END in ids else []

        def extract_reasoning(self, model_output: str, request: Any) -> Any:
            return None, model_output

        def extract_reasoning_streaming(self, *args: Any, **kwargs: Any) -> Any:
            return None

    return ScriptReasoner


def install_reasoner(sched: Any, v_reasoning: Any) -> None:
    """Make `sched`'s structured-output manager hold back a guided request's grammar until its
    reasoning ends (`ScriptReasoner`; vLLM sets `reasoner_cls` from `--reasoning-parser`, and
    builds each request's parser with the tokenizer, which this one does not use)."""
    manager = sched.structured_output_manager
    manager.reasoner_cls = reasoner_class(v_reasoning.ReasoningParser)
    manager.tokenizer = None


def _signed(word: int) -> int:
    """`word` (0..2**32 - 1) as the int32 it is stored as."""
    return word - (1 << 32) if word >= 1 << 31 else word


__all__ = [
    "BACKEND",
    "GRAMMAR_VOCAB",
    "REASONING_END",
    "REASONING_START",
    "LateGrammars",
    "ScriptBackend",
    "ScriptGrammar",
    "grammar_params",
    "install",
    "install_reasoner",
    "reasoner_class",
    "script_span",
    "token_class",
]
