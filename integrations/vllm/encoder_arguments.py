"""The engine-core check scripts' multimodal options (`--mm-items` and the encoder settings
beside it): `add_encoder_arguments` adds them to a parser, `encoder_of` checks them (a usage
error, exit 2, for a value or combination that makes no sense) and builds the
`EncoderOptions` (`integrations.vllm.encoder_inputs`), `describe_encoder` says them in words.
"""

from __future__ import annotations

import argparse

from integrations.vllm.encoder_inputs import EncoderOptions
from spec.errors import ConfigError

#: The options' defaults (`--mm-tokens` is given only where it differs).
DEFAULTS = EncoderOptions()


def add_encoder_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `--mm-items`, `--mm-tokens`, `--encoder-budget`, `--encoder-cache`,
    `--no-chunked-mm-input` and `--encoder-offload` to `parser`."""
    parser.add_argument(
        "--mm-items",
        type=int,
        default=0,
        metavar="N",
        help="give every prompt up to N multimodal items (images named by their placeholder "
        "tokens) and check vLLM's encoder scheduling and encoder cache (default 0: text only)",
    )
    parser.add_argument(
        "--mm-tokens",
        type=int,
        default=DEFAULTS.item_tokens,
        metavar="L",
        help="with --mm-items: placeholder tokens (and encoder embeddings) per item "
        f"(default {DEFAULTS.item_tokens})",
    )
    parser.add_argument(
        "--encoder-budget",
        type=int,
        default=None,
        metavar="E",
        help="with --mm-items: vLLM's max_num_encoder_input_tokens (default: its own, "
        "max_num_batched_tokens; raised to one item)",
    )
    parser.add_argument(
        "--encoder-cache",
        type=int,
        default=None,
        metavar="E",
        help="with --mm-items: vLLM's encoder_cache_size in embeddings (default: its own, "
        "max_num_batched_tokens; raised to one item)",
    )
    parser.add_argument(
        "--no-chunked-mm-input",
        action="store_true",
        help="with --mm-items: vLLM's disable_chunked_mm_input (a step covers an item whole)",
    )
    parser.add_argument(
        "--encoder-offload",
        type=int,
        default=None,
        metavar="E",
        help="with --mm-items: vLLM's CPU encoder-cache offload (ECCPUConnector, role "
        "ec_both) with a region of E embeddings, and check its saves and loads",
    )


def encoder_of(args: argparse.Namespace, parser: argparse.ArgumentParser) -> EncoderOptions | None:
    """The `EncoderOptions` `args` ask for (None without `--mm-items`); `parser.error` (exit 2)
    for a bad value or an encoder setting without `--mm-items`."""
    if args.mm_items < 0:
        parser.error("--mm-items: an int >= 0")
    if not args.mm_items:
        given = [
            flag
            for flag, set_ in (
                ("--mm-tokens", args.mm_tokens != DEFAULTS.item_tokens),
                ("--encoder-budget", args.encoder_budget is not None),
                ("--encoder-cache", args.encoder_cache is not None),
                ("--no-chunked-mm-input", args.no_chunked_mm_input),
                ("--encoder-offload", args.encoder_offload is not None),
            )
            if set_
        ]
        if given:
            parser.error(f"{', '.join(given)}: only with --mm-items")
        return None
    try:
        return _options(args)
    except ConfigError as err:
        parser.error(f"--mm-items and its encoder settings: {err}")


def _options(args: argparse.Namespace) -> EncoderOptions:
    """`args`' multimodal options as `EncoderOptions` (`ConfigError` for a bad value)."""
    return EncoderOptions(
        items=args.mm_items,
        item_tokens=args.mm_tokens,
        budget=args.encoder_budget,
        cache=args.encoder_cache,
        chunked=not args.no_chunked_mm_input,
        offload_blocks=args.encoder_offload,
    )


def describe_encoder(args: argparse.Namespace) -> str:
    """The multimodal options of `args` (checked by `encoder_of`) in words, after "; " (empty
    without `--mm-items`)."""
    return f"; {_options(args).describe()}" if args.mm_items else ""


__all__ = ["add_encoder_arguments", "describe_encoder", "encoder_of"]
