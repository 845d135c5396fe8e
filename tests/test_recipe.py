"""The recipe options of `train` (transformer_lib/recipe.py): --init, --attention, --average and
--average-every parse, refuse a bad value with one error line (exit 2), are recorded in the run folder
and honoured on resume; --init torch draws as nn.MultiheadAttention draws; --attention auto times the
two paths and records its choice; --average keeps whichever of the last and the averaged weights
scores higher on the validation pairs. A run that leaves them out records what runs recorded before
them. Tiny runs on 60 pairs, in this process (`main(argv)`); one module fixture trains 20 steps."""
import json
import shutil

import pytest
import torch
from torch import nn

from test_cli_data import PAIRS, TINY, recorded, write_files
from test_cli_errors import assert_refused, cli, last_line
from transformer_lib import recipe
from transformer_lib.checkpoints import average_state_dicts
from transformer_lib.model import TransformerConfig, build_transformer
from transformer_lib.multihead import MultiHeadAttention

RECIPE = ["--init", "torch", "--attention", "explicit", "--average", "2", "--average-every", "10"]
OLD_TRAINING = {"seed", "max_tokens", "warmup", "lr_factor", "label_smoothing", "cooldown"}   # before the options


def train(run, *extra):
    """A tiny train on PAIRS (6 of them carved out for validation, none for test)."""
    src, tgt = run.parent / "train.en", run.parent / "train.de"
    if not src.is_file():
        write_files(run.parent, PAIRS)
    return cli("train", "--run", run, *TINY, "--data", f"files:{src},{tgt}", "--valid-fraction", "0.1",
               "--test-fraction", "0", *extra)


def checkpoint(run) -> dict:
    return torch.load(run / "checkpoint.pt", weights_only=True)


@pytest.fixture(scope="module")
def recipe_run(tmp_path_factory):
    """20 steps with every recipe option: snapshots at steps 10 and 20; its folder and result."""
    run = tmp_path_factory.mktemp("recipe") / "run"
    result = train(run, *RECIPE, "--max-steps", "20", "--checkpoint-every", "10")
    assert result.returncode == 0, result.stderr
    return run, result


@pytest.mark.parametrize("option, value, words", [
    ("--init", "xavier", "argument --init: invalid choice: 'xavier' (choose from "),       # the choices' quotes:
    ("--attention", "flash", "argument --attention: invalid choice: 'flash' (choose from "),  # by Python's version
    ("--average", "-1", "argument --average: must be an integer >= 0"),
    ("--average", "two", "argument --average: must be an integer >= 0"),
    ("--average-every", "0", "argument --average-every: must be a positive integer"),
])
def test_a_bad_value_is_one_error_line(tmp_path, option, value, words):
    result = train(tmp_path / "run", option, value)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1 and words in result.stderr, result.stderr
    assert not (tmp_path / "run").exists()


def test_the_options_build_the_settings_and_back():
    from transformer_lib.cli import build_parser, settings_from
    from transformer_lib.options import train_command
    from transformer_lib.settings import TrainSettings
    settings = settings_from(build_parser().parse_args(["train", "--run", "r", *RECIPE]))
    assert (settings.init, settings.attention, settings.average, settings.average_every) == ("torch", "explicit", 2, 10)
    assert settings_from(build_parser().parse_args(train_command(settings, "r")[3:])) == settings
    with pytest.raises(ValueError, match=r"init \(--init\) must be one of ours, torch, got 'xavier'"):
        TrainSettings(init="xavier")
    with pytest.raises(ValueError, match=r"average \(--average\) must be an integer >= 0"):
        TrainSettings(average=-1)


def test_without_the_options_a_run_records_what_runs_recorded_before_them(tmp_path):
    """Left at their defaults, nothing new is written: config.json, the checkpoint and history.json hold
    what they held before these options, so a run folder written before them resumes as it did."""
    run = tmp_path / "run"
    assert train(run).returncode == 0
    meta = recorded(run)
    assert set(meta["training"]) == OLD_TRAINING and "attention" not in meta
    assert set(checkpoint(run)["extra"]) == {"run"}
    assert not {"averaging", "attention"} & set(json.loads((run / "history.json").read_text()))
    # A speed option may change on resume (and is recorded from then on); what makes the run may not.
    resumed = train(run, "--max-steps", "4", "--attention", "explicit")
    assert resumed.returncode == 0, resumed.stderr
    assert recorded(run)["attention"] == "explicit" and "attention: explicit (--attention explicit)" in resumed.stderr
    assert_refused(last_line(train(run, "--max-steps", "6", "--init", "torch")), "init ours -> torch (--init)")


