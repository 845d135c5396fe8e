"""Checkers for the exercises of notebook 06 (feed-forward, residual connections, LayerNorm).

Hand-written, not exported (see `transformer_lib.exercises`): `check_rms_norm` compares with PyTorch's
`nn.RMSNorm` (torch >= 2.4; on an older torch with the formula, and says so), `check_pre_ln_residual`
with the course's `SublayerConnection(norm_first=True)`; both name the likely slip of a wrong answer.
"""
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lib.exercises import Refuse, call, fresh_generator, run_checker
from transformer_lib.exercises.explain import dropout_story, name_difference
from transformer_lib.sublayers import LayerNorm, PositionwiseFeedForward, SublayerConnection
from transformer_lib.exercises.guards import allclose, assert_close, tensor_isclose

_NO_RMS_NORM = [Refuse("rms_norm", "F.rms_norm (or nn.RMSNorm) is PyTorch's RMSNorm, the one the checker compares "
                       "with; write the formula yourself: weight * x / sqrt(mean(x²) + eps)")]
_NO_SUBLAYER_CONNECTION = [Refuse((SublayerConnection, "forward"), "SublayerConnection is the course's own residual "
                                  "connection; write x + sublayer(norm(x)) yourself")]


def _fill_(module: nn.Module, generator: torch.Generator, scale: float = 0.5) -> nn.Module:
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(scale * torch.randn(parameter.shape, generator=generator))
    return module


def _rms_reference(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    if hasattr(nn, "RMSNorm"):
        reference = nn.RMSNorm(x.size(-1), eps=eps)
        with torch.no_grad():
            reference.weight.copy_(weight)
            return reference(x)
    return weight * x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)


def _rms_hint(error: Exception) -> str | None:
    if isinstance(error, RuntimeError) and "size of tensor" in str(error):
        return ("the mean over the last dimension has shape (B, L) and cannot divide x (B, L, D): "
                "keep the dimension, x.pow(2).mean(dim=-1, keepdim=True)")
    return None


def _divisor_story(result: Tensor, x: Tensor, weight: Tensor, eps: float) -> str | None:
    """When the output is γ ⊙ x divided by one number per position, recover that number and name the statistic it
    is (every order of square, absolute value, mean and root, with eps inside, outside or left out); else say where
    it differs from sqrt(mean(x²) + eps)."""
    x, weight, result = x.double(), weight.double(), result.double()
    if (result.abs() < 1e-6).any() or (x.abs() < 1e-6).any() or (weight.abs() < 1e-6).any():
        return None
    divisor = weight * x / result                                        # (..., D): the same along D?
    if not allclose(divisor, divisor[..., :1].expand_as(divisor), rtol=1e-4, atol=1e-8):
        return None
    divisor = divisor[..., :1]                                           # (..., 1)
    mean = x.mean(dim=-1, keepdim=True)
    statistics = {"mean(x²)": x.pow(2).mean(dim=-1, keepdim=True), "mean(x)²": mean.pow(2),
                  "mean(|x|)": x.abs().mean(dim=-1, keepdim=True), "mean(|x|)²": x.abs().mean(dim=-1, keepdim=True).pow(2),
                  "var(x)": x.var(dim=-1, keepdim=True, unbiased=False), "sum(x²)": x.pow(2).sum(dim=-1, keepdim=True)}
    forms = {"sqrt({} + eps)": lambda s: (s + eps).sqrt(), "sqrt({}) + eps": lambda s: s.sqrt() + eps,
             "sqrt({})": lambda s: s.sqrt(), "{} + eps": lambda s: s + eps, "{}": lambda s: s}
    for name, statistic in statistics.items():
        for form, apply in forms.items():
            if allclose(divisor, apply(statistic), rtol=1e-4, atol=1e-8):
                said = form.format(name)
                if said == "sqrt(mean(x²) + eps)":
                    return None
                why = {"mean(x)²": " You squared the mean; RMSNorm takes the mean of the squares, mean(x²) = "
                                   "x.pow(2).mean(dim=-1, keepdim=True), then adds eps and takes the root."}.get(name, "")
                return f"you divided γ ⊙ x by {said}; RMSNorm divides by sqrt(mean(x²) + eps).{why}"
    rms = (x.pow(2).mean(dim=-1, keepdim=True) + eps).sqrt()
    first = tuple((~tensor_isclose(divisor, rms, rtol=1e-4, atol=1e-8)).nonzero()[0].tolist()[:-1])
    return (f"you divided γ ⊙ x by one number per position, but not by sqrt(mean(x²) + eps): at position {first} "
            f"you divided by {divisor[first].item():.5g}, where sqrt(mean(x²) + eps) = {rms[first].item():.5g}")


