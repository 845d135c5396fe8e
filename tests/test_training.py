"""Tests for transformer_lib.training (notebook 11): the label-smoothed loss equals PyTorch's, the
learning-rate schedule follows eq. 3 (times its cooldown ramp), the Trainer learns, accumulates
gradients (their mean, with DDP's no_sync), validates without counting the time, stops and resumes
exactly (same losses and weights after a crash, dropout included), checkpoints are atomic and load
safely, and bad arguments fail with clear messages."""
import ast
import math
import pickle
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import transformer_lib.training as training
from transformer_lib.data import Batch
from transformer_lib.training import (LabelSmoothingLoss, NoamSchedule, Trainer, TrainState, WeightAverager,
                                      checkpoint_callback, cooldown_factor, load_checkpoint, make_optimizer, noam_lr,
                                      save_checkpoint, translation_loss, validation_loss)

PAD, V, N_FEATURES, N_CLASSES, BATCHES_PER_EPOCH = 0, 11, 8, 4, 5
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


# ---------------------------------------------------------------- a toy task the Trainer can learn
@dataclass
class ToyBatch:
    x: Tensor
    y: Tensor

    def to(self, device) -> "ToyBatch":
        return ToyBatch(self.x.to(device), self.y.to(device))


def toy_batches(epoch: int) -> list[ToyBatch]:
    """Deterministic batches per epoch; the class is the argmax of the first 4 features."""
    generator = torch.Generator().manual_seed(1000 + epoch)
    batches = []
    for _ in range(BATCHES_PER_EPOCH):
        x = torch.randn(16, N_FEATURES, generator=generator)
        batches.append(ToyBatch(x, x[:, :N_CLASSES].argmax(-1)))
    return batches


def toy_loss(model: nn.Module, batch: ToyBatch):
    logits = model(batch.x)
    return F.cross_entropy(logits, batch.y), {"tokens": len(batch.y),
                                              "correct": int((logits.argmax(-1) == batch.y).sum())}


def toy_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(N_FEATURES, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, N_CLASSES))


def toy_trainer(max_steps=30, seed=0, log_every=5, loss_fn=toy_loss, device="cpu", cooldown=0.0, **kwargs) -> Trainer:
    model = toy_model(seed).to(device)
    optimizer, scheduler = make_optimizer(model, d_model=32, warmup_steps=10, factor=2.0, cooldown=cooldown)
    return Trainer(model, loss_fn, optimizer, toy_batches, scheduler, device=device, max_steps=max_steps,
                   log_every=log_every, progress=False, **kwargs)


def recorded(trainer: Trainer) -> list:
    losses = []
    trainer.add_callback("on_batch_end", lambda t: losses.append((t.state.step, t.last_loss)))
    return losses


# ---------------------------------------------------------------- label smoothing
@pytest.fixture
def logits_and_target():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(50, V, generator=generator) * 3
    target = torch.randint(1, V, (50,), generator=generator)
    target[::3] = PAD                                   # a third of the positions are padding
    return logits, target


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.25, 0.6])
def test_label_smoothing_equals_cross_entropy(logits_and_target, smoothing):
    logits, target = logits_and_target
    ours_logits = logits.clone().requires_grad_()
    ref_logits = logits.clone().requires_grad_()
    ours = LabelSmoothingLoss(smoothing, ignore_index=PAD)(ours_logits, target)
    reference = F.cross_entropy(ref_logits, target, ignore_index=PAD, label_smoothing=smoothing)
    torch.testing.assert_close(ours, reference)
    ours.backward()
    reference.backward()
    torch.testing.assert_close(ours_logits.grad, ref_logits.grad)


def test_smoothing_zero_is_plain_cross_entropy(logits_and_target):
    logits, target = logits_and_target
    torch.testing.assert_close(LabelSmoothingLoss(0.0, ignore_index=PAD)(logits, target),
                               F.cross_entropy(logits, target, ignore_index=PAD))
    keep = target != PAD                                # and the mean is over real tokens only
    torch.testing.assert_close(LabelSmoothingLoss(0.0, ignore_index=PAD)(logits, target),
                               -logits[keep].log_softmax(-1).gather(-1, target[keep, None]).mean())


def test_label_smoothing_half_precision_logits_computed_in_float32(logits_and_target):
    logits, target = logits_and_target
    loss = LabelSmoothingLoss(0.1, ignore_index=PAD)(logits.bfloat16(), target)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, F.cross_entropy(logits.bfloat16().float(), target, ignore_index=PAD,
                                                     label_smoothing=0.1))


def test_label_smoothing_all_padding_is_zero_not_nan():
    loss = LabelSmoothingLoss(0.1, ignore_index=PAD)(torch.randn(4, V), torch.full((4,), PAD))
    assert loss.item() == 0.0


@pytest.mark.parametrize("smoothing", [1.0, -0.1, 1.5, "0.1", None])
def test_label_smoothing_bad_smoothing(smoothing):
    with pytest.raises(ValueError, match=r"smoothing must be a number in \[0, 1\)"):
        LabelSmoothingLoss(smoothing)


def test_label_smoothing_bad_shapes():
    with pytest.raises(ValueError, match=r"expected logits \(N, V\) and target \(N,\)"):
        LabelSmoothingLoss()(torch.randn(2, 3, V), torch.ones(2, 3, dtype=torch.long))


# ---------------------------------------------------------------- schedule and optimizer
@pytest.mark.parametrize("d_model,warmup", [(512, 4000), (128, 400), (256, 50)])
def test_noam_lr_peaks_at_warmup(d_model, warmup):
    rates = [noam_lr(step, d_model, warmup) for step in range(1, 3 * warmup)]
    assert 1 + max(range(len(rates)), key=rates.__getitem__) == warmup
    assert math.isclose(max(rates), d_model ** -0.5 * warmup ** -0.5, rel_tol=1e-12)


@pytest.mark.parametrize("step", [1, 7, 399, 400, 401, 1000, 123456])
def test_noam_lr_matches_formula(step):
    d_model, warmup, factor = 128, 400, 2.0
    expected = factor * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)
    assert math.isclose(noam_lr(step, d_model, warmup, factor), expected, rel_tol=1e-12)


def test_noam_lr_step_zero_is_step_one():
    assert noam_lr(0, 512) == noam_lr(1, 512) > 0


@pytest.mark.parametrize("kwargs", [dict(d_model=0), dict(d_model=512, warmup_steps=0)])
def test_noam_lr_bad_args(kwargs):
    with pytest.raises(ValueError, match="must be positive"):
        noam_lr(10, **kwargs)


def test_make_optimizer_is_the_papers_adam():
    optimizer, _ = make_optimizer(nn.Linear(3, 3), d_model=512)
    assert isinstance(optimizer, torch.optim.Adam)
    group = optimizer.param_groups[0]
    assert group["betas"] == (0.9, 0.98) and group["eps"] == 1e-9


@pytest.mark.parametrize("k", [0, 1, 5, 60])
def test_make_optimizer_lr_after_k_scheduler_steps(k):
    optimizer, scheduler = make_optimizer(nn.Linear(3, 3), d_model=64, warmup_steps=20, factor=1.5)
    for _ in range(k):
        optimizer.step()
        scheduler.step()
    assert math.isclose(optimizer.param_groups[0]["lr"], noam_lr(k + 1, 64, 20, 1.5), rel_tol=1e-12)


