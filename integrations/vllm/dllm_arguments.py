"""The options of the diffusion check scripts that say how a program is drawn and which candidate
fixes vLLM runs with.

`scripts/vllm_dllm_check.py` (a sweep over generated programs) and `scripts/vllm_dllm_shrink.py`
(one failing program, shrunk) take the same options, so a failure a sweep reports is shrunk
under the very options it was found with. `add_dllm_arguments` adds them to a parser,
`dllm_generator` draws program `seed` as they say, `fix_names` gives the fixes by name
(`integrations.vllm.fixes.DLLM_FIX_ORDER`), and `describe_space` / `describe_fixes` say them in
words.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import asdict, replace
from functools import partial
from typing import Any

from integrations.vllm.admission_arguments import add_admission_arguments, admission_of
from integrations.vllm.admission_knobs import AdmissionKnobs
from integrations.vllm.async_hold_fixes import MODEL_LEN_HOLD, READ_ONLY_HOLD
from integrations.vllm.cache_aware_arguments import (
    add_cache_aware_arguments,
    check_cache_aware_setting,
)
from integrations.vllm.diffusion import DllmProgram, dllm_program
from integrations.vllm.pauses import PAUSE_MODES
from integrations.vllm.whole_canvas_fix import WHOLE_CANVAS

#: (flag, fix name, the fix in words, help), in `DLLM_FIX_ORDER`'s order.
FIX_FLAGS = (
    (
        "--read-only-hold-fix",
        READ_ONLY_HOLD,
        "the read-only hold fix",
        "a read-only request is held once its step cap is scheduled",
    ),
    (
        "--model-len-hold-fix",
        MODEL_LEN_HOLD,
        "the model-len hold fix",
        "near max_model_len a request waits for its canvas step in flight",
    ),
    (
        "--whole-canvas-fix",
        WHOLE_CANVAS,
        "the whole-canvas fix",
        "a canvas is scheduled whole or not at all",
    ),
)
#: (flag, `dllm_program` keyword, help): where the programs are drawn.
SPACE_FLAGS = (
    (
        "--budget-binds",
        "budget_binds",
        "draw a token budget that binds (below every seat's canvas)",
    ),
    ("--reach-model-len", "reach_model_len", "draw requests that may run into max_model_len"),
    (
        "--prefix-caching",
        "prefix_caching",
        "prefix caching on, half the prompts prefixes of one shared prompt",
    ),
    ("--priority", "priority_policy", "vLLM's priority policy, each request a priority in 0..2"),
)


def _attr(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


def add_dllm_arguments(parser: argparse.ArgumentParser) -> None:
    """The program space's flags, `--kv-events`, and one flag per candidate fix."""
    for flag, _, help_text in SPACE_FLAGS:
        parser.add_argument(flag, action="store_true", help=help_text)
    parser.add_argument(
        "--kv-events",
        action="store_true",
        help="serve with vLLM's KV cache events on, read as a router reads them and checked "
        "after each update_from_output (kv_events)",
    )
    parser.add_argument(
        "--loras",
        type=_count(0),
        default=0,
        metavar="N",
        help="serve N LoRA adapters (request i runs adapter i mod (N + 1), 0 the base model) and "
        "check max_loras (default 0: none)",
    )
    parser.add_argument(
        "--max-loras",
        type=_count(1),
        default=1,
        metavar="M",
        help="with --loras: at most M adapters at once (vLLM's max_loras; default 1)",
    )
    parser.add_argument(
        "--pauses",
        choices=PAUSE_MODES,
        default=None,
        metavar="MODE",
        help="pause generation before one engine step in 16 in this mode of vLLM's "
        f"pause_scheduler ({', '.join(PAUSE_MODES)}), clear the caches once idle and resume "
        "(pause)",
    )
    add_admission_arguments(parser)
    add_cache_aware_arguments(parser, "with --prefix-caching under FCFS")
    for flag, _, _, help_text in FIX_FLAGS:
        parser.add_argument(
            flag, action="store_true", help=f"run vLLM with the candidate fix: {help_text}"
        )


