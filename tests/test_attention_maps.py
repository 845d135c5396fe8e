"""The cross-attention of one translation (notebook 13, transformer_lib/attention_map.py): the map is
computed for exactly the tokens the decoder emitted (greedy and beam search), the layer and head
are checked, and the drawn PNG is readable at its native size: every label a token, no two labels
overlapping, no text below 10 px, for short and long sentences."""
import copy
import io
import warnings

import pytest
from PIL import Image
import torch
from torch import nn

from transformer_lib.attention_map import (MissingGlyphsWarning, SentenceAttention, draw_attention_map,
                                           translate_with_attention)
from transformer_lib.evaluation import translate
from transformer_lib.model import TransformerConfig, build_transformer
from transformer_lib.plotting import smallest_font_pt
from transformer_lib.tokenization import train_bpe_tokenizer

SENTENCES = ["a cat", "the old dog chased some red balls near the big river", "a bird sings",
             "the teachers watched a queen", "the child will greet the fast farmer near a bridge"]
SOURCE = "the old dog chased a queen near the river"


def png_facts(png: bytes) -> tuple[int, int, float, dict]:
    """Width and height in pixels, dpi (pHYs) and the tEXt entries of a PNG."""
    image = Image.open(io.BytesIO(png))
    width, height = image.size
    return width, height, image.info.get("dpi", (72.0, 72.0))[0], dict(image.text)


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe_tokenizer(SENTENCES * 3, vocab_size=120)


@pytest.fixture(scope="module")
def model(tokenizer):
    torch.manual_seed(0)
    config = TransformerConfig(tokenizer.vocab_size, tokenizer.vocab_size, d_model=16, n_heads=2, d_ff=32,
                               n_encoder_layers=2, n_decoder_layers=2, dropout=0.1, pad_id=tokenizer.pad_id)
    return build_transformer(config).eval()


class ShiftEndOfSentence(nn.Module):
    """The model's generator with `shift` added to the logit of </s>: makes it stop at once or never."""

    def __init__(self, generator: nn.Module, eos_id: int, shift: float):
        super().__init__()
        self.generator, self.eos_id, self.shift = generator, eos_id, shift

    def forward(self, hidden):
        logits = self.generator(hidden).clone()
        logits[..., self.eos_id] += self.shift
        return logits


def with_shifted_eos(model, tokenizer, shift: float):
    shifted = copy.deepcopy(model)
    shifted.generator = ShiftEndOfSentence(shifted.generator, tokenizer.eos_id, shift)
    return shifted


def cross_weights_while_decoding(model, tokenizer, source: str, layer: int, max_len: int) -> torch.Tensor:
    """The cross-attention rows (mean of the heads) that greedy decoding itself computed, step by step
    with its key/value cache, recorded by a hook on the layer's cross-attention."""
    module, rows = model.decoder.layers[layer - 1].cross_attn, []
    hook = module.register_forward_hook(lambda m, args, out: rows.append(m.last_weights[0, :, -1].mean(0)))
    module.keep_weights = True
    try:
        translate_with_attention(model, tokenizer, source, max_len=max_len)   # its decode is the hooked one
    finally:
        hook.remove()
        module.keep_weights, module.last_weights = False, None
    return torch.stack(rows)


@pytest.mark.parametrize("layer", [1, 2])
def test_greedy_map_is_the_attention_the_search_computed(model, tokenizer, layer):
    result = translate_with_attention(model, tokenizer, SOURCE, max_len=7, layer=layer)
    during = cross_weights_while_decoding(model, tokenizer, SOURCE, layer, max_len=7)
    steps = len(result.out_tokens)
    # The hook saw the decoding steps (one row each), then the teacher-forced pass (all rows at once).
    torch.testing.assert_close(result.weights, during[:steps], atol=1e-5, rtol=1e-4)
    # The teacher-forced pass predicts the very tokens that were emitted.
    ids = tokenizer.encode(SOURCE)
    emitted = [tokenizer.token_to_id(t) for t in result.out_tokens]
    logits = model(torch.tensor([ids]), torch.tensor([[tokenizer.bos_id, *emitted[:-1]]]))
    assert logits[0].argmax(-1).tolist() == emitted


@pytest.mark.parametrize("beam_size", [1, 3])
@pytest.mark.parametrize("head", ["mean", 1, 2])
def test_map_shape_rows_and_translation(model, tokenizer, beam_size, head):
    result = translate_with_attention(model, tokenizer, SOURCE, beam_size=beam_size, head=head)
    assert result.translation == translate(model, tokenizer, [SOURCE], beam_size=beam_size)[0]
    assert result.src_tokens == [tokenizer.id_to_token(i) for i in tokenizer.encode(SOURCE)]
    assert tuple(result.weights.shape) == (len(result.out_tokens), len(result.src_tokens))
    torch.testing.assert_close(result.weights.sum(-1), torch.ones(len(result.out_tokens)))
    assert (result.layer, result.head, result.n_layers, result.n_heads) == (2, head, 2, 2)
    assert result.decoding == ("greedy" if beam_size == 1 else "beam 3, α 0.6")


def test_mean_is_the_mean_of_the_heads(model, tokenizer):
    heads = [translate_with_attention(model, tokenizer, SOURCE, head=h, layer=1).weights for h in (1, 2)]
    torch.testing.assert_close(translate_with_attention(model, tokenizer, SOURCE, layer=1).weights,
                               (heads[0] + heads[1]) / 2)
    assert not torch.allclose(heads[0], heads[1])