def test_the_recipe_is_recorded_said_and_kept(recipe_run):
    run, result = recipe_run
    meta = recorded(run)
    assert {k: meta["training"][k] for k in ("init", "average", "average_every")} == {
        "init": "torch", "average": 2, "average_every": 10}
    assert meta["attention"] == "explicit" and "attention: explicit (--attention explicit)" in result.stderr
    averaging = json.loads((run / "history.json").read_text())["averaging"]
    assert averaging["snapshots"] == [10, 20] and averaging["valid_pairs"] == 6
    assert set(averaging["valid_greedy"]) == {"last_weights", "averaged_weights"}
    assert "averaging: the 2 snapshots of steps 10, 20 score" in result.stderr
    # The checkpoint holds the weights kept (which `evaluate --run` loads), and the snapshots to resume with.
    saved = checkpoint(run)
    snapshots = [snapshot["weights"] for snapshot in saved["extra"]["snapshots"]]
    kept = average_state_dicts(snapshots) if averaging["kept"] == "averaged_weights" else snapshots[-1]
    for name, weights in saved["model"].items():
        torch.testing.assert_close(weights, kept[name], rtol=0, atol=0)
    assert ("last_weights" in saved["extra"]) == (averaging["kept"] == "averaged_weights")


def test_a_resume_honours_the_recipe_and_goes_on_exactly(recipe_run, tmp_path):
    """Trained further, the run goes on from its last weights (not the average it kept) with its snapshots,
    as one that never stopped; --attention auto takes the recorded path; a changed recipe is refused."""
    run = tmp_path / "run"
    shutil.copytree(recipe_run[0], run)
    go_on = [*RECIPE[:2], "--attention", "auto", *RECIPE[4:], "--max-steps", "30", "--checkpoint-every", "10"]
    resumed = train(run, *go_on)
    assert resumed.returncode == 0, resumed.stderr
    assert "attention: explicit (--attention auto, as the run folder records)" in resumed.stderr
    assert "changed on resume" not in resumed.stderr
    straight = tmp_path / "straight" / "run"
    straight.parent.mkdir()
    assert train(straight, *RECIPE, "--max-steps", "30", "--checkpoint-every", "10").returncode == 0
    history = [json.loads((r / "history.json").read_text()) for r in (run, straight)]
    logged = [[(h["step"], h["loss"], h["accuracy"], h["lr"]) for h in one["history"]] for one in history]
    assert logged[0] == logged[1] and [step for step, *_ in logged[0]] == [10, 20, 30]
    assert history[0]["averaging"] == history[1]["averaging"] and history[0]["averaging"]["snapshots"] == [20, 30]
    for option, value, words in (("--init", "ours", "init torch -> ours (--init)"),
                                 ("--average", "0", "average 2 -> 0 (--average)"),
                                 ("--average-every", "5", "average_every 10 -> 5 (--average-every)")):
        refused = train(run, *go_on[:-4], "--max-steps", "40", option, value)
        assert refused.returncode == 2 and "average_every 10 -> None" not in refused.stderr
        assert_refused(last_line(refused), words)


def test_average_needs_validation_pairs(tmp_path):
    result = train(tmp_path / "run", "--valid-fraction", "0", "--average", "2")
    assert_refused(last_line(result), "--average 2 keeps the averaged weights only where they score higher on the "
                   "validation pairs, and this data has none")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("timed", [False, True])
def test_attention_auto_records_its_choice(tmp_path, monkeypatch, timed):
    """A run long enough (here: any, by lowering the bar) times the two paths and keeps the faster;
    a shorter one takes fused untimed. Either way the choice is recorded, and it is the path trained."""
    measured = []

    def faster(model, batches, loss_fn, amp, rounds=3):
        measured.append((len(batches), amp))
        return "explicit", {"fused": 2.0, "explicit": 1.0}
    monkeypatch.setattr(recipe, "faster_attention", faster)
    if timed:
        monkeypatch.setattr(recipe, "AMP_MEASURE_MIN_STEPS", 1)
    run = tmp_path / "run"
    result = train(run, "--attention", "auto")
    assert result.returncode == 0, result.stderr
    choice = "explicit" if timed else "fused"
    assert [amp for _, amp in measured] == ([None] if timed else []) and all(0 < n <= 4 for n, _ in measured)
    assert recorded(run)["attention"] == choice
    assert json.loads((run / "history.json").read_text())["attention"] == choice
    why = "timed here: fused 2.0 s, explicit 1.0 s" if timed else "not timed: fewer than 1000 steps"
    assert f"attention: {choice} (--attention auto, {why}" in result.stderr


def tiny_model():
    torch.manual_seed(0)
    return build_transformer(TransformerConfig(src_vocab_size=20, tgt_vocab_size=20, d_model=8, n_heads=2, d_ff=16,
                                               n_encoder_layers=1, n_decoder_layers=1))


