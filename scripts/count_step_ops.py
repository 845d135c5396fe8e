"""How many aten operations one training step of ours and of the peer issues: `python scripts/count_step_ops.py`.

Hand-written. Counts every operator call that reaches PyTorch's dispatcher (a TorchDispatchMode) during
one forward and backward pass of the Multi30k benchmark's model (pre-LN, d_model 256, 4 heads, d_ff
1024, 3+3 layers, an 8,000-token vocabulary) under bf16 autocast on the CPU, for our Transformer and
for `nn.Transformer` dressed as ours (scripts/peer_transformer.py), on a batch of 32 random sentences.
A step that is launch-bound on a GPU costs about its operator count; results/gpu/README.md quotes it.
"""
import collections
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
from peer_transformer import PeerTransformer  # noqa: E402
from transformer_lib.model import TransformerConfig, build_transformer  # noqa: E402


class CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func)] += 1
        return func(*args, **(kwargs or {}))


def main() -> None:
    torch.manual_seed(0)
    config = TransformerConfig(8000, 8000, 256, 4, 1024, 3, 3, 0.1, norm_first=True, pad_id=0)
    src, tgt = torch.randint(1, 8000, (32, 30)), torch.randint(1, 8000, (32, 31))
    for name, model in (("ours", build_transformer(config)), ("nn.Transformer", PeerTransformer(config))):
        with CountOps() as counter:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(src, tgt[:, :-1])
            logits.float().sum().backward()
        common = ", ".join(f"{op} {n}" for op, n in counter.counts.most_common(5))
        print(f"{name}: {sum(counter.counts.values()):,} aten calls a forward and backward ({common}, ...)")


if __name__ == "__main__":
    main()