def _check_rms_norm(rms_norm) -> None:
    if not hasattr(nn, "RMSNorm"):
        print(f"torch {torch.__version__} has no nn.RMSNorm (it came in torch 2.4): checking against the formula")
    generator = torch.Generator().manual_seed(6)
    x = 1.0 + 3.0 * torch.randn(3, 4, 8, generator=generator)            # (B, L, D), mean far from 0
    weight = torch.randn(8, generator=generator)                          # γ (D,)
    fresh = fresh_generator()
    shape = tuple(int(n) for n in torch.randint(1, 6, (int(torch.randint(1, 4, (), generator=fresh)),),
                                                generator=fresh)) + (int(torch.randint(2, 12, (), generator=fresh)),)
    cases = [(x, weight, 1e-6), (x, weight, 0.5),                          # a large ε shows where it goes
             (x[:1, :1, :6] - 1.0, weight[:6], 1e-6),                     # leading dimensions of size 1
             (torch.randn(shape, generator=fresh) * 2 + 1, torch.randn(shape[-1], generator=fresh),
              float(torch.rand((), generator=fresh)))]
    for x, weight, eps in cases:
        expected = _rms_reference(x, weight, eps)
        result = call(rms_norm, x, weight, eps, on=f"x of shape (..., D) = {tuple(x.shape)}, weight (D,), eps={eps:.3g}",
                      hint=_rms_hint, refuse=_NO_RMS_NORM)
        assert isinstance(result, Tensor), f"rms_norm must return a torch.Tensor, got {type(result).__name__}"
        result = result.detach()
        assert result.shape == expected.shape, f"rms_norm returned shape {tuple(result.shape)}, expected {tuple(x.shape)}"
        if allclose(result, expected, atol=1e-5, rtol=1e-4):
            continue
        ms = x.pow(2).mean(dim=-1, keepdim=True)                          # (B, L, 1): mean of the squares
        centred = x - x.mean(dim=-1, keepdim=True)
        std_slip = ("you divided by the standard deviation, which subtracts the mean first (x.std() or x.var()); "
                    "RMSNorm divides by the root mean square of x itself: sqrt(mean(x²) + eps)")
        slips = [
            ("you subtracted the mean: that is LayerNorm. RMSNorm does not centre x, it only divides by "
             "sqrt(mean(x²) + eps)", weight * centred / torch.sqrt(centred.pow(2).mean(dim=-1, keepdim=True) + eps)),
            (std_slip, weight * x / x.std(dim=-1, keepdim=True)),
            (std_slip, weight * x / (x.std(dim=-1, keepdim=True) + eps)),
            (std_slip, weight * x / torch.sqrt(x.var(dim=-1, keepdim=True) + eps)),
            (std_slip, weight * x / torch.sqrt(x.var(dim=-1, keepdim=True, unbiased=False) + eps)),
            ("the sum of the squares was used; RMSNorm takes their mean over the last dimension (divide by D)",
             weight * x / torch.sqrt(x.pow(2).sum(dim=-1, keepdim=True) + eps)),
            ("the mean of x² must run over the LAST dimension, the D features of one position (dim=-1); "
             "yours ran over another one", weight * x / torch.sqrt(x.pow(2).mean(dim=1, keepdim=True) + eps)),
            ("the mean of x² must run over the LAST dimension, the D features of one position (dim=-1); "
             "yours ran over another one", weight * x / torch.sqrt(x.pow(2).mean(dim=0, keepdim=True) + eps)),
            ("you divided by mean(x²) + eps without the square root: sqrt(mean(x²) + eps)", weight * x / (ms + eps)),
            ("the mean of x² ran over ALL the elements of x; RMSNorm normalises each position on its own: the mean "
             "over the last dimension, x.pow(2).mean(dim=-1, keepdim=True)",
             weight * x / torch.sqrt(x.pow(2).mean() + eps)),
            ("you took the square root twice (x / sqrt(rms) with rms = sqrt(mean(x²) + eps)); divide by "
             "rms = sqrt(mean(x²) + eps) itself", weight * x / torch.sqrt(torch.sqrt(ms + eps))),
            ("you took the square root twice (x / sqrt(rms) with rms = sqrt(mean(x²) + eps)); divide by "
             "rms = sqrt(mean(x²) + eps) itself", weight * x / torch.sqrt(torch.sqrt(ms) + eps)),
            ("the gain is missing: multiply by weight (γ, one per feature)", x / torch.sqrt(ms + eps)),
            ("eps must be added, not multiplied: sqrt(mean(x²) + eps)", weight * x / torch.sqrt(ms * eps)),
            ("the gain divides instead of multiplying: γ ⊙ x / sqrt(mean(x²) + eps)", x / torch.sqrt(ms + eps) / weight),
            ("the gain is ADDED; RMSNorm multiplies by it: γ ⊙ x / sqrt(mean(x²) + eps)", weight + x / torch.sqrt(ms + eps)),
            ("you multiplied by the gain BEFORE normalising, so it cancels; normalise x first, then multiply by γ",
             (weight * x) / torch.sqrt((weight * x).pow(2).mean(dim=-1, keepdim=True) + eps)),
            ("you averaged |x|; RMSNorm averages the SQUARES: sqrt(mean(x²) + eps)",
             weight * x / torch.sqrt(x.abs().mean(dim=-1, keepdim=True) + eps)),
            ("you divided by the mean of |x|; RMSNorm divides by the root of the mean of the SQUARES: "
             "sqrt(mean(x²) + eps)", weight * x / (x.abs().mean(dim=-1, keepdim=True) + eps)),
            ("you divided by the mean of |x|; RMSNorm divides by the root of the mean of the SQUARES: "
             "sqrt(mean(x²) + eps)", weight * x / x.abs().mean(dim=-1, keepdim=True)),
            ("you divided by the largest |x|; RMSNorm divides by the root of the mean of the squares: "
             "sqrt(mean(x²) + eps)", weight * x / x.abs().amax(dim=-1, keepdim=True)),
            ("you divided by the norm of x, sqrt(sum(x²)); RMSNorm takes the MEAN of the squares (divide the sum "
             "by D): sqrt(mean(x²) + eps)", weight * x / x.norm(dim=-1, keepdim=True)),
        ]
        slips.append(("eps was added to the output; it goes inside the square root: sqrt(mean(x²) + eps)",
                      weight * x / ms.sqrt() + eps))
        if eps > 0.1:  # with a tiny ε, where it goes makes no visible difference
            slips += [("eps must go inside the square root: sqrt(mean(x²) + eps), as in nn.RMSNorm",
                       weight * x / (ms.sqrt() + eps)),
                      (f"eps is missing: divide by sqrt(mean(x²) + eps), which stays defined when x is all zeros "
                       f"(here eps = {eps})", weight * x / ms.sqrt())]
        for message, wrong in slips:                   # a slip that gives the right values here explains nothing
            assert wrong.shape != result.shape or not allclose(result, wrong, atol=1e-5, rtol=1e-4) or allclose(
                wrong, expected, atol=1e-5, rtol=1e-4), message
        name_difference(result, expected, f"rms_norm(x of shape {tuple(x.shape)}, eps={eps:.3g}): ",
                        "; γ ⊙ x / sqrt(mean(x²) + eps), the mean over the last dimension")
        story = _divisor_story(result, x, weight, eps)
        if story:
            raise AssertionError(f"rms_norm(x of shape {tuple(x.shape)}, eps={eps:.3g}): {story}")
        assert_close(result, expected, atol=1e-5, rtol=1e-4, msg=lambda m: (
            f"rms_norm differs from nn.RMSNorm(D, eps={eps}) with the same weight: γ ⊙ x / sqrt(mean(x²) + eps), "
            f"the mean over the last dimension, with keepdim=True: {m}"))
    zeros = call(rms_norm, torch.zeros(2, 8), torch.randn(8), 1e-6, on="x all zeros (eps=1e-6)", refuse=_NO_RMS_NORM)
    assert not zeros.isnan().any(), "x all zeros gave NaN: add eps inside the square root, sqrt(mean(x²) + eps)"


