"""`schedspec verify --impl NAME|module:attribute ...`: the conformance suite on implementations
of either family, as a campaign (`--keep-going`, `--accept FILE`).

Everything the run needs is checked first (flags, output paths, the accept file, every
implementation loaded and its family known), so a typo fails in a second, not after minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from properties.campaign import parse_accept_file
from properties.deadline import CallDeadlineExceeded, TwinHung, call_timeout_set
from properties.raised import describe_raised
from properties.verify import ArTwin, DllmTwin, Failure, Twin, VerifyResult, verify_implementation
from schedspec_cli import meta
from schedspec_cli.args import (
    MAX_EXAMPLES,
    MAX_SEED,
    add_call_timeout,
    int_in,
    positive,
    refuse_ignored,
)
from schedspec_cli.engine_cmds import check_shipped_parity
from schedspec_cli.engine_stdout import implementation_stdout_to_stderr
from schedspec_cli.impls import (
    NotAnAdapter,
    Resolved,
    activated_engines,
    engine_line,
    ignored_scheduler_cls,
    load_engine,
    profile_summary,
    refuse_parity_for_ar_only,
    release_driven,
    resolve,
)
from schedspec_cli.known_fixes import FixTrial, KnownFix, try_known_fixes
from schedspec_cli.loader import load_object
from schedspec_cli.output import check_output_path, table, write_json
from schedspec_cli.progress import Progress
from schedspec_cli.registry import BUILTINS, Builtin, ParityPolicy
from schedspec_cli.torch_threads import DEFAULT_CHECK_THREADS, pin_torch_threads
from schedspec_cli.twins import STOCK_TWINS, twin_for_target, twin_for_targets, twin_names
from spec.ar.profile import ArProfile
from spec.config import Mode
from spec.errors import CannotDrive, ConfigError
from spec.implementation import Family
from spec.profile import AcceptedDeviation, DllmProfile


def add_arguments(v: argparse.ArgumentParser) -> None:
    """Add `verify`'s flags to `v`: those of `--impl` runs and of the main job (the defaults
    of flags of one kind only are filled in later, by `check_scope`)."""
    v.add_argument(
        "--impl",
        action="append",
        metavar="NAME|MODULE:ATTR",
        help="a built-in name (see list-impls) or module:attribute naming a DllmImplementation, "
        "an ArImplementation or a factory; the current directory is importable (repeatable). "
        "Without --impl: the main job",
    )
    v.add_argument(
        "--family",
        choices=("dllm", "ar"),
        help="the family of a module:attribute factory whose family cannot be told from its "
        "type or annotation",
    )
    v.add_argument(
        "--examples",
        type=positive(MAX_EXAMPLES),
        default=100,
        help="generated programs per implementation (and per campaign run); default 100",
    )
    v.add_argument("--json", metavar="PATH", help="write the result as JSON here")
    v.add_argument(
        "--report",
        metavar="DIR",
        help="write report.md and report.json here (the main job's default: reports/verify)",
    )
    v.add_argument(
        "--parity",
        choices=("always", "bs1", "never"),
        help="--impl runs of dLLM implementations: the output check at teardown: always "
        "(outputs equal solo sync outputs at every batch size; the default), bs1 (only "
        "batch-size-1 runs), never",
    )
    v.add_argument(
        "--mode",
        action="append",
        choices=("sync", "fdfo"),
        help="dLLM: only generate configurations in these modes (repeatable)",
    )
    v.add_argument(
        "--twin",
        metavar="NAME|MODULE:ATTR",
        help="end every example by running its operations through this decision twin, which "
        "must decide exactly alike (rule twin_decisions). dLLM: a built-in with a twin "
        f"({', '.join(twin_names(Family.DLLM))}; it replays the "
        "run's step outcomes) or module:attribute naming a "
        "DecisionTwin; AR: any AR built-in (vllm-v1 for real-vllm) or module:attribute naming "
        "an ArImplementation (checked under its profile) or a bare factory (under the "
        "implementation's), run with the settings the implementation declares (vLLM's "
        "reference twins take them; another twin runs its own, with a note)",
    )
    v.add_argument(
        "--twin-as-declared",
        action="store_true",
        help="with --twin: run an AR twin with its own declared settings, not the "
        "implementation's (a twin of other settings then decides otherwise by construction)",
    )
    v.add_argument(
        "--loras",
        action="store_true",
        help="AR: draw LoRA adapter slots too (half the configurations get max_loras 1 or 2, "
        "each request the base model or one of three adapters; rule lora_slots), for an "
        "implementation whose space serves adapters (vllm-v1, vllm-v1-prefix, real-vllm, "
        "real-vllm-prefix)",
    )
    v.add_argument(
        "--drafts",
        action="store_true",
        help="AR: draw speculative decoding too (num_speculative_tokens 0 to 3 by ngram, "
        "EAGLE or a draft model; a drafter's proposals and the model's acceptances scripted; "
        "rule speculative_drafts), for an implementation whose adapter replays a drafter "
        "(spec.ar.ArDraftingAdapter: vllm-v1, vllm-v1-prefix and their variants, real-vllm, "
        "real-vllm-prefix)",
    )
    v.add_argument(
        "--seed",
        type=int_in(0, MAX_SEED),
        metavar="N",
        help="--impl runs: draw the programs from this seed instead of the fixed one a run "
        "without it uses (the same seed draws the same programs: rerun with it to replay)",
    )
    v.add_argument(
        "--keep-going",
        action="store_true",
        help="a campaign: run on after a failure and report every distinct rule violated, each "
        "with its own shrunk counterexample",
    )
    v.add_argument(
        "--accept",
        metavar="FILE",
        help="accepted deviations, reported as accepted instead of failed: 'rule: reason' per "
        'line, or JSON [{"rule": ..., "reason": ...}]',
    )
    add_call_timeout(
        v,
        "each call into an implementation (submit, abort, a round or step, drain, snapshot) "
        "must return within this; one that does not is a hang, a violation of [progress]",
    )
    v.add_argument(
        "--threads",
        type=int_in(0, 4096),
        metavar="N",
        help="--impl runs: torch's intra-op threads while checking (default "
        f"{DEFAULT_CHECK_THREADS}: conformance programs are a few small blocks, and more "
        "threads per process oversubscribe a shared machine's cores, which can slow a drain "
        "past --call-timeout; 0: torch's own default)",
    )
    v.add_argument(
        "--parity-prompts",
        type=positive(1000),
        help="main job: prompts of the parity step "
        f"(default {MAIN_JOB_DEFAULTS['parity_prompts']})",
    )
    v.add_argument(
        "--parity-tokens",
        type=positive(4096),
        help="main job: new tokens per parity prompt "
        f"(default {MAIN_JOB_DEFAULTS['parity_tokens']})",
    )


# Flags of one kind of run only; the defaults are applied after parsing, so that a flag the
# user gave can be told apart from one the run would ignore (`check_scope`).
DEFAULT_PARITY: ParityPolicy = "always"
MAIN_JOB_DEFAULTS: dict[str, object] = {"parity_prompts": 8, "parity_tokens": 32}
_IMPL_ONLY = (
    "keep_going",
    "accept",
    "json",
    "family",
    "mode",
    "parity",
    "twin",
    "twin_as_declared",
    "loras",
    "drafts",
    "seed",
    "threads",
)


def refuse_loras_unserved(target: Resolved) -> None:
    """`--loras` asks for adapters: `ConfigError` for a dLLM target (the dLLM spec has none)
    or one whose declared space serves none (`ArConfigSpace.max_loras` 0)."""
    profile = target.implementation.profile
    if target.family is not Family.AR or not isinstance(profile, ArProfile):
        raise ConfigError("--loras", True, f"only with AR implementations ({target.name} is dLLM)")
    if profile.space.max_loras == 0:
        raise ConfigError(
            "--loras",
            True,
            f"an implementation whose space serves LoRA adapters ({target.name} declares "
            "ArConfigSpace.max_loras=0; vllm-v1, vllm-v1-prefix, real-vllm and real-vllm-prefix "
            "serve them)",
        )


def check_scope(args: argparse.Namespace) -> None:
    """Refuse a flag that the run would ignore, then fill in the main job's defaults:
    --keep-going, --accept, --json, --family, --mode, --parity, --twin, --twin-as-declared,
    --loras, --seed and --threads shape --impl runs (--parity stays None when not given, so
    that `plan` can refuse it for AR implementations); --parity-prompts and --parity-tokens
    the main job's parity step."""

    def given(name: str) -> bool:
        value = getattr(args, name)  # `--seed 0` is given: compare by identity, not equality
        return value is not None and value is not False and value != []

    if args.impl:
        refuse_ignored(
            args,
            [n for n in MAIN_JOB_DEFAULTS if given(n)],
            "main job only (without --impl); an --impl run's parity is --parity",
        )
    else:
        refuse_ignored(
            args,
            [n for n in _IMPL_ONLY if given(n)],
            "only with --impl NAME (the main job writes --report)",
        )
    for name, default in MAIN_JOB_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    if not args.impl:
        from gpu.prompts import PARITY_BLOCK_SIZE

        check_shipped_parity(
            "--parity-prompts",
            args.parity_prompts,
            "--parity-tokens",
            args.parity_tokens,
            PARITY_BLOCK_SIZE,
        )


