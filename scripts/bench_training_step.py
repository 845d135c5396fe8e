"""Our training step against nn.Transformer's, side by side: `python scripts/bench_training_step.py`.

Hand-written (not exported from a notebook). One run times one training step (forward, label-smoothed
loss, backward, gradient clipping, Adam step: the Trainer's step) of

- the peer: `nn.Transformer` dressed as our model (scripts/peer_transformer.py), float32, eager;
- ours in float32, eager (the like-for-like comparison), and ours under bf16 autocast;
- ours under bf16 with dropout where the paper puts it (§5.4: sublayer outputs and embeddings, not
  attention weights and feed-forward hidden units: `attention_dropout=0, activation_dropout=0`),
  with the fused attention (`F.scaled_dot_product_attention`, the default) and with the explicit
  one (`fused_attention=False`, notebook 05's formula): which is faster depends on the kernels;
- ours under bf16 with the explicit attention and the dropout of the Multi30k table's recipe (also on
  the attention weights, not on the feed-forward hidden units: `activation_dropout=0`);
- ours compiled with `torch.compile` (`Transformer.compile(dynamic=True)`, as `train --compile`
  does), in float32 and in bf16,

on the Multi30k benchmark's model (pre-LN, d_model 256, 4 heads, d_ff 1024, 3+3 layers, a shared
8k vocabulary, dropout 0.1) and two kinds of batches:

1. synthetic: one batch of B=32, S=T=32 random ids, half of it padded, at `--synthetic-threads` (1);
2. real: the first `--real-batches` batches of epoch 0 exactly as scripts/benchmark_multi30k.py
   draws them (its committed tokenizer, at most 2,048 padded tokens a side), at `--threads` (2).
   Needs Multi30k (`--data-dir`, default $MULTI30K_DIR, else ../shared/data/multi30k); skipped
   without it.

Each number is the median over `--repeats` rounds after warm-up; in each round every variant runs
in turn, so a change in machine load hits all alike. A ratio is our time over the peer's: below 1.00
means ours is faster. Target tokens per second count real (non-padding) target tokens. Achieved
FLOP/s divides the step's matmul FLOPs (`transformer_lib.model.transformer_flops` on the padded
shapes, derived in notebook 14) by the step time; the peak is a large matmul's FLOP/s measured here
at the same thread count and dtype: what this CPU's math library reaches at best.

On a CPU the script lets glibc's malloc keep freed blocks for reuse, as `train` does
(`keep_freed_memory`; `--default-malloc` leaves malloc as it is, as the script did before 2026-11-27's
evening: each step's largest blocks were then mapped afresh; the header line says which).

`--device cuda` runs the same on a GPU. `--ladder` instead climbs the speed ladder of one model
(`--model base`, the paper's 48M-parameter base model with the shared 8k vocabulary, by default) on
one device, each row adding one change to the last row that ran: float32 -> mixed precision (bf16;
fp16 with a GradScaler on GPUs below capability 8.0; skipped on CPUs without bf16 instructions) ->
no host syncs -> fused Adam -> torch.compile -> CUDA graphs (static shapes) -> a larger batch.
Each row gives tokens/s, step time, achieved TFLOP/s and its share of the device's peak (the best
large-matmul FLOP/s measured on the same device, float32 or the mixed dtype), and on CUDA the host
syncs a step makes; a row that cannot run there is reported as skipped, with the reason.
`--json PATH` also writes the rows. `ladder_step` says what each change is.
"""
import argparse
import copy
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from peer_transformer import PeerTransformer  # noqa: E402
from transformer_lib.data import Batch, TranslationData, load_pairs  # noqa: E402
from transformer_lib.device import cpu_has_native_bf16, keep_freed_memory, pick_amp  # noqa: E402
from transformer_lib.model import (TransformerConfig, build_transformer, set_inner_dropout,  # noqa: E402
                                   transformer_flops)
from transformer_lib.tokenization import SubwordTokenizer  # noqa: E402
from transformer_lib.training import LabelSmoothingLoss, translation_loss  # noqa: E402

