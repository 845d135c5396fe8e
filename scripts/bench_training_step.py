"""Our training step against nn.Transformer's, side by side: `python scripts/bench_training_step.py`.

Hand-written (not exported from a notebook). One run times one training step (forward, label-smoothed
loss, backward, gradient clipping, Adam step: the Trainer's step) of

- the peer: `nn.Transformer` dressed as our model (scripts/peer_transformer.py), float32, eager;
- ours in float32, eager (the like-for-like comparison), and ours under bf16 autocast;
- ours under bf16 with dropout where the paper puts it (§5.4: sublayer outputs and embeddings, not
  attention weights and feed-forward hidden units: `attention_dropout=0, activation_dropout=0`),
  with the fused attention (`F.scaled_dot_product_attention`, the default) and with the explicit
  one (`fused_attention=False`, notebook 05's formula): which is faster depends on the kernels;
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
"""
import argparse
import copy
import os
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from peer_transformer import PeerTransformer  # noqa: E402
from transformer_lib.data import Batch, TranslationData, load_pairs  # noqa: E402
from transformer_lib.model import (TransformerConfig, build_transformer, set_inner_dropout,  # noqa: E402
                                   transformer_flops)
from transformer_lib.tokenization import SubwordTokenizer  # noqa: E402
from transformer_lib.training import LabelSmoothingLoss, translation_loss  # noqa: E402

VARIANTS = ("peer fp32", "ours fp32", "ours bf16", "ours bf16, paper dropout",
            "ours bf16, paper dropout, explicit attention", "ours fp32 compiled", "ours bf16 compiled")
TOKENIZER = ROOT / "results" / "multi30k" / "seed_0" / "tokenizer.json"   # the Multi30k benchmark's vocabulary


def training_step(model: nn.Module, bf16: bool, pad_id: int):
    """One update as the Trainer makes it: autocast forward, loss, backward, clip to norm 1, Adam step."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    criterion = LabelSmoothingLoss(0.1, ignore_index=pad_id)
    model.train()

    def step(batch: Batch) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss, _ = translation_loss(model, batch, criterion)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    return step


def build_variants(config: TransformerConfig, compile_: bool) -> dict:
    """name -> step function; every model of ours starts from the same weights."""
    torch.manual_seed(0)
    ours = build_transformer(config)
    torch.manual_seed(0)
    variants = {"peer fp32": training_step(PeerTransformer(config), False, config.pad_id)}
    for name in VARIANTS[1:]:
        if "compiled" in name and not compile_:
            continue
        model = copy.deepcopy(ours)
        if "explicit attention" in name:     # softmax(QK^T/sqrt(d_k))V written out, not the fused kernel
            model = build_transformer(replace(config, fused_attention=False))
            model.load_state_dict(ours.state_dict())
        if "paper dropout" in name:          # no dropout on attention weights and hidden units (§5.4)
            set_inner_dropout(model, attention=0.0, activation=0.0)
        if "compiled" in name:
            model.compile(dynamic=True)      # one graph for every batch shape, as `train --compile`
        variants[name] = training_step(model, "bf16" in name, config.pad_id)
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
    first = {}
    for name, step in variants.items():
        start = time.perf_counter()
        for batch in batches:
            step(batch)                    # compiles here, for the compiled variants
        first[name] = time.perf_counter() - start
        for _ in range(warmup - 1):
            for batch in batches:
                step(batch)
    times = {name: [] for name in variants}
    for _ in range(repeats):
        for name, step in variants.items():
            start = time.perf_counter()
            for batch in batches:
                step(batch)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}, first


def matmul_peak(dtype: torch.dtype, n=2048, repeats=5) -> float:
    """FLOP/s of an n×n by n×n matmul, the best of `repeats`: the most this CPU's BLAS reaches."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(repeats))
    return 2 * n ** 3 / best


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def report(title: str, config, batches, seconds: dict, first: dict, peaks: dict) -> None:
    flops = sum(transformer_flops(config, b.src.size(0), b.src.size(1), b.tgt_in.size(1)) for b in batches)
    tokens = sum(b.n_target_tokens for b in batches)
    peer = seconds["peer fp32"]
    print(f"\n{title}: {len(batches)} batch(es), {tokens:,} target tokens, {flops / 1e9:,.1f} GFLOP a pass")
    print("| variant | ms / step | target tok/s | time / peer's | speed × peer | GFLOP/s | % of peak | first pass (s) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, s in seconds.items():
        peak = peaks["bf16" if "bf16" in name else "fp32"]
        print(f"| {name} | {1000 * s / len(batches):.1f} | {tokens / s:,.0f} | {s / peer:.2f} | {peer / s:.2f} | "
              f"{flops / s / 1e9:.1f} | {100 * flops / s / peak:.0f}% | {first[name]:.1f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", default=os.environ.get("MULTI30K_DIR", str(ROOT.parent / "shared/data/multi30k")))
    p.add_argument("--tokenizer", type=Path, default=TOKENIZER)
    p.add_argument("--real-batches", type=int, default=8, help="Multi30k batches timed in each round")
    p.add_argument("--max-tokens", type=int, default=2048)
    p.add_argument("--threads", type=int, default=2, help="threads for the real batches")
    p.add_argument("--synthetic-threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--no-compile", action="store_true", help="leave out the compiled variants (minutes faster)")
    args = p.parse_args()

    tokenizer = SubwordTokenizer.load(args.tokenizer)
    config = TransformerConfig(tokenizer.vocab_size, tokenizer.vocab_size, 256, 4, 1024, 3, 3, 0.1,
                               norm_first=True, pad_id=tokenizer.pad_id)
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', 'unset')}; median of {args.repeats} rounds")
    variants = build_variants(config, not args.no_compile)
    for title, threads, batches in [("synthetic batch", args.synthetic_threads, synthetic_batches(config)),
                                    ("Multi30k batches", args.threads,
                                     real_batches(args.data_dir, args.real_batches, args.max_tokens, tokenizer))]:
        if batches is None:
            continue
        torch.set_num_threads(threads)
        peaks = {"fp32": matmul_peak(torch.float32), "bf16": matmul_peak(torch.bfloat16)}
        print(f"\n{threads} thread(s): matmul peak {peaks['fp32'] / 1e9:.0f} GFLOP/s fp32, "
              f"{peaks['bf16'] / 1e9:.0f} GFLOP/s bf16")
        seconds, first = measure(variants, batches, args.repeats, args.warmup)
        report(f"{title}, {threads} thread(s)", config, batches, seconds, first, peaks)


if __name__ == "__main__":
    main()
