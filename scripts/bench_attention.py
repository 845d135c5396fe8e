"""Speed of our attention and model next to PyTorch's: `.venv/bin/python scripts/bench_attention.py`.

Hand-written (not exported from a notebook). It measures, in one run, and prints a table of:

1. `MultiHeadAttention` forward + backward with the fused path (`F.scaled_dot_product_attention`)
   against the explicit matmul-softmax path the course teaches: B=32, T=128, d_model=512, 8 heads,
   without a mask and with a causal mask.
2. One training step (forward, cross-entropy, backward, Adam step) of our `Transformer` against
   `nn.Transformer` wrapped as the Multi30k benchmark's peer (scripts/peer_transformer.py: the same
   embedding, sinusoidal positions and tied output layer) at the same sizes (d_model 256, 4 heads,
   d_ff 1024, 3+3 layers, post-LN, vocabulary 8000, B=32, S=T=32, dropout 0.1, a padded batch), our
   model with fused and with explicit attention.
3. The same training step of our model under bf16 autocast against float32: the lever the Multi30k
   benchmark pulls on CPUs with bf16 instructions (AVX-512 BF16, AMX).

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
import torch.nn.functional as F

from peer_transformer import PeerTransformer   # scripts/, beside this file
from transformer_lib.attention import subsequent_mask
from transformer_lib.model import Transformer, TransformerConfig
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


def torch_transformer(V, d_model, n_heads, d_ff, n_layers, dropout, max_len) -> PeerTransformer:
    """nn.Transformer with the same front and back as ours (the Multi30k benchmark's peer), post-LN
    without the final norms nn.Transformer always adds, like the paper and like our post-LN model."""
    peer = PeerTransformer(TransformerConfig(V, V, d_model, n_heads, d_ff, n_layers, n_layers, dropout,
                                             max_len=max_len, norm_first=False))
    peer.core.encoder.norm = peer.core.decoder.norm = None
    return peer


def training_variants(device: torch.device, V=8000, d_model=256, n_heads=4, d_ff=1024, n_layers=3,
                      B=32, S=32, T=32, dropout=0.1):
    generator = torch.Generator().manual_seed(0)
    src = torch.randint(1, V, (B, S), generator=generator)
    tgt = torch.randint(1, V, (B, T + 1), generator=generator)
    src[B // 2:, 3 * S // 4:] = 0                                # half the batch padded
    tgt[B // 2:, 3 * T // 4:] = 0
    src, tgt = src.to(device), tgt.to(device)
    tgt_in, labels = tgt[:, :-1], tgt[:, 1:]
    src_pad, tgt_pad = src == 0, tgt_in == 0

    torch.manual_seed(0)
    models = {
        "ours (fused)": Transformer(V, V, d_model, n_heads, d_ff, n_layers, n_layers, dropout, max_len=S + T,
                                    fused_attention=True),
        "ours (explicit)": Transformer(V, V, d_model, n_heads, d_ff, n_layers, n_layers, dropout, max_len=S + T,
                                       fused_attention=False),
        "nn.Transformer": torch_transformer(V, d_model, n_heads, d_ff, n_layers, dropout, max_len=S + T),
    }
    counts = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}

    def step(model, bf16=False):
        model.to(device).train()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)

        def run():
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                logits = model(src, tgt_in, src_pad, tgt_pad)                       # (B, T, V)
            loss = F.cross_entropy(logits.float().reshape(-1, V), labels.reshape(-1), ignore_index=0)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        return run

    variants = {name: step(m) for name, m in models.items()}
    variants["ours (bf16)"] = step(models["ours (fused)"], bf16=True)   # same weights, bf16 autocast
    return variants, counts


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
    variants, counts = training_variants(device)
    ms = median_ms(variants, args.repeats, args.warmup, device)
    for ours in ["ours (fused)", "ours (explicit)"]:
        rows.append(("training step, D=256 H=4 d_ff=1024 3+3 layers V=8000 B=32 S=T=32", ours, ms[ours],
                     "nn.Transformer", ms["nn.Transformer"]))
    rows.append(("the same training step, bf16 autocast vs float32", "ours (bf16)", ms["ours (bf16)"],
                 "ours (fused)", ms["ours (fused)"]))

    print(f"parameters: ours {counts['ours (fused)']:,}, nn.Transformer + embedding {counts['nn.Transformer']:,}")
    print()
    print(f"| {'measurement':<70} | {'A':<15} | {'A (ms)':>8} | {'B':<14} | {'B (ms)':>8} | {'A / B':>6} |")
    print(f"|{'-' * 72}|{'-' * 17}|{'-' * 10}|{'-' * 16}|{'-' * 10}|{'-' * 8}|")
    for label, a, a_ms, b, b_ms in rows:
        print(f"| {label:<70} | {a:<15} | {a_ms:>8.1f} | {b:<14} | {b_ms:>8.1f} | {a_ms / b_ms:>6.2f} |")


if __name__ == "__main__":
    main()