VARIANTS = ("peer fp32", "ours fp32", "ours bf16", "ours bf16, paper dropout",
            "ours bf16, paper dropout, explicit attention", "ours bf16, Multi30k table's dropout, explicit attention",
            "ours fp32 compiled", "ours bf16 compiled")
TOKENIZER = ROOT / "results" / "multi30k" / "seed_0" / "tokenizer.json"   # the Multi30k benchmark's vocabulary


def multi30k_model_config(tokenizer) -> TransformerConfig:
    """The Multi30k benchmark's model (pre-LN, D=256, 4 heads, d_ff 1024, 3+3 layers, dropout 0.1) on `tokenizer`."""
    return TransformerConfig(tokenizer.vocab_size, tokenizer.vocab_size, 256, 4, 1024, 3, 3, 0.1,
                             norm_first=True, pad_id=tokenizer.pad_id)


def training_step(model: nn.Module, bf16: bool, pad_id: int):
    """One update as the Trainer makes it: autocast forward, loss, backward, clip to norm 1, Adam step."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    criterion = LabelSmoothingLoss(0.1, ignore_index=pad_id)
    device_type = next(model.parameters()).device.type
    model.train()

    def step(batch: Batch) -> None:
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=bf16):
            loss, _ = translation_loss(model, batch, criterion)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    return step


def build_variants(config: TransformerConfig, compile_: bool, device=torch.device("cpu")) -> dict:
    """name -> step function; every model of ours starts from the same weights."""
    torch.manual_seed(0)
    ours = build_transformer(config)
    torch.manual_seed(0)
    variants = {"peer fp32": training_step(PeerTransformer(config).to(device), False, config.pad_id)}
    for name in VARIANTS[1:]:
        if "compiled" in name and not compile_:
            continue
        model = copy.deepcopy(ours)
        if "explicit attention" in name:     # softmax(QK^T/sqrt(d_k))V written out, not the fused kernel
            model = build_transformer(replace(config, fused_attention=False))
            model.load_state_dict(ours.state_dict())
        if "paper dropout" in name:          # no dropout on attention weights and hidden units (§5.4)
            set_inner_dropout(model, attention=0.0, activation=0.0)
        if "table's dropout" in name:        # the Multi30k recipe: on the attention weights, not the hidden units
            set_inner_dropout(model, activation=0.0)
        if "compiled" in name:
            model.compile(dynamic=True)      # one graph for every batch shape, as `train --compile`
        variants[name] = training_step(model.to(device), "bf16" in name, config.pad_id)
    return variants


def synthetic_batches(config: TransformerConfig, B=32, S=32, T=32) -> list[Batch]:
    generator = torch.Generator().manual_seed(0)
    src = torch.randint(4, config.src_vocab_size, (B, S), generator=generator)
    tgt = torch.randint(4, config.tgt_vocab_size, (B, T + 1), generator=generator)
    src[B // 2:, 3 * S // 4:] = config.pad_id                  # half the batch padded
    tgt[B // 2:, 3 * T // 4:] = config.pad_id
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    return [Batch(src, tgt_in, tgt_out, src == config.pad_id, tgt_in == config.pad_id, config.pad_id)]


def real_batches(data_dir: str, count: int, max_tokens: int, tokenizer) -> list[Batch] | None:
    try:
        pairs = load_pairs("multi30k", "train", data_dir=data_dir)
    except (FileNotFoundError, ValueError) as error:
        print(f"real batches skipped: {error}")
        return None
    data = TranslationData(pairs, tokenizer, max_tokens, max_len=512)
    return data.batches(0, seed=0)[:count]


def measure(variants: dict, batches: list[Batch], repeats: int, warmup: int) -> dict:
    """Median seconds per pass over `batches` for each variant, and the first pass's seconds."""
    device = batches[0].src.device
    first = {}
    for name, step in variants.items():
        first[name] = _timed(lambda: [step(batch) for batch in batches], device)   # compiles here, if compiled
        for _ in range(warmup - 1):
            for batch in batches:
                step(batch)
    times = {name: [] for name in variants}
    for _ in range(repeats):
        for name, step in variants.items():
            times[name].append(_timed(lambda: [step(batch) for batch in batches], device))
    return {name: statistics.median(t) for name, t in times.items()}, first