@dataclass(frozen=True, slots=True)
class Plan:
    """What `plan` checked and loaded: the implementations, accepted deviations and twin."""

    targets: tuple[Resolved, ...]
    accepted: tuple[AcceptedDeviation, ...]
    twin: Twin | None = None


def rules_of(family: Family) -> dict[str, str]:
    """The rule names one family's suite can break (name -> what it says)."""
    from spec.ar.rules import AR_RULES
    from spec.rules import RULES

    if family is Family.AR:
        return {str(k): str(v) for k, v in AR_RULES.items()}
    names = {str(k): str(v) for k, v in RULES.items()}
    names["fdfo_sync_parity"] = "outputs equal solo sync outputs"
    return names


def known_rules() -> dict[str, str]:
    """Every rule name of both families (for checking an --accept file)."""
    return {**rules_of(Family.DLLM), **rules_of(Family.AR)}


def refuse_rules_no_suite_checks(
    accepted: tuple[AcceptedDeviation, ...], targets: tuple[Resolved, ...], source: str
) -> None:
    """An accepted rule that none of the implementations' suites can break would accept
    nothing: a slip (an AR rule for a dLLM scheduler), refused naming the file's rule."""
    families = sorted({t.family for t in targets}, key=lambda f: f.value)
    checked = set().union(*(rules_of(f) for f in families))
    for deviation in accepted:
        if deviation.rule not in checked:
            kinds = " or ".join(f.value for f in families)
            raise ConfigError(
                "--accept",
                f"{source}: {deviation.rule}",
                f"a rule the {kinds} suite checks ({deviation.rule} is another family's)",
            )