@pytest.mark.parametrize("beam_size", [1, 3])
def test_end_of_sentence_row_only_when_it_was_emitted(model, tokenizer, beam_size):
    stops = translate_with_attention(with_shifted_eos(model, tokenizer, 1e4), tokenizer, SOURCE, beam_size=beam_size)
    assert stops.out_tokens == ["</s>"] and stops.translation == "" and stops.weights.shape[0] == 1
    never = translate_with_attention(with_shifted_eos(model, tokenizer, -1e4), tokenizer, SOURCE,
                                     beam_size=beam_size, max_len=5)
    assert len(never.out_tokens) == 5 and "</s>" not in never.out_tokens and never.weights.shape[0] == 5


@pytest.mark.parametrize("option, value, message", [
    ("layer", 0, "layer must be an int from 1 to 2"), ("layer", 3, "layer must be an int from 1 to 2"),
    ("layer", True, "layer must be an int from 1 to 2"), ("layer", "1", "layer must be an int from 1 to 2"),
    ("head", 0, "head must be an int from 1 to 2 (this model's heads) or 'mean'"), ("head", 3, "from 1 to 2"),
    ("head", "max", "or 'mean'"), ("beam_size", 0, "beam_size must be a positive int"),
    ("max_len", 0, "max_len must be a positive int")])
def test_bad_options_are_refused_with_the_valid_range(model, tokenizer, option, value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        translate_with_attention(model, tokenizer, SOURCE, **{option: value})


def test_bad_inputs_are_refused(model, tokenizer):
    for source in ("", "   "):
        with pytest.raises(ValueError, match="one non-empty sentence"):
            translate_with_attention(model, tokenizer, source)
    with pytest.raises(TypeError, match="one sentence"):
        translate_with_attention(model, tokenizer, ["a cat"])
    with pytest.raises(TypeError, match="transformer_lib Transformer"):
        translate_with_attention(nn.Linear(2, 2), tokenizer, SOURCE)
    with pytest.raises(TypeError, match="what translate_with_attention returns"):
        draw_attention_map(torch.ones(2, 2))


def synthetic(rows: int, columns: int) -> SentenceAttention:
    """A map of any size, with labels as long as real subwords, for drawing alone."""
    weights = torch.rand(rows, columns).softmax(-1)
    words = ["▁river", "▁chas", "ed", "▁kuraĝan", "$5$", "<unk>"]
    return SentenceAttention("s", "t", ["<s>", *(words[i % 6] for i in range(columns - 2)), "</s>"],
                             [words[(i + 3) % 6] for i in range(rows)], weights, 2, "mean", 2, 4, "greedy")


def overlapping(boxes) -> list:
    return [(a, b) for a, b in zip(boxes, boxes[1:]) if a.overlaps(b)]


@pytest.mark.parametrize("rows, columns", [(1, 3), (7, 10), (58, 8), (45, 60)])
def test_drawn_map_is_readable_at_native_size(tmp_path, rows, columns):
    torch.manual_seed(0)
    attention = synthetic(rows, columns)
    path = tmp_path / "map.png"
    fig = draw_attention_map(attention, path)
    width, height, dpi, text = png_facts(path.read_bytes())
    assert abs(dpi - 100) < 0.01
    assert all(abs(px - inches * 100) <= 1 for px, inches in zip((width, height), fig.get_size_inches()))
    # Every text, tick labels and colour bar included, is at least 12 pt: 16.7 px at the PNG's 100 dpi.
    assert float(text["Smallest font (pt)"]) == smallest_font_pt(fig) == 12
    assert smallest_font_pt(fig) * dpi / 72 >= 10
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    x_labels, y_labels = ax.get_xticklabels(), ax.get_yticklabels()
    assert [t.get_text() for t in x_labels] == [t.replace("$", r"\$") for t in attention.src_tokens]
    assert [t.get_text() for t in y_labels] == [t.replace("$", r"\$") for t in attention.out_tokens]
    x_boxes = [t.get_window_extent(renderer) for t in x_labels]
    y_boxes = [t.get_window_extent(renderer) for t in y_labels]
    assert not overlapping(x_boxes) and not overlapping(y_boxes)
    figure_box = fig.bbox
    for box in x_boxes + y_boxes + [ax.title.get_window_extent(renderer)]:
        assert figure_box.x0 <= box.x0 and box.x1 <= figure_box.x1 and figure_box.y0 <= box.y0 \
            and box.y1 <= figure_box.y1, "a label is cut off at the figure's edge"
    assert "layer 2 of 2" in ax.get_title() and "mean of the 4 heads" in ax.get_title()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["map.png"], "the temporary file was left behind"


def test_drawing_writes_only_png_files(tmp_path):
    with pytest.raises(ValueError, match="ending in .png"):
        draw_attention_map(synthetic(2, 3), tmp_path / "map.jpg")
    assert list(tmp_path.iterdir()) == []


def test_characters_dejavu_lacks_come_from_another_installed_font(tmp_path):
    attention = synthetic(3, 4)
    attention.src_tokens[1] = "▁Ⓐb"                  # not in DejaVu Sans; STIX (shipped with matplotlib) has it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig = draw_attention_map(attention, tmp_path / "map.png")
    assert [str(w.message) for w in caught] == []
    assert len(fig.axes[0].get_xticklabels()[1].get_fontfamily()) > 1


def test_characters_no_font_has_are_named_once(tmp_path):
    attention = synthetic(3, 4)
    attention.src_tokens[1] = "▁a\u0378"              # an unassigned code point: no font draws it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        draw_attention_map(attention, tmp_path / "map.png")
    assert [(w.category, "\u0378" in str(w.message)) for w in caught] == [(MissingGlyphsWarning, True)]
    assert (tmp_path / "map.png").is_file()
