"""The step benchmark's speed ratio on other Multi30k batches than its first 8 (run once, 2026-11-27):

    .venv/bin/python results/multi30k_trials/pair10_seed_0/probe_batch_mix.py   # -> probe_batch_mix.log

Times the peer (float32) and ours (bf16, the paper's dropout; and the Multi30k table's recipe: bf16,
dropout also on the attention weights, the explicit attention) with scripts/bench_training_step.py's
own steps, interleaved in rounds (1 warm-up, median of 3), at 2 threads: on the first 8 batches of
epoch 0 (what that script times) and on the 40 after them. Multi30k from $MULTI30K_DIR, else
../shared/data/multi30k beside the repository. (This is the script that ran, moved here: it then read
the same files by absolute paths.)
"""
import importlib.util
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
spec = importlib.util.spec_from_file_location("bench", ROOT / "scripts" / "bench_training_step.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
from transformer_lib.model import TransformerConfig  # noqa: E402
from transformer_lib.tokenization import SubwordTokenizer  # noqa: E402

tokenizer = SubwordTokenizer.load(bench.TOKENIZER)
config = TransformerConfig(tokenizer.vocab_size, tokenizer.vocab_size, 256, 4, 1024, 3, 3, 0.1, norm_first=True,
                           pad_id=tokenizer.pad_id)
keep = ["peer fp32", "ours bf16, Multi30k table's dropout, explicit attention", "ours bf16, paper dropout"]
variants = {k: v for k, v in bench.build_variants(config, False).items() if k in keep}
data_dir = os.environ.get("MULTI30K_DIR", str(ROOT.parent / "shared" / "data" / "multi30k"))
batches = bench.real_batches(data_dir, 48, 2048, tokenizer)
torch.set_num_threads(2)
for name, chunk in (("first 8", batches[:8]), ("batches 8-47", batches[8:48])):
    T = sum(b.tgt_out.size(1) for b in chunk) / len(chunk)
    B = sum(b.tgt_out.size(0) for b in chunk) / len(chunk)
    tokens = sum(int((b.tgt_out != tokenizer.pad_id).sum()) for b in chunk)
    seconds, _ = bench.measure(variants, chunk, 3, 1)
    peer = seconds["peer fp32"]
    print(f"{name}: mean T {T:.1f}, B {B:.1f}; " + "; ".join(
        f"{k}: {tokens / s:.0f} tok/s, {peer / s:.2f}x" for k, s in seconds.items()), flush=True)
