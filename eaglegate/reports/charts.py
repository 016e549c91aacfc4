"""The charts `eaglegate calibrate` draws: a text chart for the terminal and a PNG.

Drawing is reporting; the curves, the calibration and the rows to show come from
`eaglegate.live.calibrate`, handed over by the application layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from eaglegate.errors import UserError

if TYPE_CHECKING:  # the types it draws, handed to it (docs/architecture.md, "Layers")
    from eaglegate.live.calibrate import Calibration, Curve


def render_text_chart(rows: Sequence[dict[str, float]], width: int = 40) -> list[str]:
    """A plain-text chart: per level, both throughputs as bars and their ratio."""
    top = max(max(r["baseline"], r["spec"]) for r in rows) or 1.0
    lines = [f"{'conc':>6}  {'tok/s':>10}  {'':<{width}}  spec/base"]
    for r in rows:
        for name, key in (("base", "baseline"), ("spec", "spec")):
            bar = "█" * max(1, round(r[key] / top * width)) if r[key] > 0 else ""
            head = f"{r['concurrency']:>6g}" if key == "baseline" else " " * 6
            tail = f"  {r['ratio']:.2f}x" if key == "spec" else ""
            lines.append(f"{head}  {r[key]:>10.1f}  {name} {bar:<{width}}{tail}")
    return lines


def render_png(base: Curve, spec: Curve, cal: Calibration, path: str | Path, title: str = "") -> None:
    """Draw both throughput curves, the crossover and the hysteresis band to a PNG."""
    try:
        import matplotlib
        import matplotlib.ticker

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("--png needs matplotlib: pip install 'eaglegate[plot]'") from None
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    dense = len(base.points) > 24
    style = "-" if dense else "o-"
    for curve, color in ((base, "tab:gray"), (spec, "tab:blue")):
        xs, ys = zip(*curve.points, strict=True)
        ax.plot(xs, ys, style, color=color, label=curve.label, markersize=4)
    if cal.crossover is not None and cal.threshold is not None:
        ax.axvline(cal.crossover, color="tab:red", linestyle="--", linewidth=1,
                   label=f"crossover {cal.crossover:.1f} (threshold {cal.threshold})")
        if cal.resume_at:
            ax.axvspan(max(cal.resume_at, 1), cal.threshold, color="tab:red", alpha=0.08,
                       label=f"hysteresis {cal.hysteresis}")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _pos: f"{x:g}"))
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("output tokens/s")
    ax.set_title(title or "Speculative vs plain decode throughput")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(str(path))
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror}") from None
    finally:
        plt.close(fig)
