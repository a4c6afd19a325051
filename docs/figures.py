"""Draw the documentation's data-path figure: `python docs/figures.py` writes docs/data-path.png.

Kept beside the pages so the picture is redrawn, not edited, when the data path changes
(tests/unit/test_docs_site.py checks that it still draws).
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: draw to a file
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

OUT = Path(__file__).resolve().parent / "data-path.png"

KAFKA, PROCESS, STORE = "#fde9c9", "#d6e6f7", "#d9f0d3"
# name -> (x, y, width, height, colour, label)
BOXES = {
    "input": (0.2, 3.0, 2.0, 1.0, KAFKA, "input topic\n(chronos.input)"),
    "consumer": (3.4, 3.0, 2.2, 1.0, PROCESS, "consumer(s)\nchronos consumer"),
    "store": (7.9, 2.6, 2.6, 1.8, STORE, "PostgreSQL\nchronos_messages\n(waiting rows)"),
    "firer": (8.0, 0.2, 2.4, 1.0, PROCESS, "firer(s)\nchronos firer"),
    "detector": (12.2, 3.0, 2.4, 1.0, PROCESS, "detector(s)\nchronos detector"),
    "output": (3.4, 0.2, 2.2, 1.0, KAFKA, "output topic(s)\n(chronos.output,\nchronosTopic)"),
    "dlq": (0.2, 0.2, 2.0, 1.0, KAFKA, "dead-letter topic\n(chronos.dlq)"),
}
# (from, to, label, from side, to side, curvature)
ARROWS = [
    ("input", "consumer", "batches of\nmessages", "e", "w", 0.0),
    ("consumer", "store", "COPY (or INSERT ...\nON CONFLICT DO NOTHING)", "e", "w", 0.0),
    ("consumer", "output", "already due:\npublish now", "s", "n", 0.0),
    ("consumer", "dlq", "invalid:\nwith the reason", "sw", "ne", 0.0),
    ("store", "firer", "claim due rows: UPDATE ...\nRETURNING (SKIP LOCKED)", "s", "n", 0.0),
    ("firer", "output", "publish at the deadline;\ndelete once acknowledged", "w", "e", 0.0),
    ("detector", "store", "hand back rows held\npast the hold time", "w", "e", 0.0),
]


def _anchor(name: str, side: str) -> tuple[float, float]:
    x, y, w, h = BOXES[name][:4]
    dx = {"w": 0.0, "e": w}.get(side[-1], w / 2)
    dy = {"s": 0.0, "n": h}.get(side[0], h / 2)
    return x + dx, y + dy


def draw(out: Path = OUT) -> Path:
    """Draw the figure into `out` (a PNG)."""
    fig, ax = plt.subplots(figsize=(13, 4.6), dpi=100)
    ax.set_xlim(0, 14.8)
    ax.set_ylim(-0.1, 4.8)
    ax.axis("off")
    for x, y, w, h, colour, label in BOXES.values():
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.05", facecolor=colour, edgecolor="#555555"))
        ax.text(x + w / 2, y + h / 2, label, ha="center", va="center", fontsize=10)
    for start, end, label, side_a, side_b, rad in ARROWS:
        a, b = _anchor(start, side_a), _anchor(end, side_b)
        ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=14, color="#333333",
                                     connectionstyle=f"arc3,rad={rad}"))
        ax.text((a[0] + b[0]) / 2, (a[1] + b[1]) / 2 + 0.08, label, ha="center", va="bottom", fontsize=8,
                color="#333333", bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1})
    ax.text(7.4, 4.65, "The processes talk to each other only through PostgreSQL; each role scales by process count.",
            ha="center", fontsize=9, style="italic")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


if __name__ == "__main__":
    print(draw(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT))
