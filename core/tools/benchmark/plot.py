"""Optional bar chart of a benchmark (needs matplotlib: ``pip install onnxep[plot]``)."""

from __future__ import annotations

from typing import Any


def plot_result(result: Any, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise RuntimeError("--plot needs matplotlib: pip install 'onnxep[plot]'") from exc
    names = list(result.summary)
    if result.mode == "decode":
        values = [1000.0 / result.summary[n]["median_ms"] for n in names]
        label = "tokens per second (median step)"
    else:
        values = [result.summary[n]["median_ms"] for n in names]
        label = "median latency (ms)"
    fig, ax = plt.subplots(figsize=(6, 0.6 * len(names) + 1.5))
    ax.barh(names, values, color=["#2a7" if n == "onnxep" else "#888" for n in names])
    ax.set_xlabel(label)
    ax.set_title(result.model.rsplit("/", 1)[-1])
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:.2f}", va="center")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
