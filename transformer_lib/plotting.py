"""Drawing helpers for the notebooks: the course's figure style, the architecture diagram of notebook
00, the word-alignment plot and notebook 14's all-reduce picture.

Hand-written, not exported: these are matplotlib drawing code, not part of the Transformer, and a
notebook cell full of box coordinates would bury the ideas it illustrates (house style: "drawing and
plotting helpers live out of the way"). The notebooks call them and save the figures with
`transformer_lib.course.save_figure`.

Figures a phone can read: on a 390 px wide phone the course website shows a figure at most
PHONE_FIGURE_CSS_PX wide, so text of `pt` points in a PNG of `width` pixels at `dpi` appears
`pt * dpi / 72 * PHONE_FIGURE_CSS_PX / width` CSS pixels tall (`text_css_px`). `use_course_style()`
makes SMALLEST_FONT_PT the smallest font of every figure and, in a notebook, writes the smallest
font a figure really uses into its PNG (a tEXt entry named TEXT_SIZE_KEY), so the text size of every
stored figure can be measured from the PNG alone (tests/test_notebook_conventions.py does).
"""
import matplotlib
import matplotlib.pyplot as plt
from matplotlib.patches import FancyBboxPatch

PHONE_FIGURE_CSS_PX = 350     # the article column of the website on a 390 px phone
MIN_TEXT_CSS_PX = 8           # the smallest text a phone reader can read without a tap
FIGURE_DPI = 100
SMALLEST_FONT_PT = 12         # font.size of the course style; no text of a course figure is smaller
# The widest PNG whose SMALLEST_FONT_PT text is still MIN_TEXT_CSS_PX tall on a phone: 729 px (7.3 in).
MAX_PHONE_WIDTH_PX = int(SMALLEST_FONT_PT * FIGURE_DPI / 72 * PHONE_FIGURE_CSS_PX / MIN_TEXT_CSS_PX)
TEXT_SIZE_KEY = "Smallest font (pt)"
COURSE_RC = {"font.size": SMALLEST_FONT_PT, "axes.titlesize": "large", "axes.labelsize": "medium",
             "xtick.labelsize": "medium", "ytick.labelsize": "medium", "legend.fontsize": "medium",
             "legend.title_fontsize": "medium", "figure.titlesize": "large", "figure.dpi": FIGURE_DPI,
             "savefig.dpi": FIGURE_DPI, "figure.figsize": (6.4, 4.2)}


def text_css_px(font_pt: float, png_width_px: int, dpi: float = FIGURE_DPI) -> float:
    """How tall text of `font_pt` points in a PNG `png_width_px` wide looks on a 390 px phone, in CSS px
    (the site never enlarges a figure beyond its natural size)."""
    return font_pt * dpi / 72 * min(1.0, PHONE_FIGURE_CSS_PX / png_width_px)


def smallest_font_pt(fig) -> float | None:
    """The smallest font size, in points, of the visible non-empty text of `fig` (None if it has none)."""
    fig.canvas.draw()                        # tick labels get their text when the figure is drawn
    sizes = [text.get_fontsize() for text in fig.findobj(matplotlib.text.Text)
             if text.get_visible() and text.get_text().strip()]
    return min(sizes, default=None)


def _png_with_text_size(fig):
    """IPython's PNG of `fig` (as the inline backend makes it), with its smallest font size recorded."""
    from IPython.core.pylabtools import print_figure

    smallest = smallest_font_pt(fig)
    metadata = {"Software": None} | ({TEXT_SIZE_KEY: f"{smallest:g}"} if smallest is not None else {})
    return print_figure(fig, "png", base64=True, metadata=metadata)


def use_course_style() -> None:
    """Draw the figures that follow in the course style (SMALLEST_FONT_PT and up, FIGURE_DPI) and, inside
    IPython, record each shown figure's smallest font size in its PNG. Call it after `%matplotlib inline`."""
    plt.rcParams.update(COURSE_RC)
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None:
        from matplotlib.figure import Figure
        shell.display_formatter.formatters["image/png"].for_type(Figure, _png_with_text_size)

COLOURS = {"embed": "#f6c6c6", "attention": "#f9d9a6", "norm": "#fff3b0", "ffn": "#bfe0f5",
           "output": "#d9c8ef", "stack": "#f2f2f2"}


def box(ax, x, y, text, kind, width=3.6, height=0.55):
    """A rounded box centred at (x, y); returns its top and bottom y for arrows."""
    ax.add_patch(FancyBboxPatch((x - width / 2, y - height / 2), width, height,
                                boxstyle="round,pad=0.02,rounding_size=0.12",
                                facecolor=COLOURS[kind], edgecolor="black", linewidth=1))
    ax.text(x, y, text, ha="center", va="center")
    return y + height / 2, y - height / 2


