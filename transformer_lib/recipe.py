"""The recipe of a run beyond the model's shape: how its attention projections are drawn (`--init`), which
attention path its training steps take (`--attention`), and the paper's average of the last snapshots of
the weights, kept where it scores at least as high on the validation pairs (`--average`, `--average-every`).

Hand-written, not exported: a part of `train_run.py`, kept apart to keep each file short. The Multi30k
benchmark (scripts/benchmark_multi30k.py) trains our model through `train_run` with these settings.
"""
import contextlib
import statistics
import time

from transformer_lib.run_config import RunError
from transformer_lib.settings import AMP_MEASURE_MIN_STEPS


def init_attention_like_torch(model):
    """Re-draw every attention projection of `model` as nn.MultiheadAttention draws its own: W^Q, W^K and
    W^V as one Xavier-uniform (3D x D) matrix, so each is drawn with the bound sqrt(6 / 4D), not the
    sqrt(6 / 2D) of a D x D matrix, and zero biases on Q, K, V and the output. Smaller queries and keys
    start every head closer to uniform attention. Draws from torch's global generator, in module order."""
    import torch
    from torch import nn

    from transformer_lib.multihead import MultiHeadAttention
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            packed = torch.empty(3 * module.d_model, module.d_model)
            nn.init.xavier_uniform_(packed)
            with torch.no_grad():
                for proj, rows in zip((module.q_proj, module.k_proj, module.v_proj), packed.chunk(3)):
                    proj.weight.copy_(rows)
                for proj in (module.q_proj, module.k_proj, module.v_proj, module.out_proj):
                    if proj.bias is not None:
                        proj.bias.zero_()
    return model


def build_model(config, init: str, device):
    """The model of `config` with its attention projections drawn as `init` ("ours" or "torch") says, drawn on
    the CPU and then moved to `device`, so that a seed gives the same start on every device."""
    from transformer_lib.model import build_transformer
    model = build_transformer(config)
    if init == "torch":
        init_attention_like_torch(model)
    return model.to(device)


def use_attention(model, path: str):
    """Make every attention layer of `model` take `path`: "fused" (`F.scaled_dot_product_attention`) or
    "explicit" (matmul-softmax). The two compute the same function; only their speed differs."""
    from transformer_lib.multihead import MultiHeadAttention
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            module.fused = path == "fused"
    return model


def _synchronize(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def faster_attention(model, batches: list, loss_fn, amp: str | None, rounds: int = 3) -> tuple[str, dict]:
    """"fused" or "explicit", whichever trains `model` faster on `batches` here, in the precision `amp` the
    run trains in ("bf16", "fp16" or None): a copy of the model takes `rounds` passes over the batches on each
    path, in turn, after one warm-up pass each; the model and torch's random state are left untouched.
    Returns (choice, {"fused": median seconds per pass, "explicit": ...})."""
    import copy

    import torch
    device = next(model.parameters()).device
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp)
    seconds = {"fused": [], "explicit": []}
    with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
        probe = copy.deepcopy(model).train()
        optimizer = torch.optim.Adam(probe.parameters(), lr=1e-6)
        for round_ in range(rounds + 1):
            for path in seconds:
                use_attention(probe, path)
                _synchronize(device)
                start = time.perf_counter()
                for batch in batches:
                    with torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext():
                        loss, _ = loss_fn(probe, batch)
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
                _synchronize(device)
                if round_:                               # the first round warms up
                    seconds[path].append(time.perf_counter() - start)
    median = {path: round(statistics.median(times), 3) for path, times in seconds.items()}
    return ("explicit" if median["explicit"] < median["fused"] else "fused"), median


def launch_attention(s, device, old_meta: dict | None, model, data, loss_fn, amp: str | None) -> tuple[str, str]:
    """The attention path of this launch, set on `model`, and the line `train` says about it. fused and
    explicit as given; auto: the path the run folder records, else the faster of the two on the first 4
    batches, timed only for a run long enough to repay it (as `--amp auto`), else fused."""
    recorded, timed, batches = (old_meta or {}).get("attention"), None, []
    if s.attention != "auto":
        path = s.attention
    elif recorded is not None:
        path = recorded
    elif s.max_steps is None or s.max_steps >= AMP_MEASURE_MIN_STEPS:
        batches = [batch.to(device) for batch in data.batches(0, seed=s.seed)[:4]]
        path, timed = faster_attention(model, batches, loss_fn, amp)
    else:
        path = "fused"
    use_attention(model, path)
    why = ("" if s.attention != "auto" else ", as the run folder records" if timed is None and recorded else
           f", not timed: fewer than {AMP_MEASURE_MIN_STEPS} steps" if timed is None else
           f", timed here: fused {timed['fused']} s, explicit {timed['explicit']} s a pass over {len(batches)} "
           "batches")
    return path, f"attention: {path} (--attention {s.attention}{why})"


def recorded_attention(s, old_meta: dict | None, path: str) -> dict:
    """What config.json records of the attention path: the first one a launch took by --attention explicit or
    auto, which `--attention auto` resumes with (a run that leaves it at fused records what runs recorded
    before the option)."""
    began = (old_meta or {}).get("attention")
    return {"attention": began or path} if began is not None or s.attention != "fused" else {}


# --- averaging -----------------------------------------------------------------------------------------