def refuse_undeclared_modes(modes: list[str], target: Resolved) -> None:
    """A `--mode` the dLLM implementation's profile does not declare is a usage error, not a
    violation: every program would be drawn outside the space it runs."""
    profile = target.implementation.profile
    if not isinstance(profile, DllmProfile):
        return
    declared = profile.space.modes
    if any(Mode.parse(m) not in declared for m in modes):
        runs = ", ".join(sorted(m.value for m in declared))
        raise ConfigError("--mode", ",".join(modes), f"a mode that {target.name} declares: {runs}")


def mode_configs(target: Resolved, modes: tuple[Mode, ...] | None) -> Any:
    """`--mode`'s configurations for a dLLM target: drawn in its own declared space (its page
    multiples, switches, headroom and rows), in those modes only; None without `--mode` (the
    suite draws in the space itself) or for an AR target."""
    profile = target.implementation.profile
    if modes is None or not isinstance(profile, DllmProfile):
        return None
    from properties.strategies import dllm_configs

    return dllm_configs(modes=modes, space=profile.space)


def plan(args: argparse.Namespace) -> Plan:
    """Validate every flag and load every implementation before any work starts."""
    check_output_path("--json", args.json, inputs=[("--accept", args.accept)])
    check_output_path("--report", args.report, directory=True)
    accepted: tuple[AcceptedDeviation, ...] = ()
    if args.accept is not None:
        accepted = parse_accept_file(args.accept, known_rules())
    targets = tuple(resolve(name, args.family) for name in args.impl)
    refuse_rules_no_suite_checks(accepted, targets, args.accept or "")
    for t in targets:
        if args.mode and t.family is Family.AR:
            raise ConfigError(
                "--mode", ",".join(args.mode), f"only with dLLM implementations ({t.name} is AR)"
            )
        if args.mode:
            refuse_undeclared_modes(args.mode, t)
        if args.loras:
            refuse_loras_unserved(t)
        if args.drafts and t.family is not Family.AR:
            raise ConfigError("--drafts", True, f"only with AR implementations ({t.name} is dLLM)")
    twin = None
    if args.twin_as_declared and args.twin is None:
        raise ConfigError(
            "--twin-as-declared", True, "only with --twin (it says how the twin runs)"
        )
    if args.twin is not None:
        modes = frozenset(Mode.parse(m) for m in args.mode) if args.mode else None
        twin = twin_for_targets(args.twin, targets, modes, loras=args.loras)
        dllm = [t.name for t in targets if t.family is Family.DLLM]
        if args.twin_as_declared and dllm:
            raise ConfigError(
                "--twin-as-declared",
                True,
                f"only with AR implementations (a dLLM twin takes no settings; {dllm[0]} is dLLM)",
            )
    refuse_parity_for_ar_only(args.parity, targets)
    ignored = ignored_scheduler_cls(targets)
    if ignored is not None:
        print(ignored, file=sys.stderr)
    for t in targets:
        if t.builtin is not None and t.builtin.engine:
            load_engine(t.builtin.engine, t.builtin.name)
    return Plan(targets, accepted, twin)