def arrow(ax, start, end, colour="black"):
    """An arrow from `start` to `end`, (x, y) points in data coordinates."""
    ax.annotate("", xy=end, xytext=start,
                arrowprops=dict(arrowstyle="-|>", color=colour, lw=1.2, shrinkA=0, shrinkB=0))


def stack(ax, x, y_bottom, sublayers, label):
    """Draw one encoder or decoder layer (a list of (text, kind)) with residual arrows; return box centres."""
    step = 0.95
    top = y_bottom + step * len(sublayers) + 0.1
    ax.add_patch(FancyBboxPatch((x - 2.1, y_bottom - 0.1), 4.2, top - y_bottom + 0.15,
                                boxstyle="round,pad=0.05,rounding_size=0.2",
                                facecolor=COLOURS["stack"], edgecolor="grey", linewidth=1.2))
    ax.text(x + (-2.45 if label == "encoder" else 2.45), (y_bottom + top) / 2, "N×",
            ha="center", va="center", fontsize=14, fontweight="bold")
    centres = [y_bottom + 0.4 + step * i for i in range(len(sublayers))]
    for i, ((text, kind), y) in enumerate(zip(sublayers, centres)):
        box(ax, x, y, text, kind)
        if i > 0:
            arrow(ax, (x, centres[i - 1] + 0.275), (x, y - 0.275))
    # Residual connections: from below each sublayer around it into its Add & Norm.
    side = x - 1.95 if label == "encoder" else x + 1.95
    for i in range(0, len(sublayers), 2):
        y_in, y_norm = centres[i] - 0.275 - 0.15, centres[i + 1]
        ax.plot([x, side, side], [y_in, y_in, y_norm], color="grey", lw=1.2)
        arrow(ax, (side, y_norm), (x + (-1.8 if label == "encoder" else 1.8), y_norm), colour="grey")
    return centres


def draw_architecture():
    """The encoder-decoder Transformer of the paper's Figure 1, drawn box by box; returns the figure."""
    fig, ax = plt.subplots(figsize=(7, 8.6))
    enc_x, dec_x = 2.6, 7.6
    # Inputs, embeddings, positional encodings.
    for x, tokens in [(enc_x, "source tokens  (B, S)"), (dec_x, "target tokens, shifted right  (B, T)")]:
        ax.text(x, 0.2, tokens, ha="center", va="center", style="italic")
        top, bottom = box(ax, x, 1.0, "embedding  × √D", "embed")
        arrow(ax, (x, 0.4), (x, bottom))
        ax.add_patch(plt.Circle((x, 1.85), 0.22, facecolor="white", edgecolor="black"))
        ax.text(x, 1.85, "+", ha="center", va="center", fontsize=14)
        ax.text(x + (-1.2 if x == enc_x else 1.25), 1.85, "positional\nencoding", ha="center", va="center")
        arrow(ax, (x, top), (x, 1.63))
        arrow(ax, (x, 2.07), (x, 2.825))
    encoder = stack(ax, enc_x, 2.7, [("multi-head self-attention", "attention"), ("add & norm", "norm"),
                                     ("feed-forward", "ffn"), ("add & norm", "norm")], "encoder")
    decoder = stack(ax, dec_x, 2.7, [("masked self-attention", "attention"), ("add & norm", "norm"),
                                     ("cross-attention", "attention"), ("add & norm", "norm"),
                                     ("feed-forward", "ffn"), ("add & norm", "norm")], "decoder")
    # The encoder's output (memory) feeds the keys and values of every decoder cross-attention.
    memory_y = encoder[-1] + 1.3
    arrow(ax, (enc_x, encoder[-1] + 0.275), (enc_x, memory_y - 0.2))
    ax.text(enc_x, memory_y, "memory  (B, S, D)", ha="center", va="center", style="italic")
    ax.plot([enc_x + 1.35, 5.1, 5.1], [memory_y, memory_y, decoder[2]], color="black", lw=1.2)
    arrow(ax, (5.1, decoder[2]), (dec_x - 1.8, decoder[2]))
    ax.text(5.0, (memory_y + decoder[2]) / 2, "keys, values", rotation=90, ha="right", va="center")
    ax.text(dec_x + 0.1, (decoder[1] + decoder[2]) / 2, "queries", ha="left", va="center")
    # Output head, above the decoder's label.
    top, bottom = box(ax, dec_x, decoder[-1] + 1.4, "linear  D → V", "output")
    arrow(ax, (dec_x, decoder[-1] + 0.275 + 0.13), (dec_x, bottom))
    top2, bottom2 = box(ax, dec_x, decoder[-1] + 2.2, "softmax", "output")
    arrow(ax, (dec_x, top), (dec_x, bottom2))
    ax.text(dec_x, decoder[-1] + 2.95, "next-token probabilities  (B, T, V)", ha="center", va="center",
            style="italic")
    arrow(ax, (dec_x, top2), (dec_x, decoder[-1] + 2.75))
    for x, centres, name in ((enc_x, encoder, "ENCODER"), (dec_x, decoder, "DECODER")):
        ax.text(x - 2.0, centres[-1] + 0.85, name, ha="left", va="bottom", fontweight="bold")
    ax.set_xlim(0, 10.4)
    ax.set_ylim(-0.2, decoder[-1] + 3.2)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title("The encoder-decoder Transformer\n(N = 6 layers per stack in the paper; all attention is multi-head)")
    return fig


