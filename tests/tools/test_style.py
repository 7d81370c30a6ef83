"""The figures' legibility record: what the site test reads back from every PNG."""

from __future__ import annotations

import random

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from kernels.tools import style  # noqa: E402


def test_record_holds_the_smallest_font_and_bare_heatmaps():
    style.apply()
    size = round(random.uniform(5.0, 14.0), 1)
    fig, (left, right) = plt.subplots(1, 2)
    left.plot(np.random.rand(5))
    left.set_title("title", fontsize=size)
    right.imshow(np.random.rand(4, 4))
    record = style.read_record(style.png_with_record(fig))
    assert float(record[style.PNG_KEY_FONT]) == min(
        size, float(style.RC["xtick.labelsize"]), float(style.RC["ytick.labelsize"])
    )
    assert record[style.PNG_KEY_NO_COLORBAR] == "1"
    fig.colorbar(right.images[0], ax=right)
    assert style.read_record(style.png_with_record(fig))[style.PNG_KEY_NO_COLORBAR] == "0"
    # a second heatmap on the same scale shares the bar; one on another scale does not
    left.imshow(
        np.random.rand(3, 3), vmin=right.images[0].get_clim()[0], vmax=right.images[0].get_clim()[1]
    )
    assert style.heatmaps_without_colorbar(fig) == 0
    left.images[0].set_clim(-5, 5)
    assert style.heatmaps_without_colorbar(fig) == 1
    plt.close(fig)


def test_hidden_text_does_not_count():
    fig, ax = plt.subplots()
    ax.text(0.5, 0.5, "tiny", fontsize=3).set_visible(False)
    ax.text(0.5, 0.2, "", fontsize=2)
    assert style.smallest_font_pt(fig) >= style.MIN_FONT_PT
    plt.close(fig)


def test_the_book_defaults_are_legible_at_column_width():
    style.apply()
    assert (
        min(v for k, v in style.RC.items() if k.endswith("size") and k != "figure.figsize")
        >= style.MIN_FONT_PT
    )
    # A default-width figure shown at a 730 px column keeps 9 pt text at >= 12 CSS px ...
    assert style.rendered_font_px(9, style.DPI, 730, style.WIDTH_IN * style.DPI) >= 12
    # ... a 14-inch figure squeezed into the same column does not.
    assert style.rendered_font_px(9, style.DPI, 730, 14 * style.DPI) < 12


def test_a_png_without_a_record_reads_empty():
    import io

    fig, ax = plt.subplots()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    assert style.PNG_KEY_FONT not in style.read_record(buffer.getvalue())
    plt.close(fig)


def test_notebook_figures_carry_the_record():
    """In a real kernel, a figure made two cells after setup() still carries the record (the
    inline backend re-registers its own formatter; ours must win when figures are shown)."""
    import base64

    import nbclient
    import nbformat

    from kernels.env import REPO_ROOT

    size = round(random.uniform(9.5, 12.0), 1)
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            f"import sys; sys.path.insert(0, {str(REPO_ROOT)!r})\n"
            "import kernels; kernels.setup(quiet=True)\n"
            "import matplotlib.pyplot as plt"
        ),
        # shown at once by plt.show(), in the first cell after the backend was loaded
        nbformat.v4.new_code_cell(
            "fig, ax = plt.subplots(); ax.plot([1, 2])\n"
            f"ax.tick_params(labelsize={size}); plt.show()"
        ),
        # shown by the backend when the cell ends
        nbformat.v4.new_code_cell(
            f"fig, ax = plt.subplots(); ax.plot([1, 2])\nax.tick_params(labelsize={size})"
        ),
    ]
    nbclient.NotebookClient(nb, timeout=120).execute()
    for cell in nb.cells[1:]:
        pngs = [o["data"]["image/png"] for o in cell.outputs if "image/png" in o.get("data", {})]
        assert len(pngs) == 1
        assert float(style.read_record(base64.b64decode(pngs[0]))[style.PNG_KEY_FONT]) == size