def run(args: argparse.Namespace) -> int:
    """`schedspec verify --impl ...`: check every flag and load every implementation first,
    then run the conformance suite on each; print the table and each failure with its program,
    write `--json` and `--report` when given. Returns 0 when every implementation passed, else
    1; a bad flag, path, accept file or implementation raises (exit 2) before any run."""
    check_scope(args)
    # what a module prints as it is imported, too; its import under --call-timeout's deadline
    with implementation_stdout_to_stderr(), call_timeout_set(args.call_timeout):
        p = plan(args)
    # after the implementations are loaded: an engine's torch is imported by now
    pin_torch_threads(DEFAULT_CHECK_THREADS if args.threads is None else args.threads)
    parity_policy: ParityPolicy = DEFAULT_PARITY if args.parity is None else args.parity
    modes = None
    if args.mode:
        modes = tuple(Mode.parse(m) for m in args.mode)
    source = args.accept or ""
    results: list[VerifyResult] = []
    twin_notes: list[str] = []  # per result: the settings its twin took, or ran otherwise
    findings: list[list[FixTrial | None]] = []  # per result, per failure
    engines: list[dict[str, Any] | None] = []
    for t in p.targets:
        active = activated_engines()
        # batch parity by default for every dLLM implementation, built-in or module:attribute
        parity: ParityPolicy = "never" if t.family is Family.AR else parity_policy
        bar = Progress(f"verify {t.name}")
        twin, note = p.twin, ""
        if twin is not None and not args.twin_as_declared:
            twin, note = twin_for_target(twin, t)
        twin_notes.append(_twin_line(t.name, twin, note))
        # an engine's own prints (SGLang's radix tree when out of memory) stay off the table
        with implementation_stdout_to_stderr(), _twin_returns(args.twin):
            res = verify_implementation(
                t.name,
                t.implementation,
                args.examples,
                parity=parity,
                configs=mode_configs(t, modes),
                keep_going=args.keep_going,
                accepted=[(d, source) for d in p.accepted],
                progress=bar.examples(args.examples),
                fatal=(NotAnAdapter, CannotDrive),
                profile=profile_summary(t.implementation),
                call_timeout=args.call_timeout,
                twin=twin,
                seed=args.seed,
                loras=args.loras,
                drafts=args.drafts,
            )
            bar.done()
            with call_timeout_set(args.call_timeout):
                trials = known_fix_trials(t, res, p.accepted, twin)
        results.append(res)
        findings.append(trials)
        engines.append(release_driven(t.builtin, active, t.engines_loaded))
    print(render_table(results))
    for r, release in zip(results, engines, strict=True):
        if release is not None:  # the release checked, as the JSON's `engine` records it
            print(engine_line(r.impl, release))
    for line in filter(None, twin_notes):
        print(line)
    for r, trials, release in zip(results, findings, engines, strict=True):
        for f, trial in zip(r.failures, trials, strict=True):
            print(f"\n=== {r.impl}: violation of [{f.rule}]\n{f.message}\n--- program ---")
            print(f.program)
            if trial is not None:
                print("--- known fixes ---\n" + "\n".join(trial.lines()))
        if r.stopped.startswith(STOPPED_SHORT):
            print(f"\n{r.impl}: {r.stopped}")
        if args.twin is None and release is not None and release.get("scheduler_cls"):
            print(f"\n{r.impl}: {own_class_note(release, r.impl)}")
        if r.golden_ties:
            print(f"\n{r.impl}: {golden_ties_note(r)}")
        ignored = bool(args.keep_going and r.failures)
        if r.accepted or ignored:
            print(f"\n{r.impl}: {cut_short_note(r, ignored)}")
    payload = to_json(results, engines)
    write_json(args.json, payload)
    if args.report:
        write_report(Path(args.report), results, payload)
    return 0 if all(r.passed for r in results) else 1