def _count(least: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = least - 1
        if value < least:
            raise argparse.ArgumentTypeError(f"{text!r}: an integer >= {least}")
        return value

    return parse


def check_dllm_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A usage error (exit 2, one line) for `--max-loras` without `--loras`, a bad admission
    setting, or `--cache-aware-window` without prefix caching under FCFS, with a bad threshold,
    or on a release without it."""
    if args.max_loras != 1 and not args.loras:
        parser.error("--max-loras: only with --loras")
    admission_of(args, parser)
    if args.cache_aware_window and (not args.prefix_caching or args.priority):
        parser.error(
            "--cache-aware-window: with --prefix-caching, not --priority (vLLM applies the window "
            "under FCFS with prefix caching only)"
        )
    check_cache_aware_setting(args, parser)


def space(args: argparse.Namespace) -> dict[str, bool]:
    """The `dllm_program` keywords the flags set."""
    return {keyword: bool(getattr(args, _attr(flag))) for flag, keyword, _ in SPACE_FLAGS}


def dllm_generator(args: argparse.Namespace) -> Callable[[int], DllmProgram]:
    """Program `seed` of the space the flags choose (`dllm_program(seed, ...)`), served with
    KV cache events on with `--kv-events`, LoRA adapters with `--loras`, pauses with
    `--pauses`, and vLLM's admission settings as their flags say."""
    draw: Callable[[int], DllmProgram] = partial(dllm_program, **space(args))
    serving: dict[str, Any] = {"kv_events": True} if args.kv_events else {}
    admission = AdmissionKnobs.of(args)
    if admission.any:
        serving.update(asdict(admission))
    if args.loras:
        serving.update(loras=args.loras, max_loras=args.max_loras)
    if args.pauses is not None:
        serving["pauses"] = args.pauses
    if args.cache_aware_window:
        serving.update(
            cache_aware_window=args.cache_aware_window,
            cache_aware_threshold=args.cache_aware_threshold,
        )
    if not serving:
        return draw

    def served(seed: int) -> DllmProgram:
        program = draw(seed)
        return replace(program, serving=replace(program.serving, **serving))

    return served


def fix_names(args: argparse.Namespace) -> list[str]:
    """The fixes the flags ask for, by name, in the order they are made."""
    return [name for flag, name, _, _ in FIX_FLAGS if getattr(args, _attr(flag))]


def fix_fields(args: argparse.Namespace) -> dict[str, bool]:
    """Each fix flag's attribute and whether it is set (what a sweep's JSON records)."""
    return {_attr(flag): bool(getattr(args, _attr(flag))) for flag, _, _, _ in FIX_FLAGS}


def space_flags(drawn: dict[str, bool]) -> list[str]:
    """The flags that draw programs as `drawn` (`space`'s keywords) says."""
    return [flag for flag, keyword, _ in SPACE_FLAGS if drawn.get(keyword)]


def fix_flags(names: list[str]) -> list[str]:
    """The flags that make the named fixes."""
    return [flag for flag, name, _, _ in FIX_FLAGS if name in names]


def describe_space(args: argparse.Namespace) -> str:
    """Where the programs are drawn, in words."""
    text = "token budget binds" if args.budget_binds else "token budget never binds"
    if args.reach_model_len:
        text += ", requests may reach max_model_len"
    return text


def describe_fixes(args: argparse.Namespace) -> str:
    """What vLLM runs with, in words: its fixes, prefix caching, the policy."""
    named = " and ".join(words for flag, _, words, _ in FIX_FLAGS if getattr(args, _attr(flag)))
    text = f"vLLM with {named}" if named else "vLLM as released"
    if args.prefix_caching:
        text += ", prefix caching on"
    if args.priority:
        text += ", priority policy"
    if args.kv_events:
        text += ", KV cache events checked"
    if args.loras:
        text += f", {args.loras} LoRA adapters, at most {args.max_loras} running"
    if args.pauses is not None:
        text += f", generation paused (mode {args.pauses})"
    if args.cache_aware_window:
        text += (
            f", cache-aware admission (window {args.cache_aware_window}, usage >= "
            f"{args.cache_aware_threshold:g})"
        )
    for phrase in AdmissionKnobs.of(args).phrases():
        text += f", {phrase}"
    return text


__all__ = [
    "FIX_FLAGS",
    "SPACE_FLAGS",
    "add_dllm_arguments",
    "check_dllm_arguments",
    "describe_fixes",
    "describe_space",
    "dllm_generator",
    "fix_fields",
    "fix_flags",
    "fix_names",
    "space",
    "space_flags",
]