# ---------------------------------------------------------------- translation_loss
def test_translation_loss_counts_real_tokens_and_correct_ones():
    batch = Batch.from_examples([([5, 6, 7], [1, 4, 5, 2]), ([5], [1, 6, 2])], pad_id=PAD)   # tgt_out [[4,5,2],[6,2,0]]

    class Oracle(nn.Module):           # predicts tgt_out everywhere except sentence 0, position 1
        def forward(self, src, tgt_in, src_key_padding_mask, tgt_key_padding_mask):
            logits = F.one_hot(batch.tgt_out, V).float() * 10
            logits[0, 1] = F.one_hot(torch.tensor(3), V).float() * 10
            return logits                                            # (B, T, V)

    loss, stats = translation_loss(Oracle(), batch, LabelSmoothingLoss(0.0, ignore_index=PAD))
    assert all(isinstance(count, Tensor) for count in stats.values())      # read at log steps only
    assert {name: int(count) for name, count in stats.items()} == {"tokens": 5, "correct": 4}
    expected = F.cross_entropy(Oracle()(None, None, None, None).reshape(-1, V), batch.tgt_out.reshape(-1),
                               ignore_index=PAD)
    torch.testing.assert_close(loss, expected)


# ---------------------------------------------------------------- the Trainer
def test_trainer_decreases_loss():
    trainer = toy_trainer(max_steps=60, log_every=10)
    state = trainer.fit()
    history = state.history
    assert [h["step"] for h in history] == [10, 20, 30, 40, 50, 60]
    assert history[-1]["loss"] < 0.6 * history[0]["loss"]
    assert history[-1]["accuracy"] > history[0]["accuracy"]
    assert all(h["tokens"] == 10 * 16 for h in history)


def test_trainer_stops_at_max_steps_across_epochs():
    events = []
    trainer = toy_trainer(max_steps=7)
    for event in Trainer.EVENTS:
        trainer.add_callback(event, lambda t, event=event: events.append(event))
    state = trainer.fit()
    assert (state.step, state.epoch, state.batch_in_epoch) == (7, 1, 2)
    assert events.count("on_batch_end") == 7 and events.count("on_epoch_end") == 1
    assert events.count("on_log") == 1 and events[-1] == "on_train_end"


def test_trainer_max_steps_zero_does_nothing():
    trainer = toy_trainer(max_steps=0)
    before = [p.clone() for p in trainer.model.parameters()]
    assert trainer.fit().step == 0
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))


def test_trainer_stops_at_time_budget():
    import time

    def slow_loss(model, batch):
        time.sleep(0.01)
        return toy_loss(model, batch)

    trainer = toy_trainer(max_steps=None, time_budget_s=0.05, loss_fn=slow_loss)
    state = trainer.fit()
    assert 1 <= state.step <= 6 and state.elapsed >= 0.05


def test_trainer_records_gradient_norm_before_clipping():
    trainer = toy_trainer(max_steps=1, grad_clip=1e-3)
    trainer.fit()
    assert trainer.last_grad_norm > 1e-3                    # the norm before clipping is reported
    assert toy_trainer(max_steps=1, grad_clip=None).last_grad_norm is None


def _resume_after_crash(tmp_path, every: int, crash_at: int, total: int = 25, log_every: int = 5, **kwargs):
    """Uninterrupted run vs a run that crashes at `crash_at` and is finished by a NEW Trainer."""
    full = toy_trainer(max_steps=total, log_every=log_every, **kwargs)
    full_losses = recorded(full)
    full.fit()

    path = tmp_path / "checkpoint.pt"
    crashing = toy_trainer(max_steps=total, log_every=log_every, **kwargs)
    crashed_losses = recorded(crashing)
    crashing.add_callback("on_batch_end", checkpoint_callback(path, every))

    def crash(t):
        if t.state.step == crash_at:
            raise KeyboardInterrupt("simulated crash")
    crashing.add_callback("on_batch_end", crash)
    with pytest.raises(KeyboardInterrupt):
        crashing.fit()

    # A new Trainer with other initial weights and another seed, as in a new process: restore must win.
    resumed = toy_trainer(max_steps=total, log_every=log_every, seed=123, **kwargs)
    resumed.restore(load_checkpoint(path))
    checkpoint_step = resumed.state.step
    resumed_losses = recorded(resumed)
    resumed.fit()
    stitched = [(s, loss) for s, loss in crashed_losses if s <= checkpoint_step] + resumed_losses
    return full, full_losses, resumed, stitched, checkpoint_step


@pytest.mark.parametrize("every,crash_at", [(10, 10), (7, 12), (5, 19)])
def test_resume_after_crash_gives_identical_run(tmp_path, every, crash_at):
    full, full_losses, resumed, stitched, checkpoint_step = _resume_after_crash(tmp_path, every, crash_at)
    assert checkpoint_step == crash_at // every * every
    assert stitched == full_losses                                    # exactly equal, step by step
    assert resumed.state.history == [{**h, "elapsed": r["elapsed"]}   # every logged value but the time
                                     for h, r in zip(full.state.history, resumed.state.history)]
    assert len(resumed.state.history) == len(full.state.history)
    for a, b in zip(resumed.model.state_dict().values(), full.model.state_dict().values()):
        assert torch.equal(a, b)
    assert not list(tmp_path.glob("*.tmp"))


def test_resume_needs_the_random_state(tmp_path):
    """Control: the toy model's dropout is active, so a resume that loses the RNG state differs."""
    full = toy_trainer(max_steps=20)
    full_losses = recorded(full)
    full.fit()
    first = toy_trainer(max_steps=10)
    first.fit()
    save_checkpoint(tmp_path / "c.pt", first.checkpoint())
    resumed = toy_trainer(max_steps=20)
    checkpoint = load_checkpoint(tmp_path / "c.pt")
    resumed.restore(checkpoint)
    torch.manual_seed(12345)                   # as if torch_rng had not been restored
    resumed_losses = recorded(resumed)
    resumed.fit()
    assert resumed_losses != full_losses[10:]


def test_checkpoint_is_plain_data_and_a_snapshot_of_state():
    trainer = toy_trainer(max_steps=10)
    trainer.fit()
    payload = trainer.checkpoint(extra={"note": "hi"})
    assert set(payload) >= {"model", "optimizer", "scheduler", "state", "log_window", "torch_rng", "extra"}
    trainer.state.history.append({"step": 99})
    assert len(payload["state"]["history"]) == 2          # later training does not change a taken checkpoint
    assert TrainState(**payload["state"]).step == 10


# ---------------------------------------------------------------- checkpoint files
def test_save_checkpoint_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "run" / "checkpoint.pt"
    save_checkpoint(path, {"step": 1, "w": torch.ones(3)})
    assert sorted(p.name for p in path.parent.iterdir()) == ["checkpoint.pt"]

    def failing_save(obj, f, *args, **kwargs):
        f.write(b"half a checkpo")                      # a partial write, then the failure
        raise OSError("disk full")
    monkeypatch.setattr(training.torch, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, {"step": 2, "w": torch.zeros(3)})
    monkeypatch.undo()
    old = load_checkpoint(path)
    assert old["step"] == 1 and torch.equal(old["w"], torch.ones(3))   # the old checkpoint is intact
    assert sorted(p.name for p in path.parent.iterdir()) == ["checkpoint.pt"]   # and no .tmp is left