def check_rms_norm(your_function) -> None:
    """Exercise 1 of notebook 06: RMSNorm, against torch.nn.RMSNorm."""
    __tracebackhide__ = True                 # IPython and pytest show the message, not this frame
    run_checker("RMSNorm", your_function, _check_rms_norm)


def _check_pre_ln_residual(pre_ln_residual) -> None:
    fresh = fresh_generator()
    for B, L, D, generator in ((2, 5, 16, torch.Generator().manual_seed(6)),
                               (1, 1, 8, torch.Generator().manual_seed(7)),          # one sentence of one position
                               (*(int(torch.randint(1, high, (), generator=fresh)) for high in (4, 7)),
                                int(torch.randint(4, 20, (), generator=fresh)), fresh)):
        _check_pre_ln_with(pre_ln_residual, B, L, D, generator)


def _check_pre_ln_with(pre_ln_residual, B: int, L: int, D: int, generator: torch.Generator) -> None:
    norm = _fill_(LayerNorm(D), generator)
    sublayer = _fill_(PositionwiseFeedForward(D, 2 * D, dropout=0.0), generator).eval()
    x = torch.randn(B, L, D, generator=generator)                         # (B, L, D)
    block = SublayerConnection(D, dropout=0.0, norm_first=True).eval()
    block.norm.load_state_dict(norm.state_dict())
    result = call(pre_ln_residual, x, sublayer, norm, refuse=_NO_SUBLAYER_CONNECTION,
                  on=f"x of shape (B, L, D) = {tuple(x.shape)}, a PositionwiseFeedForward as the sublayer and a LayerNorm")
    with torch.no_grad():
        expected = block(x, sublayer)
        slips = {
            "that is post-LN, LayerNorm(x + Sublayer(x)); pre-LN normalises the sublayer's input: "
            "x + Sublayer(LayerNorm(x))": norm(x + sublayer(x)),
            "the residual is missing: add x to the sublayer's output": sublayer(norm(x)),
            "the LayerNorm must be applied to the sublayer's input, not its output": x + norm(sublayer(x)),
            "the LayerNorm is missing: x + Sublayer(LayerNorm(x))": x + sublayer(x),
            "the residual adds the NORMALISED x; add the original x: x + Sublayer(LayerNorm(x))":
                norm(x) + sublayer(norm(x)),
            "there is a LayerNorm on the output too; pre-LN leaves the residual path alone: x + Sublayer(LayerNorm(x))":
                norm(x + sublayer(norm(x))),
            "the LayerNorm was applied twice: x + Sublayer(LayerNorm(x)) normalises once": x + sublayer(norm(norm(x))),
            "x was added twice: the residual adds it once, x + Sublayer(LayerNorm(x))": 2 * x + sublayer(norm(x)),
            "the LayerNorm was applied to the sublayer's output too; pre-LN normalises only its input: "
            "x + Sublayer(LayerNorm(x))": x + norm(sublayer(norm(x))),
            "you normalised with F.layer_norm, without the given norm's gain and bias: call norm(x), the module "
            "you were given": x + sublayer(F.layer_norm(x, x.shape[-1:])),
        }
    assert isinstance(result, Tensor), f"pre_ln_residual must return a torch.Tensor, got {type(result).__name__}"
    result = result.detach()
    assert result.shape == expected.shape, f"expected shape (B, L, D) = {tuple(expected.shape)}, got {tuple(result.shape)}"
    for message, wrong in slips.items():
        assert not allclose(result, wrong, atol=1e-5, rtol=1e-4) or allclose(
            wrong, expected, atol=1e-5, rtol=1e-4), message
    with torch.no_grad():
        for part, got, clean in (("the sublayer's output (your result − x)", result - x, sublayer(norm(x))),
                                 ("your result", result, expected)):
            story = dropout_story(got, clean)
            if story:
                raise AssertionError(f"pre_ln_residual: {part}: {story}. The exercise's block has no dropout: "
                                     "x + Sublayer(LayerNorm(x))")
    name_difference(result, expected, "pre_ln_residual: ", "; x + Sublayer(LayerNorm(x))")
    assert_close(result, expected, atol=1e-5, rtol=1e-4, msg=lambda m: (
        f"pre_ln_residual differs from SublayerConnection(norm_first=True) without dropout: {m}"))


def check_pre_ln_residual(your_function) -> None:
    """Exercise 2 of notebook 06: x + Sublayer(LayerNorm(x))."""
    __tracebackhide__ = True                 # IPython and pytest show the message, not this frame
    run_checker("pre-LN residual connection", your_function, _check_pre_ln_residual)