#: Per Vidur built-in, its decision twin and what that twin decides as: only Sarathi's decides
#: as the release as it ships; the others' as the release with its findings' fixes applied
#: (`scripts/engine_fixes_diff.py vidur`), or idealised where a finding is declared (LightLLM).
VIDUR_TWIN_OF = {
    "real-vidur-sarathi": ("vidur-sarathi-released", True),
    "real-vidur-vllm": ("vidur-vllm-released", False),
    "real-vidur-orca": ("vidur-orca", False),
    "real-vidur-ft": ("vidur-ft", False),
    "real-vidur-lightllm": ("vidur-lightllm", False),
    "real-vidur-mnemosyne": ("vidur-mnemosyne", False),
}


def own_class_note(release: dict[str, Any], impl: str = "") -> str:
    """Said of a run of the user's own scheduler class without `--twin`: the rules bound what
    an engine may do, not what it decides where several choices are allowed; and which twin
    compares the class's decisions with what (`VIDUR_TWIN_OF` for Vidur's built-ins)."""
    stock = STOCK_TWINS.get(str(release.get("name")))
    compare = f"; {stock} compares its decisions with the stock release's, step by step"
    if impl in VIDUR_TWIN_OF:
        twin, as_shipped = VIDUR_TWIN_OF[impl]
        if twin == "vidur-mnemosyne" and release.get("version") == "0.0.25":
            twin = "vidur-mnemosyne-one-queue"  # 0.0.25's Mnemosyne keeps one queue
        compare = (
            f"; --twin {twin} compares its decisions with the stock release's, step by step"
            if as_shipped
            else f"; --twin {twin} compares its decisions, step by step, with the release's "
            "once its findings are fixed (scripts/engine_fixes_diff.py vidur), so run it on "
            "an install with that patch applied (docs/engines/vidur.md, a patched install): "
            "on the release as it ships a class that changes nothing differs from it at the "
            "first finding"
        )
    return (
        f"the rules check what {release['scheduler_cls']} must never do, not that it decides as "
        "the stock scheduler where the rules allow either (a class that never batches a second "
        f"request passes them){compare if stock else ''}"
    )


def golden_ties_note(result: VerifyResult) -> str:
    """Said of a run whose golden mismatches the adapter explained as float ties taken the
    other way (`spec.golden.DecodesPastGoldenTies`): they passed, so how many, and the first."""
    n = result.golden_ties
    return (
        f"{n} golden mismatch{'' if n == 1 else 'es'} agreed once float ties were taken the "
        f"other way, as the adapter's golden_output_past_ties explained (the first: "
        f"{result.first_golden_tie})"
    )


def cut_short_note(result: VerifyResult, ignored: bool) -> str:
    """What an accepted rule, or a campaign's rule ignored once found (`ignored`), costs: each
    hit ends the example it is hit in, so what the example would have done next is unchecked."""
    hits = sum(int(a["hits"]) for a in result.accepted)
    parts = [f"{hits} hit{'' if hits == 1 else 's'} of an accepted rule"] if hits else []
    if ignored:
        parts.append("each hit of a failure's rule once the campaign ignored it")
    return (
        f"{' and '.join(parts) or 'a hit of an accepted rule'} ended the example it was in (the "
        "spec cannot follow an implementation past a rule it broke), so what those examples "
        "would have done next went unchecked: a bug reachable only after such a hit shows once "
        "that rule is fixed and no longer accepted or ignored"
    )


#: How a campaign says it stopped short of its examples for a reason that is no failure (the
#: adapter could not drive the implementation further, the twin hung), after failures found.
STOPPED_SHORT = ("it could not be driven further", "it could not be checked further")