class Payload:                      # pickled by reference; weights_only must refuse to build it
    def __reduce__(self):
        return (print, ("this would run while loading",))


def test_load_checkpoint_refuses_arbitrary_objects(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"model": {}, "payload": Payload()}, path)
    with pytest.raises(ValueError, match=rf"checkpoint {re.escape(str(path))} holds objects other than tensors "
                                         r"and plain values \(.*print\).*could run code") as refused:
        load_checkpoint(path)
    assert "weights_only" not in str(refused.value)        # never the advice to load it unsafely


@pytest.mark.parametrize("seed", range(5))
def test_load_checkpoint_on_random_bytes_says_it_is_not_a_checkpoint(tmp_path, seed):
    """Issue 19: random bytes gave a raw UnpicklingError that suggested weights_only=False."""
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(bytes(torch.randint(0, 256, (2000,), generator=torch.Generator().manual_seed(seed),
                                         dtype=torch.uint8).tolist()))
    with pytest.raises(ValueError) as refused:
        load_checkpoint(path)
    message = str(refused.value)
    assert message.startswith(f"{path} is not a checkpoint: torch.save writes a zip archive")
    assert "Unpickl" not in message and "weights_only" not in message and "\n" not in message


def test_load_checkpoint_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        load_checkpoint(tmp_path / "nothing.pt")


@pytest.mark.parametrize("damage", ["empty", "half", "first 100 bytes", "last 10 bytes cut", "not a checkpoint"])
def test_load_checkpoint_empty_or_truncated_names_the_file(tmp_path, damage):
    """Issue 8: a damaged file gives one clear ValueError, not EOFError, KeyError or a zip error."""
    trainer = toy_trainer(max_steps=2)
    trainer.fit()
    save_checkpoint(tmp_path / "good.pt", trainer.checkpoint())
    data = (tmp_path / "good.pt").read_bytes()
    damaged = {"empty": b"", "half": data[: len(data) // 2], "first 100 bytes": data[:100],
               "last 10 bytes cut": data[:-10], "not a checkpoint": b"hello, world"}[damage]
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(damaged)
    expected = (rf"{re.escape(str(path))} is not a checkpoint: torch.save writes a zip archive" if damage == "not a checkpoint"
                else rf"checkpoint {re.escape(str(path))} is empty or truncated \(.+\); delete it to start over or restore a copy")
    with pytest.raises(ValueError, match=expected):
        load_checkpoint(path)


def test_load_checkpoint_into_a_model_that_does_not_fit_names_parameter_and_shapes(tmp_path):
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, {"model": nn.Linear(4, 3).state_dict()})
    with pytest.raises(ValueError, match=rf"checkpoint {re.escape(str(path))} does not fit the model: weight has "
                                         r"shape \(3, 4\) in the checkpoint but \(5, 4\) in the model"):
        load_checkpoint(path, model=nn.Linear(4, 5))
    with pytest.raises(ValueError, match=r"does not fit the model: missing \['0.bias', '0.weight'\], unexpected "
                                         r"\['bias', 'weight'\]"):
        load_checkpoint(path, model=nn.Sequential(nn.Linear(4, 3)))
    model = nn.Linear(4, 3)
    checkpoint = load_checkpoint(path, model=model)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, checkpoint["model"][name])


def test_restore_into_a_model_that_does_not_fit_names_parameter_and_shapes():
    trainer = toy_trainer(max_steps=2)
    trainer.fit()
    payload = trainer.checkpoint()
    name, tensor = next(iter(payload["model"].items()))
    payload["model"] = {**payload["model"], name: torch.zeros(tensor.shape[0] + 1, *tensor.shape[1:])}
    with pytest.raises(ValueError, match=rf"{re.escape(name)} has shape .* in the checkpoint but "
                                         rf"{re.escape(str(tuple(tensor.shape)))} in the model"):
        toy_trainer(max_steps=4).restore(payload)


def test_average_state_dicts_is_the_mean_and_keeps_integers_from_the_last():
    a = {"w": torch.tensor([1.0, 3.0]), "n": torch.tensor(1)}
    b = {"w": torch.tensor([3.0, 5.0]), "n": torch.tensor(7)}
    averaged = training.average_state_dicts([a, b])
    torch.testing.assert_close(averaged["w"], torch.tensor([2.0, 4.0]))
    assert averaged["n"].item() == 7
    with pytest.raises(ValueError, match="nothing to average"):
        training.average_state_dicts([])


def test_trainer_checkpoint_loads_with_weights_only(tmp_path):
    trainer = toy_trainer(max_steps=3)
    trainer.fit()
    save_checkpoint(tmp_path / "c.pt", trainer.checkpoint({"config": {"d_model": 32}}))
    loaded = load_checkpoint(tmp_path / "c.pt")
    assert loaded["state"]["step"] == 3 and loaded["extra"] == {"config": {"d_model": 32}}


# ---------------------------------------------------------------- errors and devices
@pytest.mark.parametrize("kwargs,message", [
    (dict(max_steps=None), "give max_steps or time_budget_s"),
    (dict(amp_dtype="fp8"), "amp_dtype must be None, 'bf16' or 'fp16'"),
    (dict(grad_clip=0.0), "grad_clip must be a positive norm"),
    (dict(log_every=0), "log_every must be a positive int"),
    (dict(max_steps=-1), "max_steps must be >= 0"),
    (dict(accumulate=0), "accumulate must be a positive int"),
    (dict(accumulate=1.5), "accumulate must be a positive int"),
    (dict(accumulate=True), "accumulate must be a positive int"),
    (dict(validate_every=10), "validate_every needs validate"),
    (dict(validate=lambda m: 0.0, validate_every=7), "validate_every must be a positive multiple of log_every=5"),
    (dict(validate=lambda m: 0.0, validate_every=0), "validate_every must be a positive multiple"),
])
def test_trainer_bad_args(kwargs, message):
    with pytest.raises(ValueError, match=message):
        toy_trainer(**kwargs)


def test_bad_callback_args():
    with pytest.raises(ValueError, match="unknown event 'on_step'"):
        toy_trainer().add_callback("on_step", print)
    with pytest.raises(ValueError, match="every_steps must be a positive int"):
        checkpoint_callback("c.pt", 0)


def test_empty_epoch_is_an_error():
    trainer = toy_trainer()
    trainer.batches_for_epoch = lambda epoch: []
    with pytest.raises(ValueError, match="epoch 0 has no batches"):
        trainer.fit()


def weights_after(steps: int, **kwargs) -> list[Tensor]:
    trainer = toy_trainer(max_steps=steps, **kwargs)
    trainer.fit()
    return [p.detach().clone() for p in trainer.model.parameters()]


