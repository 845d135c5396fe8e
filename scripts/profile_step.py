"""Where one training step of ours and of the peer spends its time: `python scripts/profile_step.py --device cuda`.

Hand-written. For the Multi30k benchmark's model (pre-LN, d_model 256, 4 heads, d_ff 1024, 3+3 layers, an
8,000-token vocabulary, tied embeddings) on a batch shaped like the benchmark's (--batch sentences of --length
tokens a side, about 2,048 padded tokens), times a full training step (forward, label-smoothed loss,
backward, Adam) of our Transformer, with each attention path, and of `nn.Transformer` dressed as ours
(scripts/peer_transformer.py): the median of --steps synchronized steps after --warmup. Then torch.profiler
records --profile-steps more of each and prints the operators that took the most time (self time on the
device where it is a GPU, on the host otherwise) and how many synchronizing calls and copies (a device-to-host
copy, such as `.tolist()`, makes the host wait) each step makes.

Written for the GPU record (results/gpu/README.md): on an H200 our benchmark step took 8 times the peer's,
the reverse of the CPU, with about the same number of operators (scripts/count_step_ops.py).
"""
import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
from peer_transformer import PeerTransformer  # noqa: E402
from transformer_lib.model import TransformerConfig, build_transformer  # noqa: E402
from transformer_lib.training import LabelSmoothingLoss  # noqa: E402

PAD = 0
# CUDA runtime calls where the host may wait for the device
SYNC_EVENTS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpyAsync")


def models(config: TransformerConfig) -> dict:
    torch.manual_seed(0)
    fused = build_transformer(dataclasses.replace(config, fused_attention=True))
    explicit = build_transformer(dataclasses.replace(config, fused_attention=False))
    explicit.load_state_dict(fused.state_dict())
    return {"ours (fused attention)": fused, "ours (explicit attention)": explicit,
            "nn.Transformer": PeerTransformer(config)}


def step_function(model, device, amp, batch: int, length: int, vocab: int):
    generator = torch.Generator().manual_seed(1)
    src = torch.randint(3, vocab, (batch, length), generator=generator).to(device)
    tgt = torch.randint(3, vocab, (batch, length + 1), generator=generator).to(device)
    src[batch // 2:, length - 3:] = PAD
    tgt[batch // 2:, length - 2:] = PAD
    loss_fn = LabelSmoothingLoss(0.1, ignore_index=PAD)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(src, tgt[:, :-1], src == PAD, tgt[:, :-1] == PAD)
            loss = loss_fn(logits.float().reshape(-1, vocab), tgt[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return step


def synchronize(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--amp", choices=["bf16", "none"], default="bf16")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--length", type=int, default=16)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--profile-steps", type=int, default=5)
    p.add_argument("--top", type=int, default=12)
    args = p.parse_args()
    device = torch.device(args.device)
    config = TransformerConfig(8000, 8000, 256, 4, 1024, 3, 3, 0.1, norm_first=True, pad_id=PAD)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sort_by = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}), "
          f"torch {torch.__version__}, amp {args.amp}, batch {args.batch} x {args.length} tokens a side")
    for name, model in models(config).items():
        step = step_function(model.to(device).train(), device, args.amp == "bf16", args.batch, args.length, 8000)
        for _ in range(args.warmup):
            step()
        times = []
        for _ in range(args.steps):
            synchronize(device)
            start = time.perf_counter()
            step()
            synchronize(device)
            times.append(time.perf_counter() - start)
        with profile(activities=activities) as prof:
            for _ in range(args.profile_steps):
                step()
            synchronize(device)
        events = prof.key_averages()
        syncs = {e.key: e.count // args.profile_steps for e in events if e.key in SYNC_EVENTS}
        print(f"\n== {name}: {statistics.median(times) * 1e3:.1f} ms a step (median of {args.steps}); "
              f"synchronizing calls and copies a step: {syncs or 'none recorded'}")
        print(events.table(sort_by=sort_by, row_limit=args.top))


if __name__ == "__main__":
    main()
