"""One look for every figure in the book, and a record that lets the site test check legibility.

The site shows a figure at most as wide as its text column (676 CSS px at a 1280 px window).
A font of ``s`` points in a figure saved at ``dpi`` is ``s·dpi/72`` pixels in the image, and the
browser scales the image by ``shown width / image width``. So a label is legible only if

    s · dpi/72 · (shown width / image width)  ≥  12 CSS px   (9 pt)

which a 14-inch, four-panel figure squeezed into one column fails however large its fonts look in
Jupyter. :func:`apply` sets the book's sizes (nothing under :data:`MIN_FONT_PT`), and
:func:`install` makes every figure a notebook displays carry, in its PNG, the smallest font it
uses, how many heatmaps lack a colour bar, how many bar charts have a value axis that does not
start at 0 (a bar's length is its value only from 0) and how many pairs of texts overlap;
``tests/test_site.py`` reads them back from the built site and computes the inequality above for
every image, as it is really displayed.
"""

from __future__ import annotations

import io

MIN_FONT_PT = 9.0  # the smallest text a figure may use, in points
PNG_COLORS = 256  # figures are saved as palette PNGs (palette_png)
DPI = 100  # the PNG resolution of figures shown in a notebook (pixels per inch)
WIDTH_IN = 6.8  # the default figure width: 680 px, the site's text column (676 px)
PNG_KEY_FONT = "min_font_pt"
PNG_KEY_DPI = "dpi"
PNG_KEY_NO_COLORBAR = "heatmaps_without_colorbar"
PNG_KEY_BARS_OFF_ZERO = "bar_axes_not_from_zero"
PNG_KEY_OVERLAPS = "overlapping_texts"
PNG_KEY_OVERLAP_TEXTS = "overlapping_text_pairs"
OVERLAP_PX = 2.0  # two texts overlap when their boxes share more than this, both ways (pixels)

RC = {
    "figure.dpi": DPI,
    "savefig.dpi": DPI,
    "figure.figsize": (WIDTH_IN, 3.6),
    "font.size": 10,
    "axes.titlesize": 10.5,
    "axes.labelsize": 10,
    "xtick.labelsize": 9.5,
    "ytick.labelsize": 9.5,
    "legend.fontsize": 9,
    "legend.title_fontsize": 9,
    "figure.titlesize": 11,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
}


def apply() -> None:
    """Set the book's matplotlib defaults (sizes in points, nothing under MIN_FONT_PT)."""
    import matplotlib as mpl

    mpl.rcParams.update(RC)


def visible_texts(fig):
    """Every piece of text the reader will see: titles, labels, tick labels, legends,
    annotations."""
    from matplotlib.text import Text

    undrawn = _undrawn_tick_labels(fig)
    seen = []
    for text in fig.findobj(Text):
        if not text.get_visible() or not text.get_text().strip() or id(text) in undrawn:
            continue
        if text.axes is not None and not text.axes.get_visible():
            continue
        seen.append(text)
    return seen


def _undrawn_tick_labels(fig) -> set[int]:
    """Ids of tick labels an axis keeps but does not draw (ticks outside the view limits keep
    stale, visible labels: they are no text the reader sees)."""
    every, drawn = set(), set()
    for ax in fig.axes:
        for axis in ax._axis_map.values():
            for tick in axis.majorTicks + axis.minorTicks:
                every.update((id(tick.label1), id(tick.label2)))
            if not axis.get_visible():  # a twin's hidden shared axis
                continue
            for tick in axis._update_ticks():
                drawn.update((id(tick.label1), id(tick.label2)))
    return every - drawn


def smallest_font_pt(fig) -> float:
    """The smallest font size (points) among the visible texts of a drawn figure; inf if none."""
    sizes = [t.get_fontsize() for t in visible_texts(fig)]
    return min(sizes) if sizes else float("inf")


