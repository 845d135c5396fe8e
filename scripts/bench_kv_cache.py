"""How much the key/value cache speeds up decoding: greedy decoding of a batch for a fixed number
of steps, with and without the cache, on randomly initialised models of two sizes.

    python scripts/bench_kv_cache.py [--steps 64] [--batch 32] [--device cpu] [--threads 1] [--compile]

With --compile it also times cached decoding of the model after `compile_for_decoding` (torch.compile
of encode and decode), and reports the one-off compilation time apart.

Speed does not depend on the weights, so untrained models do: </s> is given the padding id, whose
tied output row is zero, so it is never the most likely token and every sentence runs all the steps.
"""
import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from transformer_lib.decoding import compile_for_decoding, greedy_decode  # noqa: E402
from transformer_lib.device import pick_device  # noqa: E402
from transformer_lib.model import TransformerConfig, build_transformer  # noqa: E402

VOCAB_SIZE, PAD, BOS = 1000, 0, 1
MODELS = {  # name -> (d_model, n_heads, d_ff, layers in the encoder and in the decoder)
    "course (d_model 128, 2+2 layers)": (128, 4, 512, 2),
    "d_model 256, 3+3 layers": (256, 8, 1024, 3),
}


def seconds(fn, device: torch.device, repeats: int) -> float:
    """The fastest of `repeats` timed runs of fn() (after one untimed warm-up run)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--steps", type=int, default=64, help="tokens generated per sentence")
    parser.add_argument("--batch", type=int, default=32, help="sentences decoded together")
    parser.add_argument("--src-len", type=int, default=20, help="source length in tokens")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per setting (the fastest counts)")
    parser.add_argument("--device", default=None, help="cuda, mps or cpu (default: the best present)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's)")
    parser.add_argument("--compile", action="store_true", help="also time cached decoding after torch.compile")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    print(f"greedy decoding, {args.steps} steps, batch {args.batch}, source length {args.src_len}, "
          f"device {device.type}, {torch.get_num_threads()} CPU threads")
    print(f"{'model':34} {'params':>8} {'no cache s':>11} {'cache s':>8} {'speedup':>8}"
          + (f" {'compiled s':>11} {'vs cache':>9} {'compiling s':>12}" if args.compile else ""))
    for name, (d_model, n_heads, d_ff, layers) in MODELS.items():
        torch.manual_seed(0)
        config = TransformerConfig(VOCAB_SIZE, VOCAB_SIZE, d_model, n_heads, d_ff, layers, layers, pad_id=PAD)
        model = build_transformer(config).to(device).eval()
        src = torch.randint(3, VOCAB_SIZE, (args.batch, args.src_len), device=device)
        run = {use_cache: (lambda use_cache=use_cache: greedy_decode(
            model, src, None, BOS, PAD, max_len=args.steps, use_cache=use_cache)) for use_cache in (False, True)}
        outputs = run[True]()
        if any(len(ids) != args.steps for ids in outputs) or outputs != run[False]():
            raise RuntimeError("every sentence should run all the steps, with the same tokens with or without cache")
        times = {use_cache: seconds(fn, device, args.repeats) for use_cache, fn in run.items()}
        params = sum(p.numel() for p in model.parameters())
        line = (f"{name:34} {params / 1e6:7.2f}M {times[False]:11.2f} {times[True]:8.2f} "
                f"{times[False] / times[True]:7.1f}x")
        if args.compile:
            compile_for_decoding(model)
            start = time.perf_counter()
            if run[True]() != outputs:                         # compiles here, on the first call
                raise RuntimeError("the compiled model should give the same tokens")
            compiling = time.perf_counter() - start
            compiled = seconds(run[True], device, args.repeats)
            line += f" {compiled:11.2f} {times[True] / compiled:8.1f}x {compiling:12.1f}"
        print(line)


if __name__ == "__main__":
    main()