@contextlib.contextmanager
def _twin_returns(twin: str | None) -> Iterator[None]:
    """A decision twin that hangs before anything was found is a bad `--twin` (exit 2, one
    line), as `check-trace` says it: not a failure of the implementation's."""
    try:
        yield
    except TwinHung as hang:
        raise ConfigError("--twin", twin, f"a twin that returns ({hang})") from None


#: The fields of a dLLM policy that decide whom a round admits and in which order: a twin that
#: declares other values than the implementation makes other decisions by design.
DECISION_FIELDS = (
    "admission",
    "priority_order",
    "longest_output_first",
    "free_queue_order",
    "work_conserving",
    "rows_released_between_rounds",
)


def twin_policy_gap(twin: Twin | None, target: Resolved) -> str:
    """How `twin`'s declared dLLM policy differs from `target`'s in `DECISION_FIELDS`, in words
    (`admission: fcfs, the implementation prefill-first`); "" when alike or not declared."""
    if not isinstance(twin, DllmTwin) or twin.profile is None:
        return ""
    profile = target.implementation.profile
    if not isinstance(profile, DllmProfile):
        return ""
    gaps = []
    for name in DECISION_FIELDS:
        theirs, ours = getattr(twin.profile.policy, name), getattr(profile.policy, name)
        if theirs != ours:
            gaps.append(f"{name}: {_value(theirs)}, the implementation {_value(ours)}")
    return "; ".join(gaps)


def _value(value: object) -> str:
    return str(getattr(value, "value", value))


def _twin_line(impl: str, twin: Twin | None, note: str) -> str:
    """What the run says of `impl`'s twin below the table: the settings it took from `impl`,
    or the note that it runs others; "" when neither."""
    if note:
        return f"{impl}: note: {note}"
    if isinstance(twin, ArTwin) and twin.took:
        return f"{impl}: its twin {twin.described()}, the settings {impl} declares"
    return ""


def known_fix_trials(
    target: Resolved,
    result: VerifyResult,
    accepted: Sequence[AcceptedDeviation] = (),
    twin: Twin | None = None,
) -> list[FixTrial | None]:
    """Each failure of a real engine's built-in that names known fixes, run again as it is and
    under the smallest sets of those fixes, holding one whose finding breaks its rule, under
    which it passes (`schedspec_cli.known_fixes`); recorded in the failure's JSON
    (`known_fixes`). A fixed run that breaks a rule the campaign accepted (the profile's
    deviations, `accepted` from `--accept`) stops there and is said to (`accepted_stops`).
    A `twin_decisions` failure against a `twin` that declares another order or admission than
    the implementation is not tried: it says so (`twin_differs`). None for a failure with
    nothing tried."""
    builtin = target.builtin or _builtin_at(target.target)
    if builtin is None or not builtin.known_fixes:
        return [None] * len(result.failures)
    gap = twin_policy_gap(twin, target)
    # the registry's own import string: a callable from the built-in's name to its fixes
    fixes = cast(Callable[[str], Sequence[KnownFix]], load_object(builtin.known_fixes, "impl"))
    factory: Any = target.implementation.factory
    known = fixes(builtin.name)
    deviations = (*target.implementation.profile.deviations, *accepted)
    rules = frozenset(str(d.rule) for d in deviations)
    trials: list[FixTrial | None] = []
    for i, failure in enumerate(result.failures):
        trial: FixTrial | None
        if gap and failure.rule == "twin_decisions":
            trial = FixTrial(failure.rule, (), twin_differs=gap)
        else:
            trial = _tried(failure, factory, known, rules)
        trials.append(trial)
        if trial is not None:
            result.failures[i] = dataclasses.replace(failure, known_fixes=trial.to_json())
    return trials


def _tried(
    failure: Failure, factory: Any, known: Sequence[KnownFix], rules: frozenset[str]
) -> FixTrial | None:
    """`try_known_fixes`, and what it raised is said on stderr instead (the failure itself is
    reported whatever happens here)."""
    try:
        return try_known_fixes(failure, factory, known, rules)
    except (Exception, CallDeadlineExceeded) as err:  # a courtesy: the failure is reported
        print(
            f"schedspec: the known fixes could not be tried on [{failure.rule}]: "
            f"{describe_raised(err)}",
            file=sys.stderr,
        )
        return None