def heatmaps_without_colorbar(fig) -> int:
    """Images and colour meshes (heatmaps) that have no colour bar to read their values from."""
    from matplotlib.collections import QuadMesh
    from matplotlib.image import AxesImage

    def scale(mappable):
        return mappable.get_cmap().name, tuple(mappable.get_clim())

    bars = [ax._colorbar for ax in fig.axes if getattr(ax, "_colorbar", None) is not None]
    shared = {scale(bar.mappable) for bar in bars}  # one bar may serve several panels
    count = 0
    for ax in fig.axes:
        if getattr(ax, "_colorbar", None) is not None:  # a colour bar draws itself as a mesh
            continue
        for artist in ax.get_children():
            if isinstance(artist, (AxesImage, QuadMesh)) and scale(artist) not in shared:
                count += 1
    return count


def bar_axes_not_from_zero(fig) -> int:
    """Axes with bars (``bar``, ``barh``, ``hist``) whose value axis is not linear or does not
    include 0: a bar whose base is cut off shows a difference its length exaggerates."""
    from matplotlib.container import BarContainer

    count = 0
    for ax in fig.axes:
        bars = [c for c in ax.containers if isinstance(c, BarContainer) and len(c.patches)]
        if not bars:
            continue
        horizontal = any(getattr(c, "orientation", None) == "horizontal" for c in bars)
        scale = ax.get_xscale() if horizontal else ax.get_yscale()
        low, high = sorted(ax.get_xlim() if horizontal else ax.get_ylim())
        tolerance = 1e-9 * max(abs(low), abs(high), 1e-300)
        if scale != "linear" or not (low <= tolerance and high >= -tolerance):
            count += 1
    return count


def overlapping_texts(fig) -> list[tuple[str, str]]:
    """Pairs of visible texts of a drawn figure whose boxes overlap by more than
    :data:`OVERLAP_PX` in both directions (a label printed over another one)."""
    renderer = fig.canvas.get_renderer()
    boxes = []
    for text in visible_texts(fig):
        try:
            box = text.get_window_extent(renderer)
        except (RuntimeError, ValueError):
            continue
        if box.width > 0 and box.height > 0 and all(map(_finite, box.extents)):
            boxes.append((text.get_text().strip(), box))
    pairs = []
    for i, (name_a, a) in enumerate(boxes):
        for name_b, b in boxes[i + 1 :]:
            wide = min(a.x1, b.x1) - max(a.x0, b.x0)
            tall = min(a.y1, b.y1) - max(a.y0, b.y0)
            if wide > OVERLAP_PX and tall > OVERLAP_PX:
                pairs.append((name_a, name_b))
    return pairs


def legibility_problems(fig) -> list[str]:
    """Every way ``fig`` breaks the book's figure rules, in words (empty: none): text under
    :data:`MIN_FONT_PT`, wider than the text column (:data:`WIDTH_IN`), a heatmap without a
    colour bar, a bar axis not starting at zero, overlapping texts. Draws the figure first."""
    fig.canvas.draw()
    problems = []
    # as saved (tight box): a legend or a label that sticks out widens the image, which the
    # site then shrinks to the column, and its text with it
    tight = fig.get_tightbbox(fig.canvas.get_renderer()).width
    font, width = smallest_font_pt(fig), max(fig.get_size_inches()[0], tight)
    bare, off_zero = heatmaps_without_colorbar(fig), bar_axes_not_from_zero(fig)
    if font < MIN_FONT_PT:
        problems.append(f"text at {font:.1f} pt, under {MIN_FONT_PT} pt")
    if width > WIDTH_IN + 1e-9:
        problems.append(f"{width:.2f} in wide, over {WIDTH_IN} in")
    if bare:
        problems.append(f"{bare} heatmap(s) without a colour bar")
    if off_zero:
        problems.append(f"{off_zero} bar axis/axes not starting at zero")
    problems += [f"overlapping texts {a!r} / {b!r}" for a, b in overlapping_texts(fig)]
    return problems


