"""Speed of the fused attention path against the explicit one: `.venv/bin/python scripts/bench_attention.py`.

Hand-written (not exported from a notebook). It times `MultiHeadAttention` forward + backward with
the fused path (`F.scaled_dot_product_attention`) against the explicit matmul-softmax path the
course teaches: B=32, T=128, d_model=512, 8 heads, without a mask and with a causal mask. (A whole
training step, ours against `nn.Transformer`, is timed by scripts/bench_training_step.py.)

Each number is the median of `--repeats` timed runs after `--warmup` untimed ones; the variants
being compared are run in turn inside each repeat, so that a change in machine load hits all of
them alike. Ratios above 1 mean the first variant is slower. On a CPU that other jobs share, several
threads that wait for each other can make single runs many times slower; `--threads 1` avoids that.
"""
import argparse
import platform
import statistics
import time

import torch

from transformer_lib.attention import subsequent_mask
from transformer_lib.multihead import MultiHeadAttention


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def median_ms(variants: dict, repeats: int, warmup: int, device: torch.device) -> dict:
    """Median wall time (ms) of each zero-argument callable in `variants`, run in turn per repeat."""
    for run in variants.values():
        for _ in range(warmup):
            run()
    times = {name: [] for name in variants}
    for _ in range(repeats):
        for name, run in variants.items():
            synchronize(device)
            start = time.perf_counter()
            run()
            synchronize(device)
            times[name].append(time.perf_counter() - start)
    return {name: 1000 * statistics.median(t) for name, t in times.items()}


def attention_variants(device: torch.device, causal: bool, B=32, T=128, d_model=512, n_heads=8) -> dict:
    torch.manual_seed(0)
    mha = MultiHeadAttention(d_model, n_heads, dropout=0.0).to(device)
    x = torch.randn(B, T, d_model, device=device, requires_grad=True)
    mask = subsequent_mask(T, device=device) if causal else None

    def step(fused: bool):
        def run():
            mha.fused = fused
            out, _ = mha(x, x, x, attn_mask=mask)
            out.sum().backward()
            mha.zero_grad(set_to_none=True)
            x.grad = None
        return run

    return {"explicit": step(False), "fused": step(True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads (default: PyTorch's choice); on a CPU shared with other jobs, "
                             "--threads 1 gives steadier numbers")
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    print(f"torch {torch.__version__}, device {device}, {torch.get_num_threads()} threads, "
          f"{platform.processor() or platform.machine()}; median of {args.repeats} runs after {args.warmup} warm-up")
    rows = []
    for causal in [False, True]:
        ms = median_ms(attention_variants(device, causal), args.repeats, args.warmup, device)
        label = f"MultiHeadAttention fwd+bwd, B=32 T=128 D=512 H=8, {'causal mask' if causal else 'no mask'}"
        rows.append((label, "explicit", ms["explicit"], "fused", ms["fused"]))
    print()
    print(f"| {'measurement':<70} | {'A':<15} | {'A (ms)':>8} | {'B':<14} | {'B (ms)':>8} | {'A / B':>6} |")
    print(f"|{'-' * 72}|{'-' * 17}|{'-' * 10}|{'-' * 16}|{'-' * 10}|{'-' * 8}|")
    for label, a, a_ms, b, b_ms in rows:
        print(f"| {label:<70} | {a:<15} | {a_ms:>8.1f} | {b:<14} | {b_ms:>8.1f} | {a_ms / b_ms:>6.2f} |")


if __name__ == "__main__":
    main()