def decodable(pairs: list, tokenizer, max_len: int) -> list:
    """The pairs whose source the model reads (at most max_len tokens with <s> and </s>, as evaluate keeps)."""
    lengths = [len(ids) for ids in tokenizer.encode_batch([s for s, _ in pairs], unknown="replace")]
    return [pair for pair, n in zip(pairs, lengths) if n <= max_len]


def greedy_bleu(model, tokenizer, pairs: list) -> dict:
    """sacreBLEU's BLEU, chrF and lowercased BLEU of greedy translations of `pairs`, rounded to 2 decimals."""
    from transformer_lib.evaluation import score_translations, translate
    hypotheses = translate(model, tokenizer, [s for s, _ in pairs])
    return {name: round(value, 2) for name, value in score_translations(hypotheses, [t for _, t in pairs]).items()}


def check_average(s, valid_pairs: list) -> None:
    """RunError for --average without validation pairs to choose between the last and the averaged weights."""
    if s.average and not valid_pairs:
        raise RunError(f"--average {s.average} keeps the averaged weights only where they score higher on the "
                       "validation pairs, and this data has none; give --valid (or --valid-fraction > 0), or leave "
                       "--average out")


class Averaging:
    """--average N --average-every K in a run: a `WeightAverager` keeps the last N snapshots, taken every K
    steps and at the end; `decide` keeps the average where its greedy BLEU on the validation pairs is higher
    than the last weights' (a tie keeps the average). Every checkpoint carries the snapshots, so a run
    stopped and resumed averages the same ones; once the average is kept, the checkpoint also carries the
    last weights, from which a run trained further goes on. Off (N = 0), it does nothing."""

    def __init__(self, keep: int, every: int, checkpoint: dict | None = None):
        from transformer_lib.checkpoints import WeightAverager
        extra = (checkpoint or {}).get("extra") or {}
        self.averager = WeightAverager(every, keep) if keep else None
        self.record = extra.get("averaging")            # what `decide` found: scores, snapshots, the choice
        self.last_weights = extra.get("last_weights")
        if self.averager is not None:
            self.averager.snapshots.extend((snap["step"], {name: t.cpu() for name, t in snap["weights"].items()})
                                           for snap in extra.get("snapshots", []))

    def attach(self, trainer) -> "Averaging":
        if self.averager is not None:
            self.averager.attach(trainer)
        return self

    def resume(self, model) -> None:
        """After restoring a checkpoint that kept the average: go on training from the last weights."""
        from transformer_lib.checkpoints import load_weights
        if self.last_weights is not None:
            load_weights(model, self.last_weights)
        self.record = self.last_weights = None          # decided again at the new end

    def extra(self) -> dict:
        """What a checkpoint carries of the averaging (nothing when it is off)."""
        if self.averager is None:
            return {}
        carried = {"snapshots": [{"step": step, "weights": weights} for step, weights in self.averager.snapshots]}
        if self.record is not None:
            carried["averaging"] = self.record
        if self.last_weights is not None:
            carried["last_weights"] = self.last_weights
        return carried

    def decide(self, model, step: int, tokenizer, valid_pairs: list, meta: dict) -> None:
        """At the end (step `step`): score the last and the averaged weights of `model` (the plain model, not a
        wrapper) by greedy BLEU on the validation pairs it reads (config.json `meta`'s max_len), decoded on the
        attention path that `evaluate` takes, and leave the higher in `model`; `record` says both and the choice."""
        from transformer_lib.checkpoints import average_state_dicts
        from transformer_lib.multihead import MultiHeadAttention
        if self.averager is None or self.record is not None:
            return
        snapshots, pairs = self.averager.snapshots, decodable(valid_pairs, tokenizer, meta["model"]["max_len"])
        last = {name: t.detach().to("cpu", copy=True) for name, t in model.state_dict().items()}
        if not snapshots or snapshots[-1][0] != step:   # stopped by a signal at the last step: no final snapshot
            snapshots.append((step, last))
        paths = {module: module.fused for module in model.modules() if isinstance(module, MultiHeadAttention)}
        use_attention(model, "fused" if meta["model"].get("fused_attention", True) else "explicit")
        try:
            scores = {"last_weights": greedy_bleu(model, tokenizer, pairs)}
            # (the names without the "module." of DistributedDataParallel, whose snapshots the averager took)
            model.load_state_dict(average_state_dicts([{name.removeprefix("module."): t for name, t in weights.items()}
                                                       for _, weights in snapshots]))
            scores["averaged_weights"] = greedy_bleu(model, tokenizer, pairs)
        finally:
            for module, fused in paths.items():
                module.fused = fused
        kept = "last_weights" if scores["last_weights"]["bleu"] > scores["averaged_weights"]["bleu"] else \
            "averaged_weights"
        if kept == "last_weights":
            model.load_state_dict(last)
        else:
            self.last_weights = last
        self.record = {"snapshots": self.averager.steps, "every": self.averager.every_steps,
                       "valid_pairs": len(pairs), "valid_greedy": scores, "kept": kept}


def averaging_line(record: dict) -> str:
    """What `train` says at the end about the averaging."""
    steps, scores = record["snapshots"], record["valid_greedy"]
    kept = "the averaged weights" if record["kept"] == "averaged_weights" else "the last weights"
    return (f"averaging: the {len(steps)} snapshots of steps {', '.join(map(str, steps))} score "
            f"{scores['averaged_weights']['bleu']:.2f} greedy BLEU on the {record['valid_pairs']:,} validation pairs, "
            f"the last weights {scores['last_weights']['bleu']:.2f}: the run keeps {kept}")