def test_faster_attention_times_both_paths_and_leaves_the_model_alone():
    from transformer_lib.data import Batch
    from transformer_lib.training import LabelSmoothingLoss, translation_loss
    model = tiny_model()
    before, rng = {k: v.clone() for k, v in model.state_dict().items()}, torch.get_rng_state()
    batch = Batch.from_examples([([1, 5, 6, 2], [1, 7, 8, 2]), ([1, 9, 2], [1, 4, 2])], pad_id=0)
    criterion = LabelSmoothingLoss(0.1, ignore_index=0)
    choice, seconds = recipe.faster_attention(model, [batch], lambda m, b: translation_loss(m, b, criterion), None,
                                              rounds=1)
    assert choice == min(seconds, key=seconds.get) and set(seconds) == {"fused", "explicit"}
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(m.fused for m in model.modules() if isinstance(m, MultiHeadAttention))   # untouched: a copy timed


def test_init_torch_draws_what_nn_multihead_attention_draws():
    ours, theirs = MultiHeadAttention(32, 4), nn.MultiheadAttention(32, 4)
    out_weight = ours.out_proj.weight.detach().clone()
    torch.manual_seed(7)
    recipe.init_attention_like_torch(ours)
    torch.manual_seed(7)
    theirs._reset_parameters()        # Xavier on the packed (3D, D) in_proj_weight first, then zero biases
    packed = torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight])
    torch.testing.assert_close(packed, theirs.in_proj_weight, rtol=0, atol=0)
    assert packed.abs().max() <= (6 / (4 * 32)) ** 0.5     # the bound of a 3D x D matrix, not of D x D
    for proj in (ours.q_proj, ours.k_proj, ours.v_proj, ours.out_proj):
        assert torch.count_nonzero(proj.bias) == 0
    torch.testing.assert_close(ours.out_proj.weight, out_weight, rtol=0, atol=0)   # W^O keeps its D x D Xavier
    # `train --init torch` builds the model so: drawn after the library's init, from the same seed.
    config = TransformerConfig(src_vocab_size=20, tgt_vocab_size=20, d_model=8, n_heads=2, d_ff=16,
                               n_encoder_layers=1, n_decoder_layers=1)
    torch.manual_seed(3)
    expected = recipe.init_attention_like_torch(build_transformer(config)).state_dict()
    torch.manual_seed(3)
    for name, weights in recipe.build_model(config, "torch", "cpu").state_dict().items():
        torch.testing.assert_close(weights, expected[name], rtol=0, atol=0)


class Tokens:
    """A tokenizer stand-in for `decodable`: a source of one token a character, with <s> and </s>."""

    def encode_batch(self, texts, unknown="replace"):
        return [[1] * (len(text) + 2) for text in texts]


@pytest.mark.parametrize("last, averaged, kept", [(30.0, 20.0, "last_weights"), (20.0, 30.0, "averaged_weights"),
                                                  (25.0, 25.0, "averaged_weights")])   # a tie keeps the average
def test_average_keeps_the_weights_that_score_higher_on_validation(monkeypatch, last, averaged, kept):
    model = tiny_model()
    final = {k: v.clone() for k, v in model.state_dict().items()}
    older = {k: v + 1 if v.is_floating_point() else v for k, v in final.items()}
    mean = average_state_dicts([older, final])
    averaging = recipe.Averaging(keep=2, every=10)
    averaging.averager.snapshots.extend([(10, older), (20, final)])
    paths = lambda: {m.fused for m in model.modules() if isinstance(m, MultiHeadAttention)}   # noqa: E731

    def bleu(m, tokenizer, pairs):
        assert len(pairs) == 2 and paths() == {True}        # decoded on the path `evaluate` takes: fused
        name = next(iter(final))
        return {"bleu": last if torch.equal(m.state_dict()[name], final[name]) else averaged}
    monkeypatch.setattr(recipe, "greedy_bleu", bleu)
    recipe.use_attention(model, "explicit")                 # as it trained
    averaging.decide(model, 20, Tokens(), [("a", "b"), ("c", "d"), ("long", "x")], {"model": {"max_len": 3}})
    assert paths() == {False}
    expected = final if kept == "last_weights" else mean
    for name, weights in model.state_dict().items():
        torch.testing.assert_close(weights, expected[name], rtol=0, atol=0)
    assert averaging.record == {"snapshots": [10, 20], "every": 10, "valid_pairs": 2, "kept": kept,
                                "valid_greedy": {"last_weights": {"bleu": last}, "averaged_weights": {"bleu": averaged}}}
    assert set(averaging.extra()) == {"snapshots", "averaging"} | ({"last_weights"} if kept != "last_weights" else set())
    averaging.resume(model)          # trained further: from the last weights, decided again at the new end
    for name, weights in model.state_dict().items():
        torch.testing.assert_close(weights, final[name], rtol=0, atol=0)
    assert averaging.record is None and averaging.extra().keys() == {"snapshots"}
