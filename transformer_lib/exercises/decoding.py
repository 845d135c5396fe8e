"""Checkers for the coding exercises of notebook 12 (decoding). Hand-written, not exported.

* `check_length_normalised_score`: beam search's ranking score log P(Y) / lp(Y) with GNMT's length
  penalty lp(Y) = ((5 + |Y|) / 6)^α, compared with the course's `length_penalty`.
* `check_greedy_decode`: greedy decoding written from scratch, compared with the course's
  `greedy_decode` on tiny random Transformers.
"""
import math

import torch

from transformer_lib.decoding import greedy_decode, length_penalty
from transformer_lib.exercises import run_checker
from transformer_lib.model import Transformer

PAD, BOS, EOS = 0, 1, 2


def _score_cases():
    for log_prob in (-0.5, -3.0, -12.25):
        for length in (1, 2, 7, 30):
            for alpha in (0.0, 0.6, 1.0, 1.5):
                yield log_prob, length, alpha


def _check_score(your_function) -> None:
    for log_prob, length, alpha in _score_cases():
        expected = log_prob / length_penalty(length, alpha)
        got = your_function(log_prob, length, alpha)
        got = float(got)
        if math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-9):
            continue
        hint = ""
        if math.isclose(got, log_prob / (5 + length) ** alpha, rel_tol=1e-6):
            hint = " lp(Y) divides 5 + |Y| by 6, so that lp = 1 for a one-token output: ((5 + |Y|) / 6)^α."
        elif math.isclose(got, log_prob * length_penalty(length, alpha), rel_tol=1e-6):
            hint = " Divide log P by lp(Y); multiplying makes long outputs even worse."
        elif math.isclose(got, log_prob / ((5 + length) / 6), rel_tol=1e-6):
            hint = " Raise (5 + |Y|) / 6 to the power α."
        elif math.isclose(got, log_prob / length ** alpha, rel_tol=1e-6):
            hint = " GNMT's penalty is ((5 + |Y|) / 6)^α, not |Y|^α."
        raise AssertionError(f"log_prob={log_prob}, length={length}, alpha={alpha}: expected {expected:.6f}, "
                             f"got {got:.6f}.{hint}")
    lengths = torch.tensor([1.0, 4.0, 13.0])
    got = your_function(torch.tensor([-1.0, -2.0, -3.0]), lengths, 0.6)
    assert isinstance(got, torch.Tensor) and got.shape == (3,), \
        "given tensors of log-probabilities and lengths, return a tensor of the same shape (use ** not math.pow)"
    torch.testing.assert_close(got, torch.tensor([-1.0, -2.0, -3.0]) / length_penalty(lengths, 0.6))


def check_length_normalised_score(your_function) -> bool:
    """Check `your_function(log_prob, length, alpha) -> log_prob / lp(length)`."""
    return run_checker("length-normalised score", your_function, _check_score)


class _Biased(torch.nn.Module):
    """A model's output layer plus a fixed bias on the logits (to make </s> likely or unlikely)."""

    def __init__(self, generator: torch.nn.Module, bias: torch.Tensor):
        super().__init__()
        self.generator, self.bias = generator, bias

    def forward(self, hidden):
        return self.generator(hidden) + self.bias


def _tiny_model(seed: int, eos_bias: float, vocab_size: int = 11) -> Transformer:
    torch.manual_seed(seed)
    model = Transformer(vocab_size, vocab_size, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=2,
                        n_decoder_layers=2, dropout=0.0, max_len=64, pad_id=PAD).eval()
    model.generator = _Biased(model.generator, torch.eye(vocab_size)[EOS] * eos_bias)
    return model


def _sources(lengths: list[int], seed: int, vocab_size: int = 11) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), max(lengths)), PAD, dtype=torch.long)
    for i, n in enumerate(lengths):
        src[i, :n] = torch.cat([torch.tensor([BOS]), torch.randint(3, vocab_size, (n - 2,), generator=g),
                                torch.tensor([EOS])])
    return src, src == PAD


def _check_greedy(your_function) -> None:
    # eos_bias: 0 leaves </s> rare (outputs run to max_len), 2.5 makes sentences end at various steps.
    for seed, eos_bias, max_len in ((0, 0.0, 6), (1, 2.5, 12), (2, 2.5, 12), (3, 1.5, 9)):
        model = _tiny_model(seed, eos_bias)
        src, mask = _sources([7, 4, 9, 5], seed)
        expected = greedy_decode(model, src, mask, BOS, EOS, max_len=max_len, use_cache=False)
        with torch.no_grad():
            got = your_function(model, src, mask, BOS, EOS, max_len)
        got = [list(map(int, row)) for row in got]
        assert len(got) == len(expected), f"return one list of ids per sentence: {len(expected)}, got {len(got)}"
        for i, (g, e) in enumerate(zip(got, expected)):
            if g == e:
                continue
            if g and g[0] == BOS:
                raise AssertionError("drop the leading <s>: return only the generated ids")
            if EOS in g:
                raise AssertionError(f"sentence {i}: {g} contains </s> (id {EOS}); cut each output at its first "
                                     f"</s> and leave it out")
            if len(g) > max_len:
                raise AssertionError(f"sentence {i}: {len(g)} tokens but max_len={max_len}; stop after max_len tokens")
            if e[:len(g)] == g:
                raise AssertionError(f"sentence {i}: your output {g} stops early; the course's is {e}. A sentence "
                                     f"ends at its own </s> or at max_len tokens, not when another one ends")
            raise AssertionError(f"sentence {i} (seed {seed}): expected {e}, got {g}. Did you pass the causal mask "
                                 f"subsequent_mask(t) and the padding mask (as memory_key_padding_mask) to "
                                 f"model.decode, and take the argmax of the last position?")


def check_greedy_decode(your_function) -> bool:
    """Check `your_function(model, src, src_key_padding_mask, bos_id, eos_id, max_len) -> list[list[int]]`."""
    return run_checker("greedy decoding", your_function, _check_greedy)