def _builtin_at(target: str) -> Builtin | None:
    """The built-in a `module:attribute` target names by its own import string
    (`integrations.sglang:REAL_SGLANG_DLLM_UNDER_PRESSURE`), if any."""
    return next((b for b in BUILTINS.values() if target in b.targets), None)


def render_table(results: list[VerifyResult]) -> str:
    """One row per implementation; a `twin` column only when a decision twin was used, a
    `seed` column only when `--seed` was given."""
    with_twin = any(r.twin for r in results)
    with_seed = any(r.seed is not None for r in results)
    rows: list[tuple[object, ...]] = []
    for r in results:
        accepted = ", ".join(f"{a['rule']} ({a['hits']} hits)" for a in r.accepted)
        row: tuple[object, ...] = (
            r.impl,
            r.family,
            "PASS" if r.passed else "FAIL",
            r.examples,
            r.steps,
            f"{r.seconds:.1f}",
            ", ".join(r.rules) or "-",
            accepted or "-",
        )
        row += (r.twin or "-",) if with_twin else ()
        rows.append(row + ((r.seed,) if with_seed else ()))
    header: tuple[str, ...] = ("impl", "family", "result", "examples", "steps", "seconds")
    header += ("rules violated", "accepted")
    header += (("twin",) if with_twin else ()) + (("seed",) if with_seed else ())
    return table(header, rows)


def to_json(
    results: list[VerifyResult], engines: list[dict[str, Any] | None] | None = None
) -> dict[str, Any]:
    """The `--json` payload: one result's JSON, or `passed` and `results` for several; each
    result of a real engine's built-in with `engine` (its name and the release checked, from
    `engines`, in `results`' order); the run's metadata (no device) under `run`."""
    each = [r.to_json() for r in results]
    for result, engine in zip(each, engines or [None] * len(each), strict=True):
        if engine is not None:
            result["engine"] = engine
    payload: dict[str, Any]
    if len(each) == 1:
        payload = each[0]
    else:
        payload = {"passed": all(r.passed for r in results), "results": each}
    payload["run"] = meta.run_metadata(with_device=False)
    return payload


def write_report(out: Path, results: list[VerifyResult], payload: dict[str, Any]) -> None:
    """Write `payload` as report.json and report.md (a row per implementation, the twins and
    seeds used, each failure, the run metadata) into `out`, created if missing."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "report.json", payload)
    lines = [
        "# schedspec verify report",
        "",
        "| impl | family | profile | result | examples | rules violated | accepted |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        accepted = ", ".join(f"{a['rule']} ({a['hits']} hits)" for a in r.accepted) or "-"
        lines.append(
            f"| {r.impl} | {r.family} | {r.profile or '-'} | {'PASS' if r.passed else 'FAIL'} "
            f"| {r.examples} | {', '.join(r.rules) or '-'} | {accepted} |"
        )
    twins = sorted({r.twin for r in results if r.twin})
    if twins:
        lines += ["", f"Decision twin (rule `twin_decisions`): {', '.join(twins)}"]
    seeds = sorted({r.seed for r in results if r.seed is not None})
    if seeds:
        lines += ["", f"Programs drawn from seed {', '.join(map(str, seeds))} (`--seed`)"]
    lines.append("")
    lines.append(failures_markdown([r.to_json() for r in results]))
    lines.append(meta.markdown(payload["run"]))
    (out / "report.md").write_text("\n".join(lines), encoding="utf-8")


def failures_markdown(results: list[dict[str, Any]]) -> str:
    """One section per violated rule, grouped by rule, each with its own counterexample."""
    by_rule: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for r in results:
        for f in r.get("failures", []):
            by_rule.setdefault(f["rule"], []).append((r["impl"], f))
    lines: list[str] = []
    for rule, items in by_rule.items():
        lines += ["", f"## [{rule}]"]
        for impl, f in items:
            lines += ["", f"### {impl}: [{rule}]", "", "```text", f["message"], "", f["program"]]
            lines += ["```"]
            trial: dict[str, Any] = f.get("known_fixes") or {}
            verdict: list[str] = trial.get("verdict", [])
            if verdict:  # the known fixes tried on it (`known_fixes`)
                lines += ["", "Known fixes:", "", *(f"- {line}" for line in verdict)]
    return "\n".join(lines) + "\n"


__all__ = ["add_arguments", "plan", "run"]