def assert_weights_equal(model: nn.Module, expected: list[Tensor]) -> None:
    for p, q in zip(model.parameters(), expected, strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_nan_loss_stops_with_a_clear_message_and_the_weights_of_the_last_good_step():
    """The guard runs on the device: the bad update (and every later one) is skipped, so the weights,
    Adam's moments and step count are those after step 2, and the next log step (5) raises."""
    def nan_at_three(model, batch, calls=[]):
        calls.append(1)
        loss, stats = toy_loss(model, batch)
        return (loss * float("nan") if len(calls) == 3 else loss), stats

    trainer = toy_trainer(loss_fn=nan_at_three, log_every=5)
    with pytest.raises(FloatingPointError, match="loss is nan at step 3; the update of step 3 was skipped, and every "
                                                 "one after it, so the weights are not spoiled; training stopped at "
                                                 "step 5. Lower the learning rate"):
        trainer.fit()
    assert trainer.state.step == 5 and trainer.state.history == []   # the bad window is never logged
    assert_weights_equal(trainer.model, weights_after(2))
    assert all(int(s["step"]) == 2 for s in trainer.optimizer.state.values())   # Adam did not count the skipped steps


def test_non_finite_gradient_with_a_finite_loss_is_caught_too():
    def inf_gradient_at_two():
        calls = []

        def loss_fn(model, batch):
            calls.append(1)
            loss, stats = toy_loss(model, batch)
            if len(calls) == 2:             # sqrt'(0) is infinite: the loss stays finite, the gradient does not
                loss = loss + torch.sqrt(model[0].weight.sum() * 0)
            return loss, stats
        return loss_fn

    for grad_clip in (1.0, None):
        trainer = toy_trainer(loss_fn=inf_gradient_at_two(), log_every=3, grad_clip=grad_clip)
        with pytest.raises(FloatingPointError, match=r"gradient norm is (nan|inf) \(loss \d.*\) at step 2"):
            trainer.fit()
        assert_weights_equal(trainer.model, weights_after(1, grad_clip=grad_clip))


def test_a_fault_after_the_last_log_is_raised_at_the_end_and_blocks_checkpoints(tmp_path):
    def nan_at_seven(model, batch, calls=[]):
        calls.append(1)
        loss, stats = toy_loss(model, batch)
        return (loss * float("nan") if len(calls) == 7 else loss), stats

    trainer = toy_trainer(loss_fn=nan_at_seven, max_steps=8, log_every=5)
    with pytest.raises(FloatingPointError, match="loss is nan at step 7.*training stopped at step 8"):
        trainer.fit()                                               # no log step after 7: the end of fit raises
    with pytest.raises(FloatingPointError, match="at step 7"):
        save_checkpoint(tmp_path / "c.pt", trainer.checkpoint())    # a run with skipped updates is never saved
    assert not (tmp_path / "c.pt").exists()
    assert_weights_equal(trainer.model, weights_after(6))


def guarded_updates(scaler, fused: bool, fault_at: int | None = None, overflow_at: int | None = None):
    """The weight w (from 1, gradient 2) after each of 2 updates driven through a StepGuard as
    Trainer.train_step drives it, and the guard: with a GradScaler (the Trainer's fp16 path; a CPU scaler
    runs the same code) the loss is scaled and the gradients unscaled before the guard. `fault_at`: a
    target id outside the vocabulary is flagged; `overflow_at`: the scaled gradient is infinite."""
    model = nn.Linear(1, 1, bias=False)
    nn.init.ones_(model.weight)
    try:
        optimizer = (torch.optim.Adam(model.parameters(), lr=0.1, fused=True) if fused    # skips on the device
                     else torch.optim.SGD(model.parameters(), lr=0.1))                     # the host reads the flag
    except RuntimeError:
        pytest.skip("this PyTorch has no fused Adam on the CPU (torch < 2.4)")
    guard, weights = training.StepGuard(torch.device("cpu"), None, scaler), []
    for step in (1, 2):
        optimizer.zero_grad()
        loss = model(torch.tensor([[2.0]])).sum()
        (scaler.scale(loss) if scaler else loss).backward()
        if step == overflow_at:
            model.weight.grad.fill_(float("inf"))
        if scaler:
            scaler.unscale_(optimizer)
        norm = guard.grad_norm_and_clip(model)
        checks = [(torch.tensor(step == fault_at), torch.tensor(7), 5, "target id")]
        guard.optimizer_step(optimizer, guard.skip(loss.detach(), norm, checks, step))
        weights.append(model.weight.item())
    return weights, guard


@pytest.mark.parametrize("fused", [False, True], ids=["sgd", "fused-adam"])
@pytest.mark.parametrize("fp16_scaler", [False, True], ids=["no-scaler", "grad-scaler"])
def test_a_flagged_update_and_every_later_one_are_skipped_with_a_grad_scaler_too(fp16_scaler, fused):
    """fp16 steps through a GradScaler, which skips only an overflow: the guard's skip must hold there
    too (it once did not: with a scaler, w went 1 -> 0.8 -> 0.6 after a flagged step 1)."""
    weights, guard = guarded_updates(torch.amp.GradScaler("cpu") if fp16_scaler else None, fused, fault_at=1)
    assert weights == [1.0, 1.0]
    with pytest.raises(ValueError, match=r"target id 7 at step 1 is outside the vocabulary of V = 5 ids \(0 to 4\); "
                                         "the update of step 1 was skipped, and every one after it, so the weights "
                                         "are not spoiled; training stopped at step 2"):
        guard.raise_on_fault(2)


@pytest.mark.parametrize("fused", [False, True], ids=["sgd", "fused-adam"])
def test_an_fp16_overflow_skips_that_update_alone_and_lowers_the_scale(fused):
    """An overflow of the scaled gradients is the GradScaler's business, not a fault: that update is
    skipped, the scale halves, no error is raised and the next update is taken."""
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    weights, guard = guarded_updates(scaler, fused, overflow_at=1)
    assert weights[0] == 1.0 and weights[1] < 1.0 and scaler.get_scale() == 512.0
    guard.raise_on_fault(2)                                  # no fault recorded

def test_cpu_autocast_is_bf16_only():
    assert toy_trainer(amp_dtype="fp16").autocast_dtype is None      # fp16 on a CPU: off, float32
    trainer = toy_trainer(amp_dtype="bf16", max_steps=60, log_every=10)
    assert trainer.autocast_dtype == torch.bfloat16 and trainer.scaler is None
    seen = []
    trainer.loss_fn = lambda m, b: (seen.append(m(b.x).dtype), toy_loss(m, b))[1]
    history = trainer.fit().history
    assert seen[0] == torch.bfloat16                                  # the matmuls really ran in bf16
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())   # the weights stay float32
    assert history[-1]["loss"] < 0.6 * history[0]["loss"]


# ---------------------------------------------------------------- checkpoint averaging
def test_weight_averager_keeps_the_last_snapshots_and_the_final_one():
    trainer = toy_trainer(max_steps=23)
    averager = WeightAverager(every_steps=5, keep=3).attach(trainer)
    seen = {}
    trainer.add_callback("on_batch_end", lambda t: seen.update({t.state.step: {
        k: v.clone() for k, v in t.model.state_dict().items()}}))
    trainer.fit()
    assert averager.steps == [15, 20, 23]                       # every 5 steps, plus the end; the last 3
    averaged = averager.average()
    for name, value in averaged.items():
        torch.testing.assert_close(value, (seen[15][name] + seen[20][name] + seen[23][name]) / 3)
    model = toy_model()
    model.load_state_dict(averaged)                              # a state dict the model accepts
    averaged["0.weight"].add_(1.0)                               # and a copy: the snapshots are untouched
    torch.testing.assert_close(averager.snapshots[-1][1]["0.weight"], seen[23]["0.weight"])


def test_weight_averager_copies_integer_buffers_from_the_newest_snapshot():
    averager = WeightAverager(every_steps=1, keep=2)
    for step, count in ((1, 3), (2, 8)):
        averager.snapshots.append((step, {"w": torch.tensor([float(step)]), "n": torch.tensor(count)}))
    averaged = averager.average()
    assert averaged["w"].item() == 1.5 and averaged["n"].item() == 8 and averaged["n"].dtype == torch.int64


