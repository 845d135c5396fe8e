"""What `keep_freed_memory` (transformer_lib/device.py) changes in a training step on this CPU:

    .venv/bin/python results/speed/probe_keep_freed_memory.py   # -> probe_keep_freed_memory.log beside it

The allocator setting holds for a whole process, so each setting runs in a process of its own, in the
order default, keep, default, keep. Each times the peer (float32) and ours with the Multi30k table's recipe
(bf16, dropout on the attention weights, the explicit attention) with scripts/bench_training_step.py's own
steps, interleaved in rounds (1 warm-up, median of 2), at 2 threads, on 20 Multi30k batches of seed 0's
epoch 0 (its batches 8-27, longer than the first 8 that the step benchmark times). Multi30k from
$MULTI30K_DIR, else ../shared/data/multi30k beside the repository.
"""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = ["peer fp32", "ours bf16, Multi30k table's dropout, explicit attention"]


def one_process(mode: str) -> str:
    import torch
    sys.path.insert(0, str(ROOT))
    from transformer_lib.device import keep_freed_memory
    if mode == "keep" and not keep_freed_memory():
        return "keep: keep_freed_memory() said False (not glibc): nothing to compare"
    spec = importlib.util.spec_from_file_location("bench", ROOT / "scripts" / "bench_training_step.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    tokenizer = bench.SubwordTokenizer.load(bench.TOKENIZER)
    variants = {k: v for k, v in bench.build_variants(bench.multi30k_model_config(tokenizer), False).items()
                if k in VARIANTS}
    data_dir = os.environ.get("MULTI30K_DIR", str(ROOT.parent / "shared" / "data" / "multi30k"))
    batches = bench.real_batches(data_dir, 28, 2048, tokenizer)[8:28]
    torch.set_num_threads(2)
    tokens = sum(int((b.tgt_out != tokenizer.pad_id).sum()) for b in batches)
    seconds, _ = bench.measure(variants, batches, 2, 1)
    peer = seconds["peer fp32"]
    return f"{mode}: " + "; ".join(f"{k}: {tokens / s:.0f} tok/s, {peer / s:.2f}x" for k, s in seconds.items())


if __name__ == "__main__":
    if len(sys.argv) > 1:
        print(one_process(sys.argv[1]), flush=True)
    else:
        lines = [subprocess.run([sys.executable, __file__, mode], capture_output=True, text=True, check=True
                                ).stdout.strip() for mode in ("default", "keep", "default", "keep")]
        print("\n".join(lines))
        Path(__file__).with_suffix(".log").write_text("\n".join(lines) + "\n")