def plot_alignment(alignment, source_words: list[str], target_words: list[str],
                   title: str = "Word alignment of one English → Ordo pair"):
    """A (source, target) 0/1 alignment matrix as a labelled grey image; returns the figure."""
    fig, ax = plt.subplots(figsize=(7, 6))
    image = ax.imshow(alignment, cmap="Greys", vmin=0, vmax=1)
    ax.set_xticks(range(len(target_words)), target_words, rotation=45, ha="right")
    ax.set_yticks(range(len(source_words)), source_words)
    ax.set_xlabel("Ordo word (target)")
    ax.set_ylabel("English word (source)")
    ax.set_title(title)
    fig.colorbar(image, ax=ax, label="1 = words translate each other", shrink=0.7)
    return fig


def draw_allreduce(gradients,
                   title: str = "the all-reduce sums the $g_r$, DDP divides by N:\nevery rank gets the mean $\\bar g$"):
    """Notebook 14's picture of data parallelism: `gradients` (N, 2), one 2-d gradient per rank.
    On top, the ranks' gradients and their mean as arrows; below, the ranks sending their gradient
    to the all-reduce, which sums them, and all receiving the same mean once DDP has divided by N.
    Returns the figure."""
    import torch

    gradients = torch.as_tensor(gradients, dtype=torch.float32)
    n = gradients.shape[0]
    mean = gradients.mean(0)
    colours = plt.cm.tab10.colors
    fig, (left, right) = plt.subplots(2, 1, figsize=(6.4, 11), gridspec_kw={"height_ratios": [1.2, 1]})
    for rank, g in enumerate(gradients.tolist()):
        left.annotate("", xy=g, xytext=(0, 0), arrowprops=dict(arrowstyle="-|>", color=colours[rank], lw=1.8))
        left.text(g[0] * 1.1, g[1] * 1.1, f"$g_{rank}$ (rank {rank})", color=colours[rank], ha="center", va="center")
    left.annotate("", xy=mean.tolist(), xytext=(0, 0), arrowprops=dict(arrowstyle="-|>", color="black", lw=3))
    reach = float(gradients.abs().max()) * 1.35 + 0.2
    left.text(-0.95 * reach, -0.9 * reach, r"black: the mean $\bar g = \frac{1}{N}\sum_r g_r$")
    left.set(xlim=(-reach, reach), ylim=(-reach, reach), aspect="equal", xlabel="gradient, coordinate 1",
             ylabel="gradient, coordinate 2", title="each rank's gradient of its own batch,\nand the mean")
    left.axhline(0, color="grey", lw=0.5)
    left.axvline(0, color="grey", lw=0.5)

    right.set(xlim=(0, 10), ylim=(-0.5, n + 0.5), title=title)
    right.axis("off")
    centre = (n - 1) / 2
    box(right, 5, centre, "all-reduce\n(sum)", "attention", width=2.2, height=1.0)
    for rank in range(n):
        y = n - 1 - rank
        box(right, 1.3, y, f"rank {rank}: $g_{rank}$", "embed", width=2.2, height=0.5)
        box(right, 8.7, y, rf"rank {rank}: $\bar g$", "ffn", width=2.2, height=0.5)
        arrow(right, (2.4, y), (3.9, centre + (y - centre) * 0.25), colours[rank])
        arrow(right, (6.1, centre + (y - centre) * 0.25), (7.6, y), "black")
    fig.tight_layout()
    return fig
