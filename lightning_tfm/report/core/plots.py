"""A figure's canvas and file, for every figure of the report (matplotlib's object API: no pyplot, no display
needed): :func:`new_figure`, every text drawn as it is (:func:`literal_text`), and :func:`save_figure`, which writes
PNG (what the markdown and the HTML embed) and, on request, also SVG and PDF beside it (:data:`FORMATS`,
:func:`parse_formats`: ``ltfm report --formats png,svg,pdf``), the same bytes for the same data. A panel left without
anything drawn in it says "no data" (:func:`mark_empty`); a figure with nothing to show in any panel is not written
at all: its function returns a :class:`LeftOut` saying why, which the report shows in its place (:func:`shown`);
:func:`placeholder` is a figure that is only its message."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .text import md_text


def new_figure(nrows: int, ncols: int, width: float, height: float):
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def literal_text(fig) -> None:
    """Every text of ``fig`` drawn as it is: a row's name, a family or a status from an export holding "$" would
    otherwise be read as mathtext (and one that does not parse fails the figure). Tick labels that matplotlib's
    number formatters write (a log axis's ``10^2`` is mathtext) stay theirs; tick labels set as strings (row
    names) are literal."""
    from matplotlib import ticker
    from matplotlib.text import Text

    numeric = (ticker.ScalarFormatter, ticker.LogFormatter, ticker.EngFormatter, ticker.PercentFormatter,
               ticker.NullFormatter)
    numbers = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for ticks, formatter in ((axis.get_major_ticks(), axis.get_major_formatter()),
                                     (axis.get_minor_ticks(), axis.get_minor_formatter())):
                if isinstance(formatter, numeric):
                    numbers.update(id(label) for tick in ticks for label in (tick.label1, tick.label2))
    for text in fig.findobj(Text):
        if id(text) not in numbers:
            text.set_parse_math(False)


# The figures' file formats: PNG always (the markdown and the HTML embed it), SVG and PDF on request.
FORMATS = ("png", "svg", "pdf")
# No date or tool version in the files, so a figure of the same data is the same bytes.
_METADATA = {"png": {"Software": None}, "svg": {"Date": None, "Creator": None},
             "pdf": {"CreationDate": None, "Creator": None, "Producer": None}}
# PDF fonts as TrueType (Type 42), not Type 3: what journals' and conferences' PDF checks ask for; a fixed SVG id salt.
_RC = {"pdf.fonttype": 42, "svg.hashsalt": "lightning_tfm"}


def parse_formats(text: str | list | tuple | None, option: str = "--formats") -> tuple[str, ...]:
    """``"png,svg,pdf"`` (or a list of them) as the formats to write, PNG first and always among them; an unknown
    or empty one is a :class:`~lightning_tfm.base.errors.UserError` naming the ones there are."""
    from ...base.errors import UserError

    items = text.split(",") if isinstance(text, str) else list(text or ["png"])
    names = [str(x).strip().lower().lstrip(".") for x in items]
    bad = [n for n in names if n not in FORMATS]
    if bad or not names:
        what = f"unknown format {bad[0]!r}" if bad and bad[0] else "an empty format"
        raise UserError(f"{option} {','.join(map(str, items))!r}: {what}; choose from {', '.join(FORMATS)}, "
                        "comma-separated (PNG is always written: the markdown and the HTML embed it)")
    return tuple(f for f in FORMATS if f == "png" or f in names)


PIPELINE_CHECK_MARK = "pipeline check: numbers say nothing"


def mark_pipeline_check(fig, check: bool) -> None:
    """When ``check`` (the runs are tagged ``pipeline-check``: ``make ablation QUICK=1``), ``fig`` says so across
    its middle (:data:`PIPELINE_CHECK_MARK`), so that the figure never passes for a result when shown alone."""
    if check:
        fig.text(0.5, 0.5, PIPELINE_CHECK_MARK, ha="center", va="center", rotation=18, fontsize=30, color="red",
                 alpha=0.3, fontweight="bold", zorder=10)


def mark_empty(fig, message: str = "no data") -> None:
    """Every visible panel of ``fig`` with nothing drawn in it (no line, bar, band, image or text) says
    ``message`` in its middle, instead of being blank."""
    for ax in fig.axes:
        drawn = any(len(line.get_xdata()) for line in ax.lines) or ax.collections or ax.patches or ax.images
        if ax.get_visible() and ax.axison and not (drawn or ax.texts):
            ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, color="dimgray",
                    fontsize=10)


@dataclass(frozen=True)
class LeftOut:
    """A figure not written: none of its panels had anything to show (``name``: its file's name, ``why``)."""
    name: str
    why: str

    def markdown(self) -> str:
        return f"*{self.name} is left out: {md_text(self.why)}.*"


def has_data(fig) -> bool:
    """Some visible panel of ``fig`` shows data: a line with points, a band, a bar or an image (texts aside)."""
    return any(ax.get_visible() and (any(len(line.get_xdata()) for line in ax.lines) or ax.collections
                                     or ax.patches or ax.images) for ax in fig.axes)


def shown(figure: str | LeftOut):
    """What the report notebook displays for a figure function's result: the image, or the line saying why the
    figure is left out."""
    from IPython.display import Image, Markdown

    return Markdown(figure.markdown()) if isinstance(figure, LeftOut) else Image(filename=figure)


def save_figure(fig, path: str | Path, formats=("png",), empty: str | None = None) -> str | LeftOut:
    """``fig`` as ``path`` (PNG) and as each other of ``formats`` beside it (``changes.svg``, ``changes.pdf``);
    returns the PNG's path. ``empty``: why the figure has nothing to show, when none of its panels has data: then
    nothing is written and a :class:`LeftOut` is returned."""
    import matplotlib

    path = Path(path)
    if empty is not None and not has_data(fig):
        return LeftOut(path.name, empty)
    path.parent.mkdir(parents=True, exist_ok=True)
    literal_text(fig)
    mark_empty(fig)
    with matplotlib.rc_context(_RC):
        for fmt in parse_formats(formats):
            fig.savefig(path if fmt == "png" else path.with_suffix(f".{fmt}"), format=fmt, metadata=_METADATA[fmt])
    return str(path)


def placeholder(path: str | Path, title: str, message: str, formats=("png",)) -> str:
    fig, axes = new_figure(1, 1, 6, 3.5)
    ax = axes[0][0]
    ax.set_title(title, fontsize=10)
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()
    return save_figure(fig, path, formats)