def test_a_bar_chart_whose_value_axis_misses_zero_is_recorded():
    fig, (vertical, horizontal) = plt.subplots(1, 2)
    vertical.bar(["a", "b"], [0.98, 1.02])
    horizontal.barh(["a", "b"], [5.0, 6.0])
    assert style.read_record(style.png_with_record(fig))[style.PNG_KEY_BARS_OFF_ZERO] == "0"
    vertical.set_ylim(0.95, 1.05)  # the seeded fault: a 4 % difference drawn as a 3x one
    assert style.read_record(style.png_with_record(fig))[style.PNG_KEY_BARS_OFF_ZERO] == "1"
    horizontal.set_xscale("log")  # on a log axis a bar has no base at all
    assert style.bar_axes_not_from_zero(fig) == 2
    vertical.set_ylim(-1, 2)
    horizontal.set_xscale("linear")
    horizontal.set_xlim(-3, 0)  # negative bars end at 0 from the other side: fine
    assert style.bar_axes_not_from_zero(fig) == 0
    plt.close(fig)


def test_overlapping_texts_are_recorded():
    style.apply()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    ax.set_xlabel("step")
    ax.text(0.1, 0.8, "first note")
    record = style.read_record(style.png_with_record(fig))
    assert record[style.PNG_KEY_OVERLAPS] == "0", record
    ax.text(0.12, 0.8, "second note")  # the seeded fault: printed over the first
    record = style.read_record(style.png_with_record(fig))
    assert record[style.PNG_KEY_OVERLAPS] == "1", record
    assert "first note / second note" in record[style.PNG_KEY_OVERLAP_TEXTS]
    ax.set_title("‖W_Q‖ β")  # non-Latin-1 text still fits the PNG's text chunk
    assert style.read_record(style.png_with_record(fig))[style.PNG_KEY_OVERLAPS] == "1"
    plt.close(fig)


def test_tick_labels_outside_the_view_are_not_text():
    """An axis keeps labels for ticks past its limits; they are not drawn and overlap nothing."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(6.8, 3))
    left.plot(np.linspace(-0.55, 0.55, 5), [1e-3, 1, 10, 1, 1e-3])
    left.set_yscale("log")
    right.plot([0, 40_000], [0, 1])
    right.set_xlim(-2_000, 35_000)
    assert style.read_record(style.png_with_record(fig))[style.PNG_KEY_OVERLAPS] == "0"
    plt.close(fig)


def test_legibility_problems_names_each_broken_rule():
    style.apply()
    fig, (left, right) = plt.subplots(1, 2, figsize=(style.WIDTH_IN, 3))
    left.bar([0, 1], [3.0, 4.0])
    right.plot(np.random.rand(5))
    assert style.legibility_problems(fig) == []
    small = round(random.uniform(4.0, style.MIN_FONT_PT - 0.5), 1)
    right.set_title("small", fontsize=small)
    left.set_ylim(2.0, 5.0)  # bars cut off at the bottom
    right.imshow(np.random.rand(4, 4))  # no colour bar
    fig.set_size_inches(style.WIDTH_IN + 1, 3)
    problems = style.legibility_problems(fig)
    assert len(problems) == 4, problems
    assert any(f"{small:.1f} pt" in p for p in problems)
    assert any("wide" in p for p in problems)
    assert any("colour bar" in p for p in problems)
    assert any("zero" in p for p in problems)
    plt.close(fig)


def test_figures_are_palette_pngs_that_keep_the_record_and_the_picture():
    """png_with_record saves 8-bit palette PNGs (the site's pages stay light): at most
    PNG_COLORS colours, the legibility record intact, and the picture nearly the same."""
    import io

    from PIL import Image

    style.apply()
    fig, ax = plt.subplots()
    for k in range(6):
        ax.plot(np.random.rand(40).cumsum(), "o-", label=f"series {k}")
    ax.legend()
    full = io.BytesIO()
    fig.canvas.draw()
    fig.savefig(full, format="png", dpi=style.DPI, bbox_inches="tight", facecolor="white")
    png = style.png_with_record(fig)
    plt.close(fig)
    image = Image.open(io.BytesIO(png))
    assert image.mode == "P" and len(image.getcolors(1024)) <= style.PNG_COLORS
    assert style.read_record(png)[style.PNG_KEY_DPI] == str(style.DPI)
    assert len(png) < 0.6 * len(full.getvalue())
    before = np.asarray(Image.open(full).convert("RGB"), dtype=float)
    after = np.asarray(image.convert("RGB"), dtype=float)
    assert before.shape == after.shape and np.abs(before - after).mean() < 2.0