def _finite(x: float) -> bool:
    return x == x and abs(x) != float("inf")


def png_with_record(fig) -> bytes:
    """The figure as PNG bytes (tight box, book DPI) with its legibility record in text chunks."""
    buffer = io.BytesIO()
    fig.canvas.draw()  # ticks and legends exist only after a draw
    overlaps = overlapping_texts(fig)
    metadata = {
        PNG_KEY_FONT: f"{smallest_font_pt(fig):.2f}",
        PNG_KEY_DPI: str(DPI),
        PNG_KEY_NO_COLORBAR: str(heatmaps_without_colorbar(fig)),
        PNG_KEY_BARS_OFF_ZERO: str(bar_axes_not_from_zero(fig)),
        PNG_KEY_OVERLAPS: str(len(overlaps)),
        PNG_KEY_OVERLAP_TEXTS: "; ".join(f"{a[:30]} / {b[:30]}" for a, b in overlaps)
        .encode("ascii", "backslashreplace")  # a PNG text chunk holds Latin-1 only
        .decode("ascii"),
    }
    fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight", facecolor="white")
    return palette_png(buffer.getvalue(), metadata)


def palette_png(png: bytes, metadata: dict, colors: int = PNG_COLORS) -> bytes:
    """``png`` again with at most ``colors`` colours (an 8-bit palette, no dithering) and
    ``metadata`` as its text chunks. A line or bar chart on white uses few colours besides the
    anti-aliased edges of its lines and letters, so it looks the same at a third of the bytes:
    the pages a reader loads stay under the site test's 1 MB."""
    from PIL import Image, PngImagePlugin

    image = Image.open(io.BytesIO(png)).convert("RGB")
    palette = image.quantize(colors=colors, dither=Image.Dither.NONE)
    info = PngImagePlugin.PngInfo()
    for key, value in metadata.items():
        info.add_text(key, value)
    out = io.BytesIO()
    palette.save(out, format="PNG", optimize=True, pnginfo=info)
    return out.getvalue()


def read_record(png: bytes) -> dict:
    """The legibility record :func:`png_with_record` wrote (empty dict if the PNG has none)."""
    import struct

    record, position = {}, 8
    while position + 8 <= len(png):
        length, kind = struct.unpack(">I4s", png[position : position + 8])
        if kind == b"tEXt":
            key, _, value = png[position + 8 : position + 8 + length].partition(b"\0")
            record[key.decode("latin-1")] = value.decode("latin-1")
        position += 12 + length
    return record


def install() -> bool:
    """In IPython, show every matplotlib figure through :func:`png_with_record`; False elsewhere."""
    apply()
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None:
        return False
    import matplotlib.pyplot
    from matplotlib.figure import Figure

    # The inline backend (re)registers its own PNG formatter when it is configured: once after
    # the cell that loaded it (a post_run_cell handler), and possibly during a later cell. It
    # shows a cell's remaining figures in a post_execute handler. So ours is put back after every
    # cell (after the backend's own handler) and first thing in post_execute.
    matplotlib.pyplot.close(matplotlib.pyplot.figure())  # the first figure loads the backend
    formatter = shell.display_formatter.formatters["image/png"]

    def use_ours(*_):
        formatter.for_type(Figure, _base64_png)

    use_ours()
    for event, where in (("post_execute", 0), ("post_run_cell", None)):
        handlers = shell.events.callbacks[event]
        handlers[:] = [h for h in handlers if getattr(h, "__name__", "") != "use_ours"]
        handlers.insert(len(handlers) if where is None else where, use_ours)
    return True


def _base64_png(fig) -> str:
    import base64

    return base64.b64encode(png_with_record(fig)).decode("ascii")


def rendered_font_px(font_pt: float, dpi: float, shown_width: float, image_width: float) -> float:
    """The CSS pixel height of a ``font_pt`` font in a ``dpi`` image shown ``shown_width`` wide."""
    return font_pt * dpi / 72.0 * shown_width / image_width
