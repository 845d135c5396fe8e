"""Evaluation (notebook 13): sacreBLEU scores, batched translation in input order, attention maps."""
import pytest
import sacrebleu
import torch

from transformer_lib import evaluation
from transformer_lib.evaluation import (ALPHA_CANDIDATES, attention_maps, benchmark_summary, bleu_by_length,
                                        choose_alpha, score_translations, sentence_chrf, translate)
from transformer_lib.model import TransformerConfig, build_transformer
from transformer_lib.tokenization import train_bpe_tokenizer

HYPOTHESES = ["The cat sat on a mat.", "A dog chased the ball", "the bird sings"]
REFERENCES = ["The cat sat on the mat.", "A dog chased the red ball.", "The bird sings."]
SENTENCES = ["a cat", "the old dog chased some red balls near the big river", "a bird sings",
             "the teachers watched a queen", "dogs", "the child will greet the fast farmer near a bridge"]


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe_tokenizer(SENTENCES * 3 + ["la kampo dormas", "miro dancis"], vocab_size=120)


@pytest.fixture(scope="module", params=[False, True], ids=["post-LN", "pre-LN"])
def model(request, tokenizer):
    torch.manual_seed(0)
    config = TransformerConfig(tokenizer.vocab_size, tokenizer.vocab_size, d_model=16, n_heads=2, d_ff=32,
                               n_encoder_layers=2, n_decoder_layers=2, dropout=0.1, norm_first=request.param,
                               pad_id=tokenizer.pad_id)
    return build_transformer(config).eval()


def test_scores_equal_sacrebleu():
    scores = score_translations(HYPOTHESES, REFERENCES)
    assert set(scores) == {"bleu", "chrf", "bleu_lowercase"}
    assert scores["bleu"] == sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES]).score
    assert scores["chrf"] == sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES]).score
    assert scores["bleu_lowercase"] == sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES], lowercase=True).score
    assert 0 < scores["bleu"] < 100


def test_perfect_hypotheses_score_100():
    scores = score_translations(REFERENCES, REFERENCES)
    assert scores == pytest.approx({"bleu": 100.0, "chrf": 100.0, "bleu_lowercase": 100.0})


def test_lowercase_variant_forgives_case():
    upper = [s.upper() for s in REFERENCES]
    scores = score_translations(upper, REFERENCES)
    assert scores["bleu_lowercase"] == pytest.approx(100.0)
    assert scores["bleu"] < 50


def test_sentence_chrf_matches_sacrebleu():
    expected = [sacrebleu.sentence_chrf(h, [r]).score for h, r in zip(HYPOTHESES, REFERENCES)]
    assert sentence_chrf(HYPOTHESES, REFERENCES) == expected
    assert sentence_chrf(REFERENCES, REFERENCES) == pytest.approx([100.0] * 3)


@pytest.mark.parametrize("function", [score_translations, sentence_chrf])
def test_scores_reject_bad_input(function):
    with pytest.raises(ValueError, match="3 hypotheses but 2 references"):
        function(HYPOTHESES, REFERENCES[:2])
    with pytest.raises(ValueError, match="empty"):
        function([], [])
    with pytest.raises(TypeError, match="wrap a single sentence in a list"):
        function("The cat sat on a mat.", "The cat sat on the mat.")


def test_bleu_by_length_groups_and_scores():
    sources = ["a b", "a b c", "a b c d e f"]
    groups = bleu_by_length(sources, HYPOTHESES, REFERENCES, edges=[1, 3, 5])
    assert [(g["min_words"], g["max_words"], g["sentences"]) for g in groups] == [(1, 2, 1), (3, 4, 1), (5, None, 1)]
    for group, h, r in zip(groups, HYPOTHESES, REFERENCES):
        assert group["bleu"] == sacrebleu.corpus_bleu([h], [[r]]).score
        assert group["chrf"] == sacrebleu.corpus_chrf([h], [[r]]).score
    merged = bleu_by_length(sources, HYPOTHESES, REFERENCES, edges=[2])
    assert len(merged) == 1 and merged[0]["bleu"] == score_translations(HYPOTHESES, REFERENCES)["bleu"]


def test_bleu_by_length_rejects_bad_input():
    with pytest.raises(ValueError, match="increasing"):
        bleu_by_length(["a"] * 3, HYPOTHESES, REFERENCES, edges=[1, 5, 3])
    with pytest.raises(ValueError, match="fewer than the first edge"):
        bleu_by_length(["a"] * 3, HYPOTHESES, REFERENCES, edges=[2, 5])
    with pytest.raises(ValueError, match="2 sources but 3 hypotheses"):
        bleu_by_length(["a", "b"], HYPOTHESES, REFERENCES)


