"""PNG plots for reports: Gantt chart of forwards per request, KV occupancy, rounds per block.

matplotlib (the `plots` extra) is imported lazily with the non-interactive Agg backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from schedspec_cli.loader import MissingDependency, module_available
from schedspec_cli.timeline import Timeline

PLOTS_EXTRA = "pip install 'schedspec[plots]'"


def require_matplotlib(field: str, value: object) -> None:
    """Raise `MissingDependency` (exit 2, one line naming the extra) unless matplotlib is installed:
    what a command that writes PNG plots checks before it runs anything."""
    if not module_available("matplotlib"):
        raise MissingDependency(
            field, "matplotlib to write its PNG plots", f"the plots extra, {PLOTS_EXTRA}"
        )


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def gantt(timelines: Mapping[str, Timeline], path: Path, title: str) -> Path:
    """One panel per run: a bar per request from its first forward to the forward at which it
    finished (x axis: forward index, i.e. time at a constant forward cost)."""
    plt = _pyplot()
    fig, axes = plt.subplots(
        len(timelines), 1, figsize=(9, 1.2 + 1.0 * len(timelines) * 2), sharex=True, squeeze=False
    )
    for ax, (label, tl) in zip(axes[:, 0], timelines.items(), strict=True):
        spans = [s for s in tl.spans if s.first_forward is not None]
        for i, s in enumerate(spans):
            start = s.first_forward or 0
            end = s.finished_forward if s.finished_forward is not None else tl.forwards
            ax.barh(
                i,
                start - s.submitted_forward,
                left=s.submitted_forward,
                color="#dddddd",
                edgecolor="none",
            )
            ax.barh(i, end - start, left=start, color="#4477aa")
            busy = [f for f, ids in enumerate(tl.rows_per_forward) if s.request_id in ids]
            ax.plot([b + 0.5 for b in busy], [i] * len(busy), "|", color="white", ms=6)
        ax.set_yticks(range(len(spans)), [s.request_id for s in spans])
        ax.set_title(
            f"{label}: {tl.forwards} forwards, {tl.rounds} rounds, "
            f"{tl.wasted_row_steps} wasted row-steps",
            fontsize=9,
        )
        ax.invert_yaxis()
    axes[-1, 0].set_xlabel("forward index (grey: queued, blue: in the batch until finished)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def kv_occupancy(timelines: Mapping[str, Timeline], total_slots: int, path: Path) -> Path:
    """A step line per run of the KV slots owned after each forward, with the pool size
    `total_slots` dashed; saved as a PNG at `path`, which is returned."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 3.2))
    for label, tl in timelines.items():
        ax.step(
            range(len(tl.kv_owned_after_forward)),
            tl.kv_owned_after_forward,
            where="post",
            label=label,
        )
    ax.axhline(total_slots, color="grey", ls="--", lw=1, label="pool size")
    ax.set_xlabel("forward index")
    ax.set_ylabel("KV slots owned")
    ax.legend(fontsize=8)
    ax.set_title("KV occupancy over time")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def rounds_histogram(hists: Mapping[str, Mapping[int, int]], path: Path, title: str) -> Path:
    """Bars of blocks per rounds-per-block count (label -> rounds -> blocks), the labels side
    by side; saved as a PNG at `path`, which is returned."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.2))
    width = 0.8 / max(1, len(hists))
    for j, (label, h) in enumerate(hists.items()):
        xs = sorted(h)
        ax.bar([x + j * width for x in xs], [h[x] for x in xs], width=width, label=label)
    ax.set_xlabel("rounds (forwards) per output block, including the final-KV forward")
    ax.set_ylabel("blocks")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