@pytest.mark.parametrize("kwargs, message", [(dict(every_steps=0), "every_steps must be a positive int"),
                                             (dict(every_steps=10, keep=0), "keep must be a positive int"),
                                             (dict(every_steps=2.5), "every_steps must be a positive int")])
def test_weight_averager_bad_args(kwargs, message):
    with pytest.raises(ValueError, match=message):
        WeightAverager(**kwargs)


def test_weight_averager_without_snapshots_says_what_to_do():
    with pytest.raises(ValueError, match=r"no snapshot to average yet: attach\(\) the averager"):
        WeightAverager(every_steps=10).average()


@pytest.mark.parametrize("module", ["training", "schedule", "checkpoints", "step_guard"])
def test_training_modules_import_nothing_from_the_model_side(module):
    """Notebook 11's modules are on the text side: the trainer knows nothing about the model."""
    path = Path(training.__file__).with_name(f"{module}.py")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    model_side = {"embeddings", "positional", "attention", "multihead", "sublayers", "encoder", "decoder", "model",
                  "decoding", "evaluation", "attention_map", "cli", "train_run", "runs", "settings", "course"}
    assert not {name.rsplit(".", 1)[-1] for name in imported} & model_side, imported


@CUDA
@pytest.mark.parametrize("amp_dtype", [None, "bf16", "fp16"])
def test_cuda_training_learns(amp_dtype):
    trainer = toy_trainer(max_steps=60, log_every=10, device="cuda", amp_dtype=amp_dtype)
    assert (trainer.scaler is not None) == (amp_dtype == "fp16")
    history = trainer.fit().history
    assert history[-1]["loss"] < 0.6 * history[0]["loss"]


@CUDA
def test_cuda_resume_from_checkpoint_mapped_to_gpu(tmp_path):
    """The CLI loads checkpoints with map_location=device; restoring RNG states must still work."""
    trainer = toy_trainer(max_steps=5, device="cuda")
    trainer.fit()
    save_checkpoint(tmp_path / "c.pt", trainer.checkpoint())
    resumed = toy_trainer(max_steps=10, device="cuda")
    resumed.restore(load_checkpoint(tmp_path / "c.pt", map_location="cuda"))
    assert resumed.fit().step == 10


def bad_target_loss(at_call: int):
    """A loss function whose `at_call`-th call gets a target id outside the vocabulary (a fresh counter
    for each function made)."""
    criterion, calls = LabelSmoothingLoss(0.0, ignore_index=-1), []

    def loss(model, batch):
        calls.append(1)
        target = batch.y.clone()
        if len(calls) == at_call:
            target[4] = N_CLASSES + 2
        return criterion(model(batch.x), target), {"tokens": len(target)}
    return loss


@CUDA
def test_cuda_fp16_skips_a_flagged_update_and_every_later_one():
    """The Trainer's fp16 path (GradScaler, fused Adam): a target id outside the vocabulary at step 3
    leaves the weights and Adam's step count as they were after step 2, up to the log step that raises."""
    loss_with_a_bad_target_at_three = bad_target_loss(at_call=3)
    trainer = toy_trainer(loss_fn=loss_with_a_bad_target_at_three, log_every=5, device="cuda", amp_dtype="fp16")
    assert trainer.scaler is not None
    after_two = []
    trainer.add_callback("on_batch_end", lambda t: after_two.extend(
        p.detach().clone() for p in t.model.parameters()) if t.state.step == 2 else None)
    with pytest.raises(ValueError, match=rf"target id {N_CLASSES + 2} at step 3 .*; the update of step 3 was "
                                         "skipped, and every one after it"):
        trainer.fit()
    assert trainer.state.step == 5
    assert_weights_equal(trainer.model, after_two)
    assert all(int(s["step"]) == 2 for s in trainer.optimizer.state.values())   # Adam did not count them


# ---------------------------------------------------------------- the cooldown in the schedule
@pytest.mark.parametrize("cooldown", [0.1, 0.25, 0.5])
def test_schedule_lr_at_progress_is_noam_times_the_ramp(cooldown):
    optimizer, scheduler = make_optimizer(nn.Linear(3, 3), d_model=64, warmup_steps=20, factor=1.5, cooldown=cooldown)
    progresses = [0.0, 0.1, 0.4, 0.6, 0.75, 0.8, 0.9, 0.95, 0.99, 1.0]
    for k, p in enumerate(progresses, start=1):
        optimizer.step()
        scheduler.step(progress=p)
        expected = noam_lr(k + 1, 64, 20, 1.5) * min(1.0, (1 - p) / cooldown)
        assert math.isclose(optimizer.param_groups[0]["lr"], expected, rel_tol=1e-12, abs_tol=1e-15), (k, p)
    assert optimizer.param_groups[0]["lr"] == 0.0                        # progress 1: the end of the run


def test_schedule_stepped_by_plain_pytorch_uses_max_steps_and_reaches_zero():
    optimizer, scheduler = make_optimizer(nn.Linear(3, 3), d_model=64, warmup_steps=20, cooldown=0.3, max_steps=50)
    rates = []
    for _ in range(50):
        rates.append(optimizer.param_groups[0]["lr"])                   # the rate of update k + 1
        optimizer.step()
        scheduler.step()
    for k, rate in enumerate(rates):
        assert math.isclose(rate, noam_lr(k + 1, 64, 20) * cooldown_factor(k / 50, 0.3), rel_tol=1e-12)
    assert rates[34] == noam_lr(35, 64, 20) and rates[36] < noam_lr(37, 64, 20)   # the ramp starts at p = 0.7
    assert optimizer.param_groups[0]["lr"] == 0.0


def test_schedule_without_max_steps_or_progress_has_no_cooldown():
    optimizer, scheduler = make_optimizer(nn.Linear(3, 3), d_model=64, warmup_steps=20, cooldown=0.5)
    for k in range(1, 40):
        optimizer.step()
        scheduler.step()
        assert optimizer.param_groups[0]["lr"] == noam_lr(k + 1, 64, 20)