def test_translate_keeps_order_with_length_sorted_batches(model, tokenizer):
    # The untrained model never emits </s>, so every output runs to its own limit (source tokens + 50):
    # equal outputs also show that a sentence's limit does not depend on the longest one in its batch.
    alone = [translate(model, tokenizer, [s])[0] for s in SENTENCES]
    shuffled = [3, 0, 5, 1, 4, 2]   # batches of 2 after sorting by length mix the input positions
    assert translate(model, tokenizer, [SENTENCES[i] for i in shuffled], batch_size=2) == [alone[i] for i in shuffled]
    assert translate(model, tokenizer, SENTENCES, use_cache=False) == alone


def test_translate_beam_keeps_order(model, tokenizer):
    same_length = ["a cat", "a queen", "the child"]   # no padding: beam results cannot depend on the batch
    assert len({len(ids) for ids in tokenizer.encode_batch(same_length)}) == 1
    alone = [translate(model, tokenizer, [s], beam_size=2)[0] for s in same_length]
    assert translate(model, tokenizer, same_length[::-1], beam_size=2, batch_size=2) == alone[::-1]


def test_translate_rejects_bad_input(model, tokenizer):
    with pytest.raises(TypeError, match="wrap a single sentence in a list"):
        translate(model, tokenizer, "a cat")
    with pytest.raises(ValueError, match="beam_size must be a positive int"):
        translate(model, tokenizer, ["a cat"], beam_size=0)
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        translate(model, tokenizer, ["a cat"], batch_size=0)
    assert translate(model, tokenizer, []) == []
    assert translate(model, tokenizer, [], beam_size=4) == []


def test_translate_refuses_a_sentence_longer_than_max_len(tokenizer):
    torch.manual_seed(0)
    config = TransformerConfig(tokenizer.vocab_size, tokenizer.vocab_size, d_model=16, n_heads=2, d_ff=32,
                               n_encoder_layers=1, n_decoder_layers=1, max_len=16, pad_id=tokenizer.pad_id)
    model = build_transformer(config).eval()
    long_sentence = " ".join(["the old dog chased some red balls"] * 3)
    n = len(tokenizer.encode(long_sentence))
    assert n > 16
    with pytest.raises(ValueError, match=f"source has {n} tokens but the model's max_len is 16"):
        translate(model, tokenizer, ["a cat", long_sentence])
    # a short sentence decodes to at most max_len tokens although its paper limit (its length + 50) is larger
    assert isinstance(translate(model, tokenizer, ["a cat"])[0], str)


def test_attention_maps_shapes_and_rows(model, tokenizer):
    source, target = "the old dog chased some red balls", "la kampo dormas"
    S, T = len(tokenizer.encode(source)), len(tokenizer.encode(target)) - 1
    model.train()
    maps = attention_maps(model, tokenizer, source, target)
    assert model.training                                  # the mode is restored
    model.eval()
    assert len(maps.src_tokens) == S and len(maps.tgt_tokens) == len(maps.next_tokens) == T
    assert maps.tgt_tokens[0] == "<s>" and maps.next_tokens[-1] == "</s>" and maps.tgt_tokens[1:] == maps.next_tokens[:-1]
    H = 2
    for kind, shape in [("encoder_self", (H, S, S)), ("decoder_self", (H, T, T)), ("cross", (H, T, S))]:
        layers = getattr(maps, kind)
        assert len(layers) == 2
        for weights in layers:
            assert weights.shape == shape
            torch.testing.assert_close(weights.sum(-1), torch.ones(shape[:-1]))
    for weights in maps.decoder_self:
        assert torch.equal(weights.triu(diagonal=1), torch.zeros_like(weights))   # causal
    modules = [m for m in model.modules() if hasattr(m, "keep_weights")]
    assert modules and not any(m.keep_weights for m in modules)                     # switches restored
    assert all(m.last_weights is None for m in modules)


def test_attention_maps_match_the_model(model, tokenizer):
    source, target = "a bird sings", "miro dancis"
    model.eval()
    maps = attention_maps(model, tokenizer, source, target)
    layer = model.decoder.layers[-1].cross_attn
    layer.keep_weights = True
    try:
        src = torch.tensor([tokenizer.encode(source)])
        model(src, torch.tensor([tokenizer.encode(target)[:-1]]))
        torch.testing.assert_close(maps.cross[-1], layer.last_weights[0])
    finally:
        layer.keep_weights, layer.last_weights = False, None


def test_attention_maps_rejects_bad_input(model, tokenizer):
    with pytest.raises(TypeError, match="source must be one sentence"):
        attention_maps(model, tokenizer, ["a cat"], "miro")
    with pytest.raises(TypeError, match="must be a transformer_lib Transformer"):
        attention_maps(torch.nn.Linear(2, 2), tokenizer, "a cat", "miro")