def matmul_peak(dtype: torch.dtype, n=2048, repeats=5, device=torch.device("cpu")) -> float:
    """FLOP/s of an n×n by n×n matmul, the best of `repeats`: the most this device's math library reaches.
    On a GPU each timing covers 10 matmuls, so that the wait for the device is a small part of it."""
    a, b = torch.randn(n, n, device=device).to(dtype), torch.randn(n, n, device=device).to(dtype)
    inner = 10 if device.type == "cuda" else 1
    a @ b
    best = min(_timed(lambda: [a @ b for _ in range(inner)], device) for _ in range(repeats))
    return inner * 2 * n ** 3 / best


def _timed(fn, device=torch.device("cpu")) -> float:
    """Seconds `fn` takes, waiting for the device's queued work before and after (a GPU runs ahead)."""
    _synchronize(device)
    start = time.perf_counter()
    fn()
    _synchronize(device)
    return time.perf_counter() - start


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def report(title: str, config, batches, seconds: dict, first: dict, peaks: dict) -> None:
    flops = sum(transformer_flops(config, b.src.size(0), b.src.size(1), b.tgt_in.size(1)) for b in batches)
    tokens = sum(b.n_target_tokens for b in batches)
    peer = seconds["peer fp32"]
    print(f"\n{title}: {len(batches)} batch(es), {tokens:,} target tokens, {flops / 1e9:,.1f} GFLOP a pass")
    print("| variant | ms / step | target tok/s | time / peer's | speed × peer | GFLOP/s | % of peak | first pass (s) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, s in seconds.items():
        peak = peaks["bf16" if "bf16" in name else "fp32"]
        share = "—" if peak is None else f"{100 * flops / s / peak:.0f}%"   # — : no peak measured for it
        print(f"| {name} | {1000 * s / len(batches):.1f} | {tokens / s:,.0f} | {s / peer:.2f} | {peer / s:.2f} | "
              f"{flops / s / 1e9:.1f} | {share} | {first[name]:.1f} |")


def bf16_is_native(device: torch.device) -> bool:
    """Whether `device` has bf16 units: CUDA capability >= 8.0, or a CPU with AVX512_BF16 or AMX.
    Elsewhere bf16 is emulated, so its matmul "peak" measures the emulation, not the hardware."""
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= (8, 0)
    return device.type == "cpu" and cpu_has_native_bf16()


def cpu_features() -> str:
    """The CPU features a bf16 speed-up depends on, named beside every figure this script prints."""
    capability = str(torch.backends.cpu.get_cpu_capability())
    return (f"{platform.processor() or platform.machine()}, ATen kernels {capability}, "
            + ("native bf16 (AVX512_BF16 or AMX)" if cpu_has_native_bf16() else "no native bf16: bf16 is emulated"))


# ---- The speed ladder (--ladder) ----------------------------------------------------------------------

MODELS = {   # (d_model, heads, d_ff, layers a side) of the models the ladder can climb with
    "base": (512, 8, 2048, 6),          # the paper's base model: 48M parameters with the 8k vocabulary
    "multi30k": (256, 4, 1024, 3),      # the Multi30k benchmark's model
    "tiny": (32, 2, 64, 1),             # for smoke tests
}
START = {"amp": None, "syncs": True, "fused": False, "compile": None, "static": False, "batch_factor": 1}
LADDER = [   # (row, what it changes from the last row that ran)
    ("float32", {}),
    ("mixed precision", {"amp": "auto"}),
    ("no host syncs", {"syncs": False}),
    ("fused Adam", {"fused": True}),
    ("torch.compile", {"compile": "default"}),
    ("CUDA graphs", {"compile": "reduce-overhead", "static": True}),
    ("larger batch", {"batch_factor": "larger"}),
]


def ladder_step(model: nn.Module, settings: dict, device: torch.device, pad_id: int):
    """One update under `settings` (a row of LADDER applied to START): returns step(batch).

    With syncs (the Trainer's step as issue 17 found it): the loss and the token counts of
    translation_loss, the loss value and the gradient norm are read on the host every step, and the
    batch is copied from pageable memory. Without: the loss and the same token counts stay on the
    device (the caller sums the loss and reads it once a pass, a log step, where the non-finite guard
    runs), so does the gradient norm, and batches come from pinned memory. step(batch) returns the
    loss (a float with syncs, a device tensor without)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9,
                                 **({"fused": True} if settings["fused"] else {}))
    criterion = LabelSmoothingLoss(0.1, ignore_index=pad_id)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(settings["amp"])
    scaler = torch.amp.GradScaler(device.type) if settings["amp"] == "fp16" else None
    graphs = settings["compile"] == "reduce-overhead"
    counts = {"tokens": torch.zeros((), dtype=torch.long, device=device), "correct": 0}   # summed on the device
    if settings["compile"]:
        model.compile(**({"mode": "reduce-overhead", "dynamic": False} if graphs else {"dynamic": True}))
    model.train()

    def step(batch: Batch):
        batch = batch.to(device)
        if graphs:                     # a new training step: the graph may reuse the last step's outputs
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            if settings["syncs"]:
                loss, stats = translation_loss(model, batch, criterion)
                stats = {name: int(value) for name, value in stats.items()}   # read on the host: waits
            else:
                logits = model(batch.src, batch.tgt_in, batch.src_key_padding_mask, batch.tgt_key_padding_mask)
                loss = criterion(logits.reshape(-1, logits.size(-1)), batch.tgt_out.reshape(-1))  # (B·T, V)
                real = batch.tgt_out != batch.pad_id                                               # (B, T)
                correct = (logits.detach().max(-1).indices == batch.tgt_out) & real               # (B, T)
                counts["tokens"], counts["correct"] = counts["tokens"] + real.sum(), counts["correct"] + correct.sum()
        optimizer.zero_grad(set_to_none=True)
        (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.unscale_(optimizer)
        norm = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        if not settings["syncs"]:
            return loss.detach().float()
        value, _ = loss.item(), norm.item()
        if not math.isfinite(value):
            raise FloatingPointError(f"loss is {value}")
        return value
    return step


def pad_to_shape(batch: Batch, B: int, S: int, T: int) -> Batch:
    """`batch` padded to B rows (extra rows all padding), S source and T target positions: every batch
    of a CUDA-graph row has one shape. The padding is work the row pays for; its tokens/s count real tokens."""
    def pad(t: torch.Tensor, length: int, value) -> torch.Tensor:
        out = torch.full((B, length), value, dtype=t.dtype)
        out[:t.size(0), :t.size(1)] = t
        return out
    p = batch.pad_id
    return Batch(pad(batch.src, S, p), pad(batch.tgt_in, T, p), pad(batch.tgt_out, T, p),
                 pad(batch.src_key_padding_mask, S, True), pad(batch.tgt_key_padding_mask, T, True), p)


def ladder_batches(args, config, data: dict, factor: int, static: bool, pinned: bool) -> list[Batch]:
    """The row's batches, on the host: the first --real-batches / `factor` batches of Multi30k's epoch 0
    at `factor` times --max-tokens (about as many tokens a pass whatever the factor), else synthetic
    ones of that size. `data` holds the pairs and tokenizer, and keeps each factor's tokenized data."""
    count = max(1, args.real_batches // factor)
    batches = None
    if data["pairs"] is not None:
        if factor not in data:             # tokenizing all of Multi30k takes seconds: once per batch size
            data[factor] = TranslationData(data["pairs"], data["tokenizer"], args.max_tokens * factor, max_len=512)
        batches = data[factor].batches(0, seed=0)[:count]
    if batches is None:
        length = 32
        batches = [synthetic_batches(config, B=max(1, args.max_tokens * factor // length), S=length, T=length)[0]
                   for _ in range(count)]
    if static:
        B, S, T = (max(b.src.size(0) for b in batches), max(b.src.size(1) for b in batches),
                   max(b.tgt_in.size(1) for b in batches))
        batches = [pad_to_shape(b, B, S, T) for b in batches]
    if pinned:
        batches = [Batch(*(t.pin_memory() for t in (b.src, b.tgt_in, b.tgt_out, b.src_key_padding_mask,
                                                       b.tgt_key_padding_mask)), b.pad_id) for b in batches]
    return batches


def why_not(settings: dict, change: dict, device: torch.device, no_compile: bool) -> str | None:
    """Why the row that makes `change` cannot run on `device` (None if it can)."""
    if change.get("amp") and settings["amp"] is None:
        return f"no mixed precision on {device.type}" + (" (no bf16 instructions)" if device.type == "cpu" else "")
    if change.get("fused"):
        try:
            torch.optim.Adam([nn.Parameter(torch.zeros(1, device=device))], fused=True)
        except (RuntimeError, ValueError) as error:
            return f"fused Adam unsupported on {device.type}: {str(error).splitlines()[0]}"
    if change.get("compile") == "reduce-overhead" and device.type != "cuda":
        return "CUDA graphs need a CUDA device"
    if change.get("compile") and no_compile:
        return "left out by --no-compile"
    return None


def sync_count(step, batch: Batch, device: torch.device) -> int | None:
    """Host syncs one step makes, as torch.cuda's sync debug mode counts them (CUDA only)."""
    if device.type != "cuda":
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step(batch)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize(device)             # the end of the step, not counted
    return sum("synchronizing" in str(w.message) for w in caught)


def ladder(args, device: torch.device, tokenizer) -> dict:
    """Climb LADDER on `device`; every row's model starts from the same weights. Returns the report."""
    vocab, pad_id = tokenizer.vocab_size, tokenizer.pad_id
    d_model, heads, d_ff, layers = MODELS[args.model]
    config = TransformerConfig(vocab, vocab, d_model, heads, d_ff, layers, layers, 0.1, norm_first=True, pad_id=pad_id)
    # The mixed precision the hardware has: never bf16 by emulation (a CPU without bf16 instructions).
    mixed = pick_amp(device) if device.type == "cuda" else \
        ("bf16" if device.type == "cpu" and cpu_has_native_bf16() else None)
    peaks = {"float32": matmul_peak(torch.float32, args.matmul_size, device=device)}
    if mixed:
        peaks[mixed] = matmul_peak({"bf16": torch.bfloat16, "fp16": torch.float16}[mixed], args.matmul_size,
                                   device=device)
    peak = max(peaks.values())
    print(f"peak: the best {args.matmul_size}×{args.matmul_size} matmul, "
          + ", ".join(f"{k} {v / 1e12:.3f} TFLOP/s" for k, v in peaks.items()), flush=True)
    torch.manual_seed(0)
    weights = build_transformer(config).state_dict()
    try:
        pairs = load_pairs("multi30k", "train", data_dir=args.data_dir)
    except (FileNotFoundError, ValueError) as error:
        print(f"synthetic batches: {error}")
        pairs = None
    data = {"pairs": pairs, "tokenizer": tokenizer}
    report = {"device": str(device), "device_name": _device_name(device), "torch": torch.__version__,
              "cuda": torch.version.cuda if device.type == "cuda" else None,
              "cpu_features": cpu_features() if device.type == "cpu" else None,
              "command": "python scripts/bench_training_step.py " + " ".join(sys.argv[1:]),
              "model": args.model, "parameters": sum(w.numel() for w in weights.values()), "vocab_size": vocab,
              "max_tokens": args.max_tokens, "repeats": args.repeats, "warmup": args.warmup,
              "matmul_peak_tflops": {k: round(v / 1e12, 4) for k, v in peaks.items()},
              "data": "synthetic" if pairs is None else "multi30k", "rows": []}
    settings, base_tokens_per_s = dict(START), None
    for name, change in LADDER:
        trial = {**settings, **change}
        if trial["amp"] == "auto":
            trial["amp"] = mixed
        if trial["batch_factor"] == "larger":
            trial["batch_factor"] = args.larger_batch
        row = {"row": name, "change": change, "amp": trial["amp"] or "float32"}
        reason = why_not(trial, change, device, args.no_compile)
        if reason is None:
            try:
                row.update(run_row(args, config, weights, trial, device, data, peak))
                settings = trial
            except Exception as error:      # an out-of-memory or a compiler error: say so, go on without it
                row["status"] = "failed"
                reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        if reason:
            row.update(status=row.get("status", "skipped"), reason=reason)
        elif base_tokens_per_s is None:
            base_tokens_per_s = row["tokens_per_s"]
        if "tokens_per_s" in row and base_tokens_per_s:
            row["speed_x_first_row"] = round(row["tokens_per_s"] / base_tokens_per_s, 2)
        report["rows"].append(row)
        print_row(row, first=name == LADDER[0][0])
        if getattr(args, "json", None):    # after every row: a run stopped by a time limit keeps its rows
            _write_json(args.json, report)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return report


def run_row(args, config, weights, settings, device, data, peak) -> dict:
    """Time one row: warm-up passes (compiling where it compiles), then the median of `--repeats` passes."""
    torch._dynamo.reset()                  # each row compiles afresh, never up against the recompile limit
    model = build_transformer(config)
    model.load_state_dict(weights)
    step = ladder_step(model.to(device), settings, device, config.pad_id)
    batches = ladder_batches(args, config, data, settings["batch_factor"], settings["static"],
                             pinned=not settings["syncs"] and device.type == "cuda")

    def one_pass():
        total = torch.zeros((), device=device)
        for batch in batches:
            total = total + step(batch)
        total = float(total)               # the log step: the one wait for the device a pass
        if not math.isfinite(total):
            raise FloatingPointError(f"loss is {total}")

    first = _timed(one_pass, device)
    for _ in range(args.warmup - 1):
        one_pass()
    seconds = statistics.median(_timed(one_pass, device) for _ in range(args.repeats))
    flops = sum(transformer_flops(config, b.src.size(0), b.src.size(1), b.tgt_in.size(1)) for b in batches)
    tokens = sum(b.n_target_tokens for b in batches)
    syncs = sync_count(step, batches[0], device)
    return {"status": "ran", "batches": len(batches), "target_tokens": tokens,
            "padded_tokens": sum(b.src.numel() + b.tgt_in.numel() for b in batches),
            "tokens_per_s": round(tokens / seconds, 1), "step_ms": round(1000 * seconds / len(batches), 3),
            "tflops": round(flops / seconds / 1e12, 4), "share_of_peak": round(flops / seconds / peak, 4),
            "first_pass_s": round(first, 2), "syncs_per_step": syncs}


def print_row(row: dict, first: bool) -> None:
    if first:
        print("| row | precision | target tok/s | ms / step | TFLOP/s | % of peak | × first row | syncs / step |")
        print("|---|---|---|---|---|---|---|---|")
    if row["status"] != "ran":
        print(f"| {row['row']} | {row['amp']} | {row['status']}: {row['reason']} | | | | | |", flush=True)
        return
    syncs = "" if row["syncs_per_step"] is None else row["syncs_per_step"]
    print(f"| {row['row']} | {row['amp']} | {row['tokens_per_s']:,.0f} | {row['step_ms']:.1f} | {row['tflops']:.3f} "
          f"| {100 * row['share_of_peak']:.1f}% | {row.get('speed_x_first_row', 1.0):.2f} | {syncs} |", flush=True)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"{torch.cuda.get_device_name(device)} (capability {major}.{minor})"
    return platform.processor() or platform.machine()


def _write_json(path: Path, report: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(report, indent=1) + "\n")
    os.replace(tmp, path)                  # atomic: never a half-written file


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", default=os.environ.get("MULTI30K_DIR", str(ROOT.parent / "shared/data/multi30k")))
    p.add_argument("--tokenizer", type=Path, default=TOKENIZER)
    p.add_argument("--device", default="cpu", help="where to time: cpu, cuda, cuda:1, mps")
    p.add_argument("--real-batches", type=int, default=8, help="Multi30k batches timed in each round")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="padded tokens a batch, a side (default 2048; 8192 with --ladder)")
    p.add_argument("--threads", type=int, default=2, help="threads for the real batches (and the ladder), on a CPU")
    p.add_argument("--synthetic-threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--no-compile", action="store_true", help="leave out the compiled variants (minutes faster)")
    p.add_argument("--ladder", action="store_true", help="climb the speed ladder of one model instead")
    p.add_argument("--model", choices=sorted(MODELS), default="base", help="the ladder's model")
    p.add_argument("--larger-batch", type=int, default=4, help="the ladder's last row: this many times --max-tokens")
    p.add_argument("--matmul-size", type=int, default=None, help="n of the n×n matmul that measures the peak "
                   "(default 8192 on a GPU, 2048 on a CPU)")
    p.add_argument("--json", type=Path, default=None, help="--ladder: also write the rows here (JSON)")
    p.add_argument("--default-malloc", action="store_true", help="on a CPU, leave glibc's malloc as it is; by "
                   "default it keeps freed blocks for reuse, as `train` has it (transformer_lib.device.keep_freed_memory)")
    args = p.parse_args()
    device = _device(args.device)
    kept = device.type == "cpu" and not args.default_malloc and keep_freed_memory()
    args.matmul_size = args.matmul_size or (8192 if device.type == "cuda" else 2048)
    for name in ("real_batches", "repeats", "warmup", "larger_batch", "matmul_size", "max_tokens", "threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            _refuse(f"--{name.replace('_', '-')} must be a positive int, got {value}")

    tokenizer = SubwordTokenizer.load(args.tokenizer)
    if args.ladder:
        args.max_tokens = args.max_tokens or 8192
        torch.set_num_threads(args.threads)
        print(f"torch {torch.__version__}, {_device_name(device)}, {args.model} model, {args.max_tokens:,} padded "
              f"tokens a batch a side; median of {args.repeats} passes")
        ladder(args, device, tokenizer)
        return
    args.max_tokens = args.max_tokens or 2048
    config = multi30k_model_config(tokenizer)
    print(f"torch {torch.__version__}, {_device_name(device)}, CPU: {cpu_features()}, "
          f"ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', 'unset')}, malloc keeps freed blocks: "
          f"{'yes' if kept else 'no'}; median of {args.repeats} rounds")
    variants = build_variants(config, not args.no_compile, device)
    for title, threads, batches in [("synthetic batch", args.synthetic_threads, synthetic_batches(config)),
                                    ("Multi30k batches", args.threads,
                                     real_batches(args.data_dir, args.real_batches, args.max_tokens, tokenizer))]:
        if batches is None:
            continue
        batches = [batch.to(device) for batch in batches]
        torch.set_num_threads(threads)
        native = bf16_is_native(device)
        peaks = {"fp32": matmul_peak(torch.float32, args.matmul_size, device=device),
                 "bf16": matmul_peak(torch.bfloat16, args.matmul_size, device=device) if native else None}
        print(f"\n{threads} thread(s): matmul peak {peaks['fp32'] / 1e9:.0f} GFLOP/s fp32, "
              + (f"{peaks['bf16'] / 1e9:.0f} GFLOP/s bf16" if native
                 else "bf16 not measured (emulated here: its rows time the emulation)"))
        seconds, first = measure(variants, batches, args.repeats, args.warmup)
        report(f"{title}, {threads} thread(s)", config, batches, seconds, first, peaks)


def _device(name: str) -> torch.device:
    """--device as a torch.device, or one `error:` line and exit 2."""
    try:
        device = torch.device(name)
    except RuntimeError:
        _refuse(f"--device {name!r} is not a device; use cpu, cuda, cuda:N or mps")
    if device.type == "cuda" and not torch.cuda.is_available():
        _refuse(f"--device {name}: no CUDA device is visible here (torch {torch.__version__}); use --device cpu")
    if device.type == "mps" and not torch.backends.mps.is_available():
        _refuse(f"--device {name}: MPS is not available here; use --device cpu")
    return device


def _refuse(message: str):
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


if __name__ == "__main__":
    main()