def test_cooldown_zero_keeps_the_old_lambda_lr_numbers_exactly():
    optimizer, scheduler = make_optimizer(nn.Linear(3, 3), d_model=128, warmup_steps=30, factor=0.7, max_steps=60)
    old_optimizer = torch.optim.Adam(nn.Linear(3, 3).parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    old = torch.optim.lr_scheduler.LambdaLR(old_optimizer, lambda step: noam_lr(step + 1, 128, 30, 0.7))
    for _ in range(80):
        assert optimizer.param_groups[0]["lr"] == old_optimizer.param_groups[0]["lr"]
        for opt, sched in ((optimizer, scheduler), (old_optimizer, old)):
            opt.step()
            sched.step(progress=0.99) if sched is scheduler else sched.step()


def test_schedule_restored_from_state_dict_continues_the_same_rates():
    def schedule():
        return make_optimizer(nn.Linear(3, 3), d_model=64, warmup_steps=10, cooldown=0.4)

    optimizer, scheduler = schedule()
    rates = []
    for k in range(30):
        optimizer.step()
        scheduler.step(progress=(k + 1) / 30)
        if k == 19:
            saved = scheduler.state_dict()
            saved = {**saved, "base_lrs": list(saved["base_lrs"])}
        rates.append(optimizer.param_groups[0]["lr"])
    other_optimizer, other = schedule()
    other.load_state_dict(saved)
    assert other.progress == 20 / 30 and other.last_epoch == 20
    resumed = []
    for k in range(20, 30):
        other_optimizer.step()
        other.step(progress=(k + 1) / 30)
        resumed.append(other_optimizer.param_groups[0]["lr"])
    assert resumed == rates[20:]


@pytest.mark.parametrize("kwargs,message", [
    (dict(cooldown=1.0), r"cooldown must be a share of the run in \[0, 1\)"),
    (dict(cooldown=-0.1), r"cooldown must be a share of the run in \[0, 1\)"),
    (dict(cooldown="0.2"), r"cooldown must be a share of the run in \[0, 1\)"),
    (dict(cooldown=True), r"cooldown must be a share of the run in \[0, 1\)"),
    (dict(max_steps=0), "max_steps must be a positive int or None"),
    (dict(warmup_steps=0), "must be positive"),
])
def test_schedule_bad_args(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_optimizer(nn.Linear(3, 3), d_model=64, **kwargs)


def test_trainer_drives_the_cooldown_by_its_step_budget_and_lands_on_zero():
    trainer = toy_trainer(max_steps=20, cooldown=0.5)
    assert isinstance(trainer.scheduler, NoamSchedule)
    rates = []
    trainer.add_callback("on_batch_end", lambda t: rates.append(t.optimizer.param_groups[0]["lr"]))
    trainer.fit()
    for k, rate in enumerate(rates, start=1):               # after update k: the rate of update k + 1
        assert math.isclose(rate, noam_lr(k + 1, 32, 10, 2.0) * min(1.0, (1 - k / 20) / 0.5), rel_tol=1e-12)
    assert rates[-1] == 0.0 and trainer.state.history[-1]["lr"] == 0.0


def test_run_progress_is_the_larger_share_of_steps_and_time():
    trainer = toy_trainer(max_steps=100, time_budget_s=10.0)
    trainer.state.step, trainer.state.elapsed = 30, 2.0
    assert trainer.run_progress() == 0.3
    trainer.state.elapsed = 5.0
    assert trainer.run_progress() == 0.5
    trainer.state.step, trainer.state.elapsed = 100, 20.0
    assert trainer.run_progress() == 1.0
    only_time = toy_trainer(max_steps=None, time_budget_s=4.0)
    only_time.state.step, only_time.state.elapsed = 1000, 1.0
    assert only_time.run_progress() == 0.25


def test_time_budget_cooldown_reaches_low_rates_at_the_end():
    def slow_loss(model, batch):
        time.sleep(0.005)
        return toy_loss(model, batch)

    trainer = toy_trainer(max_steps=None, time_budget_s=0.2, loss_fn=slow_loss, cooldown=0.5)
    progress = []
    trainer.add_callback("on_batch_end", lambda t: progress.append((t.run_progress(), t.scheduler.progress)))
    trainer.fit()
    assert all(a == b for a, b in progress)                 # the scheduler got the Trainer's progress
    assert trainer.optimizer.param_groups[0]["lr"] == 0.0   # the budget is used up: the rate is 0


# ---------------------------------------------------------------- gradient accumulation
def plain_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)                                  # no dropout: gradients are deterministic
    return nn.Sequential(nn.Linear(N_FEATURES, 32), nn.ReLU(), nn.Linear(32, N_CLASSES))


@pytest.mark.parametrize("grad_clip", [None, 0.05])
def test_accumulate_two_is_one_update_with_the_mean_gradient(grad_clip):
    b0, b1 = toy_batches(0)[:2]
    model = plain_model()
    optimizer, scheduler = make_optimizer(model, d_model=32, warmup_steps=10, factor=2.0)
    trainer = Trainer(model, toy_loss, optimizer, lambda epoch: [b0, b1], scheduler, max_steps=1, accumulate=2,
                      grad_clip=grad_clip, progress=False, log_every=1)
    trainer.fit()

    reference = plain_model()
    ref_optimizer, _ = make_optimizer(reference, d_model=32, warmup_steps=10, factor=2.0)
    grads = []
    for batch in (b0, b1):                                   # each batch's gradient on its own
        reference.zero_grad()
        toy_loss(reference, batch)[0].backward()
        grads.append([p.grad.clone() for p in reference.parameters()])
    for p, g0, g1 in zip(reference.parameters(), *grads):
        p.grad = (g0 + g1) / 2
    if grad_clip:
        nn.utils.clip_grad_norm_(reference.parameters(), grad_clip)
    ref_optimizer.step()
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b)
    expected_loss = (toy_loss(plain_model(), b0)[0].item() + toy_loss(plain_model(), b1)[0].item()) / 2
    assert math.isclose(trainer.last_loss, expected_loss, rel_tol=1e-6)
    entry = trainer.state.history[0]
    assert math.isclose(entry["loss"], expected_loss, rel_tol=1e-6) and entry["tokens"] == 32


def test_accumulate_counts_updates_and_batches_and_drops_the_incomplete_group():
    seen = []

    def recording_loss(model, batch):
        seen.append(batch.x[0, 0].item())
        return toy_loss(model, batch)

    trainer = toy_trainer(max_steps=7, accumulate=2, loss_fn=recording_loss)
    state = trainer.fit()
    assert (state.step, state.epoch, state.batch_in_epoch) == (7, 3, 2)   # 2 updates of 4 batches per epoch
    expected = [b.x[0, 0].item() for epoch in range(4) for b in toy_batches(epoch)[:4]][:14]
    assert seen == expected                                               # batch 5 of each epoch is skipped


def test_accumulate_more_than_the_epoch_has_is_an_error():
    with pytest.raises(ValueError, match="epoch 0 has 5 batches, fewer than accumulate=6"):
        toy_trainer(accumulate=6).fit()


@pytest.mark.parametrize("every,crash_at", [(3, 7), (4, 4)])
def test_accumulate_and_cooldown_resume_exactly(tmp_path, every, crash_at):
    full, full_losses, resumed, stitched, checkpoint_step = _resume_after_crash(
        tmp_path, every, crash_at, total=12, log_every=2, accumulate=2, cooldown=0.4)
    assert checkpoint_step == crash_at // every * every
    assert stitched == full_losses
    assert resumed.state.history == [{**h, "elapsed": r["elapsed"]}   # lr included: the same cooldown
                                     for h, r in zip(full.state.history, resumed.state.history)]
    assert (resumed.state.step, resumed.state.batch_in_epoch) == (full.state.step, full.state.batch_in_epoch)
    for a, b in zip(resumed.model.state_dict().values(), full.model.state_dict().values()):
        assert torch.equal(a, b)