def test_benchmark_summary_rows():
    scores = {"bleu": 30.0, "chrf": 55.0, "bleu_lowercase": 31.5, "decode_seconds": 9.0}
    report = {"models": {name: {"steps": 100, "train_seconds": 60.0, "target_tokens_per_second": 5000, "parameters": 7,
                                "test": {"test_2016": {"greedy": scores, "beam4": scores}}}
                         for name in ("ours", "peer")}}
    rows = benchmark_summary(report)
    assert [(r["model"], r["split"], r["decoding"]) for r in rows] == [
        ("ours", "test_2016", "greedy"), ("ours", "test_2016", "beam4"),
        ("peer", "test_2016", "greedy"), ("peer", "test_2016", "beam4")]
    assert rows[0]["bleu"] == 30.0 and rows[0]["tokens_per_second"] == 5000 and rows[0]["parameters"] == 7
    with pytest.raises(ValueError, match="'models' entry"):
        benchmark_summary({"command": "x"})


def test_choose_alpha_keeps_the_highest_validation_bleu_the_first_of_equals(monkeypatch):
    """One decode of the validation set per candidate α; the highest BLEU wins, the first of equals (the
    paper's 0.6 is listed first); with one candidate, or greedy, nothing is decoded."""
    bleu_at = {0.6: 30.0, 1.0: 31.5, 1.4: 31.5, 2.0: 29.0}
    decoded = []

    def fake_translate(model, tokenizer, sources, beam_size, alpha):
        decoded.append((beam_size, alpha))
        return [str(alpha)] * len(sources)
    monkeypatch.setattr(evaluation, "translate", fake_translate)
    monkeypatch.setattr(evaluation, "score_translations", lambda hyps, refs: {"bleu": bleu_at[float(hyps[0])]})
    pairs = [("ein Hund", "a dog"), ("eine Katze", "a cat")]
    lines = []
    chosen = choose_alpha(None, None, pairs, 4, [0.6, 1.0, 1.4, 2.0, 1], report=lines.append)
    assert chosen == {"beam": 4, "alpha": 1.0, "valid_bleu": {"0.6": 30.0, "1": 31.5, "1.4": 31.5, "2": 29.0}}
    assert decoded == [(4, 0.6), (4, 1.0), (4, 1.4), (4, 2.0)]          # 1 and 1.0: one candidate, decoded once
    assert lines[1] == "beam 4, alpha 1: BLEU 31.5" and len(lines) == 4
    decoded.clear()
    assert choose_alpha(None, None, pairs, 4, [0.6]) == {"beam": 4, "alpha": 0.6, "valid_bleu": {}}
    assert choose_alpha(None, None, pairs, 1)["alpha"] == ALPHA_CANDIDATES[0] == 0.6 and decoded == []


def test_choose_alpha_on_a_real_model_picks_a_candidate_it_scored(model, tokenizer):
    pairs = list(zip(SENTENCES[:4], SENTENCES[2:6]))
    chosen = choose_alpha(model, tokenizer, pairs, beam_size=2, alphas=(0.0, 0.6, 2.0))
    assert list(chosen["valid_bleu"]) == ["0", "0.6", "2"] and chosen["beam"] == 2
    hypotheses = translate(model, tokenizer, [s for s, _ in pairs], beam_size=2, alpha=chosen["alpha"])
    assert chosen["valid_bleu"][f"{chosen['alpha']:g}"] == max(chosen["valid_bleu"].values()) == round(
        score_translations(hypotheses, [t for _, t in pairs])["bleu"], 2)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"alphas": []}, ValueError, "alphas is empty"),
    ({"alphas": 0.6}, TypeError, "alphas must be a sequence of numbers"),
    ({"alphas": "0.6"}, TypeError, "alphas must be a sequence of numbers"),
    ({"alphas": (0.6, float("nan"))}, ValueError, "alpha must be a finite number"),
    ({"alphas": (0.6, 11)}, ValueError, r"alpha must be a finite number in \[-10, 10\]"),
    ({"beam_size": 0}, ValueError, "beam_size must be a positive int"),
    ({"pairs": ["a dog"]}, TypeError, "pairs must be a list of \\(source, reference\\) pairs"),
    ({"pairs": []}, ValueError, "no sentences to score"),
])
def test_choose_alpha_refuses_bad_input_before_decoding(model, tokenizer, kwargs, error, match):
    arguments = {"pairs": [("a cat", "a dog")], "beam_size": 2, "alphas": (0.6, 1.0), **kwargs}
    with pytest.raises(error, match=match):
        choose_alpha(model, tokenizer, **arguments)
