"""PNG charts of a queueing replay (matplotlib, Agg backend: the `charts` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway_control.scheduler.queueing.runs import QueueResult


def pyplot() -> Any:
    """matplotlib's pyplot, drawing into files only; a one-line exit naming the extra to
    install when matplotlib is not installed (it is not the server's)."""
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise SystemExit(
            "charts need matplotlib: pip install 'inference-gateway[charts]'"
        ) from None
    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    return plt


def write_plots(result: QueueResult, directory: str | Path) -> list[Path]:
    """Write utilization.png (allocated, fragmented and down GPU over time) and
    queueing_cdf.png (queueing-time CDF per tenant) into `directory`; returns the paths."""
    plt = pyplot()

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    series = result.metrics["series"]
    hours = [t / 3600.0 for t in series["t_s"]]

    fig, ax = plt.subplots(figsize=(9, 4))
    ax.plot(hours, series["allocated_gpu_pct"], label="allocated")
    ax.plot(hours, series["fragmented_gpu_pct"], label="fragmented (of capacity)")
    ax.plot(hours, series["down_gpu_pct"], label="on failed nodes")
    ax.set_xlabel("time (hours)")
    ax.set_ylabel("% of cluster GPU")
    ax.set_title(f"GPU over time, policy {result.metrics['policy']}")
    ax.legend()
    ax.grid(alpha=0.3)
    utilization = out / "utilization.png"
    fig.tight_layout()
    fig.savefig(utilization, dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    for tenant, waits in sorted(result.waits_by_tenant.items()):
        if not waits:
            continue
        ordered = sorted(max(w, 1.0) for w in waits)  # log axis: waits under 1 s shown at 1 s
        ax.step(
            ordered,
            [(i + 1) / len(ordered) for i in range(len(ordered))],
            where="post",
            label=tenant,
        )
    ax.set_xscale("log")
    ax.set_xlabel("queueing time (s, log; under 1 s drawn at 1 s)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("Queueing time CDF per tenant")
    ax.legend()
    ax.grid(alpha=0.3)
    cdf = out / "queueing_cdf.png"
    fig.tight_layout()
    fig.savefig(cdf, dpi=120)
    plt.close(fig)
    return [utilization, cdf]
