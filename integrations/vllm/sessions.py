"""Streaming-input sessions on vLLM 0.33.0's scheduler: what the engine-core loop sends a
session and what it checks of vLLM's handling.

A streaming-input session (`AsyncLLM` with an input stream; `Request.resumable`) is one request
id fed several inputs. The first is an ordinary request. Each later input is a `Request` with the
same id and `resumable=True`: `Scheduler.add_request` applies it at once to a session waiting for
input (`WAITING_FOR_STREAMING_REQ`), else queues it (`streaming_queue`). A turn ends where an
ordinary request would finish (its `max_tokens`, a stop token, `max_model_len`): vLLM then drops
the turn's in-flight work and keeps the session's KV (`_handle_stopped_request`), and the next
input (`_update_request_as_session`) makes the session's prompt its prompt, its outputs but the
last sampled one, and the input's tokens. After the last input `AsyncLLM` sends a request that
is not resumable, which ends the session: at once if it waits for input, else after its turn.

`SessionInput` is one such later input (or the close); `session_program(seed)` adds them to
`integrations.vllm.engine_core.core_program(seed)`. `SessionLedger` is the checker's side: it
sends the inputs, computes from them alone what each turn's prompt and outputs must be, and,
watching `_update_request_as_session`, checks three rules:

- `session_prompt`: each applied input leaves the session's tokens as its previous prompt, the
  previous turn's outputs but the last, and the input's tokens;
- `session_length`: each applied input leaves the session's prompt room for an output under
  `max_model_len` (below it), the bound vLLM's `InputProcessor` puts on every prompt (a longer
  one is refused as it arrives);
- `session_kv_kept`: the session keeps the KV of its kept tokens while it waits: an input leaves
  its computed tokens as they were, and its next schedule starts there.

`output_content` and `finish_reason` then hold turn by turn: a session's outputs are each
turn's own tokens in turn (the model's tokens depend on the turn, `adapter.output_token`) and a
turn ends with the reason its length implies. A guided session's later input asks for a
grammar of its own turn's content (`grammar_span` holds the turn's rows to it); with a
reasoning parser every other later turn reasons again, its input opening a reasoning part,
and the others skip it (`turn_reasoning_end`, `input_tokens`). vLLM refuses resumable
requests for diffusion models, so only the AR loop serves sessions.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from integrations.vllm.adapter import session_output_token
from integrations.vllm.core_loop import ABORTED, EngineCoreViolation, first_difference
from integrations.vllm.release_api import cache_read_params
from integrations.vllm.structured import (
    REASONING_END,
    REASONING_START,
    grammar_params,
    script_span,
)
from integrations.vllm.token_ids import SESSION_INPUT_BASE, session_input_token
from integrations.vllm.trace import counted, counted_of
from spec.ar.config import ArRequest
from spec.errors import ConfigError

if TYPE_CHECKING:  # engine_core imports this module
    from integrations.vllm.engine_core import CoreProgram


@dataclass(frozen=True, slots=True)
class SessionInput:
    """A later input of session `request_id`: `prompt_len` more prompt tokens and up to
    `max_tokens` outputs for the turn they start; `prompt_len` 0 closes the session (vLLM's
    final request: the input stream is done)."""

    request_id: str
    prompt_len: int
    max_tokens: int = 0

    def __post_init__(self) -> None:
        if self.prompt_len < 0 or (self.prompt_len and self.max_tokens < 1):
            raise ConfigError(
                "SessionInput",
                (self.prompt_len, self.max_tokens),
                "prompt_len >= 1 with max_tokens >= 1, or prompt_len 0 (close the session)",
            )

    @property
    def closes(self) -> bool:
        """Whether this input closes the session."""
        return self.prompt_len == 0


def input_tokens(arrival: int, turn: int, length: int, reasons: bool | None = None) -> list[int]:
    """The tokens of the input that starts turn `turn` of the session submitted `arrival`-th.
    `reasons` (a guided session's turn, with reasoning on): the input ends as a thinking
    model's chat template ends an assistant turn's opening, with `REASONING_START` if the turn
    reasons and with an empty part (`REASONING_START`, `REASONING_END`) if not, as far as its
    length allows (one token: the last of those)."""
    tokens = [session_input_token(arrival, turn, i) for i in range(length)]
    if reasons is None:
        return tokens
    marks = [REASONING_START] if reasons else [REASONING_START, REASONING_END]
    cut = min(length, len(marks))
    return tokens[: length - cut] + marks[len(marks) - cut :]


def turn_reasoning_end(arrival: int, turn: int) -> int | None:
    """With reasoning on, where turn `turn` > 1 of the guided session submitted `arrival`-th
    ends its reasoning (the output index of `REASONING_END`: 1-3 reasoning tokens before it),
    or None for a turn that skips reasoning: every other turn reasons."""
    key = arrival + turn
    return 2 + (key // 2) % 3 if key % 2 == 0 else None


@dataclass
class _Session:
    """The checker's account of one session: its turns' prompts and limits, as sent."""

    arrival: int
    prompt: list[int]  # the current turn's prompt, as it must be
    turn: int = 1
    max_tokens: int = 0  # the current turn's
    stop_after: int | None = None  # the current turn's (the first turn's only)
    pending: deque[SessionInput] = field(default_factory=deque)  # sent, not applied yet
    expected: list[int] = field(default_factory=list)  # every earlier turn's outputs
    expected_reasons: list[str] = field(default_factory=list)  # every earlier turn's reason
    reasons: list[str] = field(default_factory=list)  # the reasons vLLM ended turns with
    closed: bool = False
    kept: int | None = None  # computed tokens at the latest input, until its first schedule
    failing_turns: set[int] = field(default_factory=set)  # turns whose grammar fails
    #: with reasoning on, a guided session's later turns -> their reasoning end (None: the
    #: turn skips reasoning); `turn_reasoning_end`
    reasoning_ends: dict[int, int | None] = field(default_factory=dict)
    #: a guided session's later turns -> the outputs their input's grammar constrains
    #: (first, last), as sent
    spans: dict[int, tuple[int, int]] = field(default_factory=dict)

    def reasons_in(self, turn: int) -> bool | None:
        """Whether later turn `turn` reasons (None: its input carries no reasoning marks)."""
        if turn not in self.reasoning_ends:
            return None
        return self.reasoning_ends[turn] is not None


class SessionLedger:
    """The sessions of one loop: sends their inputs through vLLM's `add_request`, follows the
    turns vLLM applies (`watch`), and checks each session's turns against what was sent.

    `impl` is the adapter (`integrations.vllm.adapter.RealVllmScheduler`) whose scheduler
    serves the sessions, `max_model_len` its configuration's, and `token(rid, index)` the
    model's output token number `index` of request `rid` in its current turn."""

    def __init__(
        self,
        impl: Any,
        max_model_len: int,
        token: Callable[[str, int], int],
    ) -> None:
        self.impl: Any = impl
        self.max_model_len: int = max_model_len
        self._token = token
        self.sessions: dict[str, _Session] = {}
        self.inputs_applied: int = 0  # inputs vLLM made turns of
        self.inputs_queued: int = 0  # of those, sent while the session's turn ran
        self.closed_waiting: int = 0  # sessions closed while they waited for input
        self.resumed_with_kv: int = 0  # turns resumed on the session's kept KV
        self.dropped: int = 0  # resumed sessions whose kept KV vLLM dropped before they ran
        self.awaiting_grammar: int = 0  # inputs applied with their grammar still compiling
        #: Compiles a later input's grammar before vLLM sees the input, as `EngineCore` does,
        #: and says whether it will fail to (None: vLLM's `grammar_init`, at once, never
        #: failing; the loop's late grammars set their own).
        self.compile_grammar: Callable[[Any], object] | None = None
        self.grammar_errors: int = 0  # sessions ended by a later input's failed grammar

    # ------------------------------------------------------------------ sending
    def open(self, request: ArRequest) -> None:
        """Account for session `request`, just submitted (resumable) as the adapter's latest."""
        rid = request.request_id
        req = self.impl.submitted[rid]
        self.sessions[rid] = _Session(
            arrival=self.impl.arrival_of[rid],
            prompt=list(req.prompt_token_ids),
            max_tokens=request.max_tokens,
            stop_after=request.stop_after,
        )

    def send(self, item: SessionInput) -> bool:
        """Give vLLM `item` as `AsyncLLM` would: the next input as a resumable request, the close
        as one that is not. Nothing for a session that has ended (`AsyncLLM` stops sending
        then); False if so."""
        session = self.sessions[item.request_id]
        v = self.impl.v
        if session.closed or item.request_id not in self.impl.sched.requests:
            return False
        turn = session.turn + len(session.pending) + 1
        # a guided session's input asks for a grammar of its own turn's outputs (after its
        # reasoning, with reasoning on)
        guided = not item.closes and self.impl.submitted[item.request_id].use_structured_output
        if guided and self.impl.reasoning:
            session.reasoning_ends[turn] = turn_reasoning_end(session.arrival, turn)
        end_at = session.reasoning_ends.get(turn)
        tokens = (
            input_tokens(session.arrival, turn, item.prompt_len, session.reasons_in(turn))
            if item.prompt_len
            else [0]
        )
        first = 1 if end_at is None else end_at + 1
        if guided:
            session.spans[turn] = (first, item.max_tokens)
        script = [
            session_output_token(session.arrival, turn, i, end_at)
            for i in range(first, item.max_tokens + 1)
        ]
        params = v.sampling.SamplingParams(
            max_tokens=max(item.max_tokens, 1),
            ignore_eos=True,
            structured_outputs=grammar_params(v, script, first) if guided else None,
            # each input bounds its cache reads as the session's first did (vLLM takes the
            # limit of each input's own sampling parameters)
            **cache_read_params(self.impl.specs[item.request_id].cache_read_limit),
        )
        request = v.request.Request(
            request_id=item.request_id,
            prompt_token_ids=tokens,
            sampling_params=params,
            pooling_params=None,
            arrival_time=float(session.arrival),
            block_hasher=self.impl.hasher,
            resumable=not item.closes,
            lora_request=self.impl.submitted[item.request_id].lora_request,
        )
        live = self.impl.sched.requests[item.request_id]
        waiting = live.status == v.request.RequestStatus.WAITING_FOR_STREAMING_REQ
        session.closed = item.closes
        if not item.closes:
            session.pending.append(item)
            self.inputs_queued += not waiting
        if guided:  # as `EngineCore.add_request` compiles it before the scheduler sees it
            compile_grammar = (
                self.compile_grammar or self.impl.sched.structured_output_manager.grammar_init
            )
            if compile_grammar(request):  # it will not compile: the turn ends the session
                session.failing_turns.add(turn)
        self.impl.sched.add_request(request)
        if item.closes and waiting:
            self.closed_waiting += 1
        return True

    def grammar_span(self, req: Any) -> tuple[int, int]:
        """The outputs the grammar of vLLM request `req`'s current turn constrains, (first,
        last): a session's later turn's as its input asked for them (what was sent, not the
        grammar vLLM holds, which may be another turn's), else its own grammar's
        (`script_span`)."""
        session = self.sessions.get(req.request_id)
        if session is not None and session.turn > 1:
            return session.spans[session.turn]
        return script_span(req)

    # ------------------------------------------------------------------ watching vLLM
    def watch(self, sched: Any) -> None:
        """Check every input vLLM applies (`_update_request_as_session`), as it applies it."""
        apply = sched._update_request_as_session

        def watched(session: Any, update: Any) -> None:
            computed = session.num_computed_tokens
            apply(session, update)
            self.applied(session, computed)

        sched._update_request_as_session = watched

    def turn_ended(self, rid: str, reason: str) -> None:
        """Session `rid`'s current turn ended with `reason` (vLLM's finish reason on an output
        of a session that goes on, or on its last); compared once the loop is drained."""
        self.sessions[rid].reasons.append(reason)

    def ended_by_failed_load(self, rid: str) -> None:
        """Session `rid` was ended with an error after a failed KV load (a connector's "fail"
        policy): that error ends no turn, and the session is checked as an aborted one."""
        reasons = self.sessions[rid].reasons
        if reasons and reasons[-1] == "error":
            reasons.pop()

    def applied(self, req: Any, computed: int) -> None:
        """vLLM applied session `req`'s next input: `session_prompt`, `session_length` and the
        first half of `session_kv_kept` (`computed`: its computed tokens before)."""
        rid = req.request_id
        session = self.sessions[rid]
        where = f"{rid!r}'s input for turn {session.turn + 1}"
        if not session.pending:
            raise EngineCoreViolation(
                "session_prompt", f"vLLM applied {where}, which was never sent"
            )
        item = session.pending.popleft()
        k = self.turn_length(session)
        outputs = [self._token(rid, i) for i in range(1, k + 1)]
        session.expected.extend(outputs)
        session.expected_reasons.append(self.turn_reason(session))
        session.turn += 1
        self.impl.turn_of[rid] = session.turn
        end_at = session.reasoning_ends.get(session.turn)
        if end_at is None:
            self.impl.reasoning_end_at.pop(rid, None)
        else:
            self.impl.reasoning_end_at[rid] = end_at
        session.prompt = [
            *session.prompt,
            *outputs[:-1],
            *input_tokens(
                session.arrival, session.turn, item.prompt_len, session.reasons_in(session.turn)
            ),
        ]
        session.max_tokens, session.stop_after = item.max_tokens, None
        self.inputs_applied += 1
        grammar = req.structured_output_request
        self.awaiting_grammar += grammar is not None and not grammar.is_grammar_ready
        got = list(req.prompt_token_ids)
        if got != session.prompt or list(req.all_token_ids) != session.prompt:
            at = first_difference(got, session.prompt)
            raise EngineCoreViolation(
                "session_prompt",
                f"after {where} the session's prompt has {len(got)} tokens, expected "
                f"{len(session.prompt)} (its prompt, {k - 1} of its {k} outputs, "
                f"{item.prompt_len} input tokens); they first differ at token {at}",
            )
        if len(got) > self.prompt_limit():
            raise EngineCoreViolation(
                "session_length",
                f"after {where} ({counted(item.prompt_len, 'token')}) the "
                "session's prompt holds "
                f"{len(got)} tokens, leaving no room for an output under max_model_len "
                f"{self.max_model_len}: vLLM's InputProcessor refuses any prompt of "
                f"{self.max_model_len} tokens or more, but checks a session's inputs one by "
                "one, and the session is resumed with the whole",
            )
        if req.num_computed_tokens != computed:
            raise EngineCoreViolation(
                "session_kv_kept",
                f"{where} changed its computed tokens from {computed} to "
                f"{req.num_computed_tokens}: the KV of a waiting session's kept tokens is lost",
            )
        session.kept = computed

    def prompt_limit(self) -> int:
        """`session_length`'s bound on a resumed session's prompt: `max_model_len` - 1, the
        longest prompt vLLM's `InputProcessor` admits (one that leaves room for an output)."""
        return self.max_model_len - 1

    def turn_length(self, session: _Session) -> int:
        """The outputs the session's current turn must end with: its stop index, else its
        `max_tokens`, else what `max_model_len` leaves, at least one (vLLM checks the length
        after each sampled token, as for a prompt of `max_model_len` tokens)."""
        room = self.max_model_len - len(session.prompt)
        stop = session.stop_after if session.stop_after is not None else session.max_tokens + 1
        return max(1, min(stop, session.max_tokens, room))

    def turn_reason(self, session: _Session) -> str:
        """The reason the session's current turn must end with ("stop" or "length")."""
        stop = session.stop_after
        return "stop" if stop is not None and self.turn_length(session) == stop else "length"

    def before_schedule(self) -> None:
        """A resumed session whose KV vLLM dropped as a whole (no block held, nothing computed:
        a preemption, or a candidate fix's drop of a stalled session) starts afresh: its next
        schedule is not held to the tokens it kept."""
        for rid, session in self.sessions.items():
            if session.kept is None:
                continue
            req = self.impl.sched.requests.get(rid)
            if req is None:  # ended (aborted) before it ran again
                session.kept = None
            elif req.num_computed_tokens == 0:
                session.kept = None
                self.dropped += 1

    def resuming(self) -> set[str]:
        """The sessions resumed on KV they kept and not scheduled since (their next schedule
        reads that KV, not a prefix-cache hit)."""
        return {rid for rid, s in self.sessions.items() if s.kept}

    def scheduled(self, starts: Mapping[str, int], where: str) -> None:
        """`session_kv_kept`'s second half: a session's first schedule after an input starts
        at the computed tokens it kept."""
        for rid, start in starts.items():
            session = self.sessions.get(rid)
            if session is None or session.kept is None:
                continue
            kept, session.kept = session.kept, None
            # with nothing kept (the session was preempted in its turn) it starts afresh and
            # may hit the prefix cache (`cache_hit_written`)
            if kept and start != kept:
                raise EngineCoreViolation(
                    "session_kv_kept",
                    f"{where}: {rid!r}, resumed for turn {session.turn} with "
                    f"{counted_of(kept, 'token')} KV kept, is scheduled from token {start}",
                )
            self.resumed_with_kv += bool(kept)

    # ------------------------------------------------------------------ the end
    def check(self, rid: str, tokens: list[int], reason: str | None) -> None:
        """`output_content` / `finish_reason` of session `rid`, drained with `tokens` and final
        `reason`: every turn's outputs in turn (an aborted session's a prefix) and reasons."""
        session = self.sessions[rid]
        if reason is None:
            raise EngineCoreViolation("progress", f"session {rid!r} never finished")
        k = self.turn_length(session)
        expected = [*session.expected, *(self._token(rid, i) for i in range(1, k + 1))]
        reasons = [*session.expected_reasons, self.turn_reason(session)]
        if session.turn in session.failing_turns:
            # its input's grammar did not compile: vLLM ends the session with an error and
            # no token of this turn, as it ends a new request whose grammar fails
            expected, reasons = list(session.expected), [*session.expected_reasons, "error"]
            self.grammar_errors += reason == "error"
        if reason == ABORTED:
            expected = expected[: len(tokens)]
            reasons = reasons[: len(session.reasons)]
        if tokens != expected:
            at = first_difference(tokens, expected)
            raise EngineCoreViolation(
                "output_content",
                f"session {rid!r} ({session.turn} turns) produced {len(tokens)} tokens, "
                f"expected {len(expected)}; they first differ at output {at + 1}",
            )
        if session.reasons != reasons:
            raise EngineCoreViolation(
                "finish_reason",
                f"session {rid!r}'s turns ended with {session.reasons}, expected {reasons}",
            )

    @property
    def counts(self) -> dict[str, int]:
        """What the sessions did, by `CoreRun` field."""
        return {
            "sessions": len(self.sessions),
            "session_inputs": self.inputs_applied,
            "session_inputs_queued": self.inputs_queued,
            "sessions_closed_waiting": self.closed_waiting,
            "session_turns_on_kept_kv": self.resumed_with_kv,
            "session_kv_dropped": self.dropped,
            "session_inputs_awaiting_grammar": self.awaiting_grammar,
            "session_grammar_errors": self.grammar_errors,
        }


def session_program(seed: int, past_context: bool = False) -> CoreProgram:
    """`core_program(seed)` with every other request (by a coin of its own draws) a session
    given one or two later inputs, each some steps after the one before, and then closed. Each
    input is short (up to a quarter of `max_model_len`) and keeps the session within
    `max_model_len`, unless `past_context`."""
    from integrations.vllm.engine_core import core_program

    program = core_program(seed)
    rnd = random.Random(seed * 7919 + 5)
    mml = program.config.max_model_len
    inputs: dict[int, list[SessionInput]] = {}
    for step, batch in enumerate(program.arrivals):
        for request in batch:
            if rnd.random() < 0.5:
                continue
            at = step
            prompt = request.prompt_len
            stop = request.stop_after if request.stop_after is not None else request.max_tokens + 1
            k = min(stop, request.max_tokens)
            for _ in range(rnd.randint(1, 2)):
                room = mml - (prompt + k - 1) if not past_context else mml
                if room < 2:
                    break
                length = rnd.randint(1, min(max(1, mml // 4), room - 1))
                max_tokens = rnd.randint(1, 4)
                at += rnd.randint(1, 12)
                item = SessionInput(request.request_id, length, max_tokens)
                inputs.setdefault(at, []).append(item)
                prompt += k - 1 + length
                k = max(1, min(max_tokens, mml - prompt))
            at += rnd.randint(0, 12)
            inputs.setdefault(at, []).append(SessionInput(request.request_id, 0))
    steps = max([len(program.arrivals), *(s + 1 for s in inputs)])
    pad = steps - len(program.arrivals)
    return replace(
        program,
        arrivals=program.arrivals + ((),) * pad,
        aborts=program.aborts + ((),) * pad,
        inputs=tuple(tuple(inputs.get(s, ())) for s in range(steps)),
    )


def sessions_of(inputs: Iterable[Iterable[SessionInput]]) -> frozenset[str]:
    """The request ids a program's inputs make sessions of."""
    return frozenset(item.request_id for step in inputs for item in step)


__all__ = [
    "SESSION_INPUT_BASE",
    "SessionInput",
    "SessionLedger",
    "input_tokens",
    "session_program",
    "sessions_of",
]