class NoSyncCounter(nn.Module):
    """A stand-in for DistributedDataParallel: records, for every backward, whether no_sync was on."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module, self.inside, self.no_sync_calls, self.backward_inside = module, False, 0, []

    @contextmanager
    def no_sync(self):
        self.no_sync_calls += 1
        self.inside = True
        try:
            yield
        finally:
            self.inside = False

    def forward(self, x):
        out = self.module(x)
        out.register_hook(lambda grad: self.backward_inside.append(self.inside))
        return out


@pytest.mark.parametrize("accumulate", [1, 3])
def test_accumulate_skips_gradient_sync_for_all_micro_batches_but_the_last(accumulate):
    model = NoSyncCounter(plain_model())
    optimizer, scheduler = make_optimizer(model, d_model=32, warmup_steps=10)
    trainer = Trainer(model, toy_loss, optimizer, toy_batches, scheduler, max_steps=1, accumulate=accumulate,
                      progress=False)
    trainer.fit()
    assert model.no_sync_calls == accumulate - 1
    assert model.backward_inside == [True] * (accumulate - 1) + [False]


# ---------------------------------------------------------------- validation loss
def test_validation_loss_is_token_weighted_in_eval_mode_and_restores_the_mode():
    model = toy_model()
    batches = [ToyBatch(b.x[:n], b.y[:n]) for b, n in zip(toy_batches(3)[:3], (2, 16, 5))]
    model.eval()
    with torch.no_grad():
        expected = sum(F.cross_entropy(model(b.x), b.y, reduction="sum").item() for b in batches) / (2 + 16 + 5)
    model.train()
    got = validation_loss(model, batches, toy_loss)
    assert math.isclose(got, expected, rel_tol=1e-6)
    assert model.training                                          # back in training mode
    assert validation_loss(model, batches, toy_loss) == got        # dropout off: the same every time
    assert all(p.grad is None for p in model.parameters())         # no gradients
    model.eval()
    validation_loss(model, batches, toy_loss)
    assert not model.training                                      # a model in eval mode stays there
    with pytest.raises(ValueError, match="no validation batches"):
        validation_loss(model, [], toy_loss)


def test_trainer_stores_valid_loss_in_the_history_without_timing_it_or_changing_training():
    valid = toy_batches(99)[:2]
    calls = []

    def slow_validate(model):
        calls.append(model.training)
        time.sleep(0.5)
        return validation_loss(model, valid, toy_loss)

    trainer = toy_trainer(max_steps=20, log_every=5, validate=slow_validate, validate_every=10)
    losses = recorded(trainer)
    start = time.perf_counter()
    trainer.fit()
    wall = time.perf_counter() - start
    assert [("valid_loss" in h) for h in trainer.state.history] == [False, True, False, True]
    assert trainer.state.history[-1]["valid_loss"] == validation_loss(trainer.model, valid, toy_loss)
    assert len(calls) == 2 and wall - trainer.state.elapsed >= 1.0   # the 1 s of validation is not training time
    plain = toy_trainer(max_steps=20, log_every=5)
    plain_losses = recorded(plain)
    plain.fit()
    assert losses == plain_losses                                # validating draws no random numbers
    assert toy_trainer(validate=lambda m: 0.0).validate_every == 5   # default: every log


def test_schedule_state_dict_leaves_the_settings_so_a_resumed_run_can_cool_down():
    optimizer, scheduler = make_optimizer(nn.Linear(3, 3), d_model=64, warmup_steps=10)      # no cooldown
    for k in range(20):
        optimizer.step()
        scheduler.step(progress=(k + 1) / 40)
    assert "cooldown" not in scheduler.state_dict() and scheduler.state_dict()["progress"] == 0.5
    cooled_optimizer, cooled = make_optimizer(nn.Linear(3, 3), d_model=64, warmup_steps=10, cooldown=0.25)
    cooled.load_state_dict(scheduler.state_dict())
    for k in range(20, 40):
        cooled_optimizer.step()
        cooled.step(progress=(k + 1) / 40)
        expected = noam_lr(k + 2, 64, 10) * min(1.0, (1 - (k + 1) / 40) / 0.25)
        assert math.isclose(cooled_optimizer.param_groups[0]["lr"], expected, rel_tol=1e-12, abs_tol=1e-15)
    assert cooled.cooldown == 0.25 and cooled_optimizer.param_groups[0]["lr"] == 0.0


@pytest.mark.parametrize("device,amp_dtype", [("cpu", None), ("cpu", "bf16"),
                                              pytest.param("cuda", None, marks=CUDA),
                                              pytest.param("cuda", "bf16", marks=CUDA),
                                              pytest.param("cuda", "fp16", marks=CUDA)])
def test_accumulating_training_learns(device, amp_dtype):
    trainer = toy_trainer(max_steps=30, log_every=10, device=device, amp_dtype=amp_dtype, accumulate=2, cooldown=0.2)
    history = trainer.fit().history
    assert history[-1]["loss"] < 0.6 * history[0]["loss"] and history[-1]["lr"] == 0.0
    assert all(h["tokens"] == 10 * 2 * 16 for h in history)           # 10 updates of 2 batches of 16


# ---------------------------------------------------------------- a step that never waits for the device
HOST_READS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "cpu", "numpy")


def sync_free_loss(model: nn.Module, batch: ToyBatch):
    """toy_loss without its int(): the counts stay tensors, as translation_loss returns them."""
    logits = model(batch.x)
    return F.cross_entropy(logits, batch.y), {"tokens": len(batch.y), "correct": (logits.argmax(-1) == batch.y).sum()}


@contextmanager
def counting_host_reads(trainer: Trainer):
    """Count every Tensor → host read, split by whether it happens inside a log, a guard report or the end
    of training (allowed) or anywhere else in fit (a step: not allowed)."""
    reads, allowed = {"step": [], "log": []}, [0]
    originals = {name: getattr(Tensor, name) for name in HOST_READS}

    def counted(name):
        def read(self, *args, **kwargs):
            reads["log" if allowed[0] else "step"].append((name, trainer.state.step))
            return originals[name](self, *args, **kwargs)
        return read

    def allowing(method):
        def run(*args, **kwargs):
            allowed[0] += 1
            try:
                return method(*args, **kwargs)
            finally:
                allowed[0] -= 1
        return run

    trainer._log = allowing(trainer._log)
    trainer._raise_on_fault = allowing(trainer._raise_on_fault)
    for name in HOST_READS:
        setattr(Tensor, name, counted(name))
    try:
        yield reads
    finally:
        for name, method in originals.items():
            setattr(Tensor, name, method)


@pytest.mark.parametrize("accumulate,grad_clip", [(1, 1.0), (2, 1.0), (1, None)])
def test_a_training_step_reads_nothing_from_the_device_outside_log_steps(accumulate, grad_clip):
    trainer = toy_trainer(max_steps=6, log_every=3, loss_fn=sync_free_loss, accumulate=accumulate, grad_clip=grad_clip)
    if not getattr(trainer.optimizer, "_step_supports_amp_scaling", False):
        pytest.skip("this PyTorch has no fused Adam on the CPU (torch < 2.4): the guard reads its flag on the host")
    with counting_host_reads(trainer) as reads:
        trainer.fit()
    assert reads["step"] == []
    assert {step for _, step in reads["log"]} == {3, 6}          # the counter does see the reads of the logs
    assert [h["step"] for h in trainer.state.history] == [3, 6] and trainer.state.history[-1]["tokens"] == 3 * 16 * accumulate


def test_the_counter_catches_a_loss_that_reads_the_device():
    trainer = toy_trainer(max_steps=4, log_every=10)               # toy_loss does int((...).sum()) every step
    with counting_host_reads(trainer) as reads:
        trainer.fit()
    assert {step for _, step in reads["step"]} == {0, 1, 2, 3}


def test_translation_loss_in_a_trainer_step_reads_nothing_from_the_device():
    pairs = [([5, 6, 7, 8][: 1 + i % 4], [1] + [3 + (i + j) % 7 for j in range(1 + i % 3)] + [2]) for i in range(32)]
    batches = [Batch.from_examples(pairs[i:i + 8], pad_id=PAD) for i in range(0, 32, 8)]

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.out = nn.Embedding(V, 16), nn.Linear(16, V)

        def forward(self, src, tgt_in, src_key_padding_mask, tgt_key_padding_mask):
            return self.out(self.embed(tgt_in) + self.embed(src).mean(1, keepdim=True))   # (B, T, V)

    torch.manual_seed(0)
    model = Tiny()
    optimizer, scheduler = make_optimizer(model, d_model=16, warmup_steps=4)
    criterion = LabelSmoothingLoss(0.1, ignore_index=PAD)
    trainer = Trainer(model, lambda m, b: translation_loss(m, b, criterion), optimizer, lambda epoch: batches,
                      scheduler, max_steps=8, log_every=4, progress=False)
    if not getattr(optimizer, "_step_supports_amp_scaling", False):
        pytest.skip("this PyTorch has no fused Adam on the CPU (torch < 2.4)")
    with counting_host_reads(trainer) as reads:
        trainer.fit()
    assert reads["step"] == [] and trainer.state.history[-1]["tokens"] == sum(b.n_target_tokens for b in batches)


@CUDA
def test_cuda_step_never_synchronizes():
    """On a GPU, torch raises on any synchronizing call inside a step (sync debug mode "error")."""
    trainer = toy_trainer(max_steps=4, log_every=2, loss_fn=sync_free_loss, device="cuda")
    assert trainer.optimizer.param_groups[0]["fused"]
    steps_run = []
    original = trainer.train_step

    def strict_step(batches):
        torch.cuda.set_sync_debug_mode("error")
        try:
            return original(batches)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            steps_run.append(1)

    trainer.train_step = strict_step
    trainer.fit()
    assert len(steps_run) == 4 and [h["step"] for h in trainer.state.history] == [2, 4]


def test_make_optimizer_is_fused_where_pytorch_has_the_kernel():
    optimizer, _ = make_optimizer(nn.Linear(3, 3), d_model=32)
    group = optimizer.param_groups[0]
    try:
        torch.optim.Adam(nn.Linear(3, 3).parameters(), fused=True)
        assert group["fused"] and getattr(optimizer, "_step_supports_amp_scaling", False)
    except RuntimeError:                                    # no fused kernel on this device/PyTorch
        assert group["foreach"] and not group["fused"]


def test_restore_keeps_this_optimizers_kernel(tmp_path):
    trainer = toy_trainer(max_steps=3)
    trainer.fit()
    payload = trainer.checkpoint()
    for group in payload["optimizer"]["param_groups"]:
        group.update(fused=None, foreach=None)            # as saved by a machine without the fused kernel
    resumed = toy_trainer(max_steps=6)
    kernel = {key: resumed.optimizer.param_groups[0][key] for key in ("fused", "foreach")}
    resumed.restore(payload)
    assert {key: resumed.optimizer.param_groups[0][key] for key in ("fused", "foreach")} == kernel
    assert resumed.fit().step == 6


# ---------------------------------------------------------------- targets outside the vocabulary
@pytest.mark.parametrize("bad", [V, V + 5, -3])
def test_label_smoothing_with_a_target_outside_the_vocabulary_names_it_and_V(logits_and_target, bad):
    logits, target = logits_and_target
    target = target.clone()
    target[7] = bad
    with pytest.raises(ValueError, match=rf"target id {bad} is outside the logits' vocabulary of V = {V} ids "
                                         rf"\(0 to {V - 1}; {PAD} marks padding\)"):
        LabelSmoothingLoss(0.1, ignore_index=PAD)(logits, target)


def test_label_smoothing_accepts_an_ignore_index_outside_the_vocabulary(logits_and_target):
    logits, target = logits_and_target
    target = torch.where(target == PAD, -100, target)
    torch.testing.assert_close(LabelSmoothingLoss(0.1, ignore_index=-100)(logits, target),
                               F.cross_entropy(logits, target, label_smoothing=0.1))


def test_out_of_vocabulary_target_in_a_trainer_step_is_reported_at_the_log_step_without_a_sync():
    """Inside a step the check is recorded on the device (no host read), the update skipped, and the
    next log step raises the ValueError with the id and V."""
    loss_with_a_bad_target_at_three = bad_target_loss(at_call=3)
    trainer = toy_trainer(loss_fn=loss_with_a_bad_target_at_three, log_every=5)
    with counting_host_reads(trainer) as reads:
        with pytest.raises(ValueError, match=rf"target id {N_CLASSES + 2} at step 3 is outside the vocabulary "
                                             rf"of V = {N_CLASSES} ids \(0 to {N_CLASSES - 1}\); the update of step 3 "
                                             "was skipped"):
            trainer.fit()
    if getattr(trainer.optimizer, "_step_supports_amp_scaling", False):
        assert reads["step"] == []
    assert_weights_equal(trainer.model, weights_after(2))


def test_defer_id_check_records_on_the_device_only_inside_a_step():
    from transformer_lib.device import defer_id_check, deferred_id_checks
    ids = torch.tensor([[3, 12], [-1, 14]])
    assert defer_id_check(ids, 12, "token id") is None              # outside: the caller checks on the host
    with deferred_id_checks() as found:
        wrong = defer_id_check(ids, 12, "token id", ignore_index=-1)
    assert wrong.tolist() == [[False, True], [False, True]]
    (any_wrong, first, V, what), = found
    assert (bool(any_wrong), int(first), V, what) == (True, 12, 12, "token id")


def test_an_embedding_style_check_deferred_in_a_step_is_named_by_its_own_words():
    """Any module can defer its id check (e.g. a token embedding): the Trainer names it as the module said."""
    from transformer_lib.device import defer_id_check

    def loss_with_bad_token_ids_at_two(model, batch, calls=[]):
        calls.append(1)
        ids = torch.full((3,), 99 if len(calls) == 2 else 1)
        defer_id_check(ids, 50, "token id")
        return sync_free_loss(model, batch)

    trainer = toy_trainer(loss_fn=loss_with_bad_token_ids_at_two, log_every=4)
    with pytest.raises(ValueError, match=r"token id 99 at step 2 is outside the vocabulary of V = 50 ids \(0 to 49\)"):
        trainer.fit()
    assert_weights_equal(trainer.model, weights_after(1))


def test_load_checkpoint_of_a_folder_or_of_something_else(tmp_path):
    """A folder and a saved list used to give raw errors."""
    with pytest.raises(ValueError, match=r"is a folder, not a checkpoint file"):
        load_checkpoint(tmp_path)
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(ValueError, match=r"list.pt holds a list, not a checkpoint"):
        load_checkpoint(tmp_path / "list.pt")


def test_average_of_state_dicts_of_different_models_is_refused():
    """It used to return an average (or fail inside torch.stack)."""
    from transformer_lib.training import average_state_dicts
    two_layers = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)).state_dict()
    one_layer = nn.Sequential(nn.Linear(4, 4)).state_dict()
    wider = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 4)).state_dict()
    with pytest.raises(ValueError, match=r"state dict 0 is not of the same model .*entries differ"):
        average_state_dicts([two_layers, one_layer])
    with pytest.raises(ValueError, match=r"state dict 0 is not of the same model .*0.weight has shape \(8, 4\)"):
        average_state_dicts([wider, two_layers])
    torch.testing.assert_close(average_state_dicts([two_layers, two_layers])["0.weight"], two_layers["0.weight"])
