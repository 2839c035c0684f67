"""Load time and peak host RSS: `jaxcore.hf.load` (2 processes x 4 CPU devices, fsdp=8)
versus `transformers.AutoModelForCausalLM.from_pretrained`, on a Llama-shaped bf16
checkpoint of ~1B parameters generated on the fly (random weights, nothing downloaded).

Both load into float32 (the training dtype). Each jaxcore process reads only its half
of every tensor; the target is peak RSS per process < 1.5x that process's shard of the
weights. RSS is the process's peak resident set (``ru_maxrss``: interpreter, JAX, torch
for safetensors' bf16 reads, and the weights), so it includes the import baseline.

    python benchmarks/hf_load.py                 # ~1B params (18 layers of d=2048)
    python benchmarks/hf_load.py --layers 4      # smaller, for a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def llama_config(layers: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 32000,
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": layers,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    }


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def generate(directory: str, layers: int) -> None:
    """Random bf16 weights written with jaxcore.hf.save (the format save_pretrained writes)."""
    import ml_dtypes
    import numpy as np

    from jaxcore import hf
    from jaxcore.hf import layout

    cfg = hf.config_from_hf(llama_config(layers))
    size = layout.sizes(cfg)
    rng = np.random.default_rng(0)
    params = {}
    for m in layout.tensor_maps(cfg):
        shape = tuple(size[c] for c in ("l" * m.stacked) + m.native_dims)
        x = rng.standard_normal(shape, dtype=np.float32) * 0.02
        params[m.native] = x.astype(ml_dtypes.bfloat16)
        del x
    hf.save(params, cfg, directory, max_shard_bytes=2**30)


def jaxcore_worker(directory: str, out: str) -> None:
    """One of 2 processes: load onto the fsdp=8 mesh; time, shard bytes and peak RSS."""
    from jaxcore.distributed import initialize

    initialize()
    import jax

    import jaxcore as jc
    from jaxcore import hf

    mesh = jc.build_mesh(jc.ParallelConfig(fsdp=8))
    baseline = peak_rss_bytes()
    start = time.perf_counter()
    _, params = hf.load(directory, mesh, dtype="float32")
    jax.block_until_ready(params)
    seconds = time.perf_counter() - start
    shard = sum(s.data.nbytes for a in params.values() for s in a.addressable_shards)
    result = {
        "seconds": seconds,
        "peak_rss": peak_rss_bytes(),
        "baseline_rss": baseline,
        "shard_bytes": shard,
        "params": int(sum(a.size for a in params.values())),
    }
    Path(out, f"jaxcore{jax.process_index()}.json").write_text(json.dumps(result))


def transformers_worker(directory: str, out: str) -> None:
    import torch
    import transformers

    baseline = peak_rss_bytes()
    start = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    seconds = time.perf_counter() - start
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    result = {
        "seconds": seconds,
        "peak_rss": peak_rss_bytes(),
        "baseline_rss": baseline,
        "shard_bytes": weights,
    }
    Path(out, "transformers.json").write_text(json.dumps(result))


def _run(args: list[str], env: dict) -> None:
    proc = subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{args[2:4]} failed:\n{proc.stderr[-3000:]}")


def main() -> None:
    from benchmarks._common import print_table, write_results

    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=18)
    p.add_argument("--name", default="hf_load")
    args = p.parse_args()
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "GLIBC_TUNABLES")}
    env["PYTHONPATH"] = str(ROOT)
    env["JAX_PLATFORMS"] = "cpu"
    me = [sys.executable, str(Path(__file__).resolve())]
    with tempfile.TemporaryDirectory() as tmp:
        ckpt, out = Path(tmp, "llama"), Path(tmp)
        load_before = os.getloadavg()
        _run([*me, "generate", str(ckpt), str(args.layers)], env)
        file_bytes = sum(f.stat().st_size for f in ckpt.glob("*.safetensors"))
        launch = [sys.executable, "-m", "jaxcore.launch", "-n", "2", "--devices-per-process", "4"]
        _run([*launch, str(Path(__file__).resolve()), "jaxcore", str(ckpt), str(out)], env)
        _run([*me, "transformers", str(ckpt), str(out)], env)
        load_after = os.getloadavg()
        ours = [json.loads(Path(out, f"jaxcore{r}.json").read_text()) for r in range(2)]
        theirs = json.loads(Path(out, "transformers.json").read_text())

    gib = 2**30
    rows = []
    for i, r in enumerate(ours):
        rows.append(
            [
                f"jaxcore.hf.load, process {i} (4 devices)",
                f"{r['seconds']:.1f}",
                f"{r['peak_rss'] / gib:.2f}",
                f"{r['shard_bytes'] / gib:.2f}",
                f"{r['peak_rss'] / r['shard_bytes']:.2f}",
            ]
        )
    rows.append(
        [
            "transformers.from_pretrained (1 process)",
            f"{theirs['seconds']:.1f}",
            f"{theirs['peak_rss'] / gib:.2f}",
            f"{theirs['shard_bytes'] / gib:.2f}",
            f"{theirs['peak_rss'] / theirs['shard_bytes']:.2f}",
        ]
    )
    params = ours[0]["params"]
    print_table(
        f"Llama-shaped checkpoint, {params / 1e9:.2f}B params, {file_bytes / gib:.2f} GiB bf16 "
        f"-> float32; load average {load_before[0]:.1f} -> {load_after[0]:.1f} "
        "(shared 2-core machine)",
        ["loader", "seconds", "peak RSS GiB", "its weights GiB", "RSS / weights"],
        rows,
    )
    slowest = max(r["seconds"] for r in ours)
    print(
        f"\nload time ratio transformers / jaxcore (slowest process): "
        f"{theirs['seconds'] / slowest:.2f}"
    )
    worst = max(r["peak_rss"] / r["shard_bytes"] for r in ours)
    print(f"peak RSS / shard, worst jaxcore process: {worst:.2f} (target < 1.5)")
    write_results(
        args.name,
        {
            "params": params,
            "layers": args.layers,
            "file_bytes": file_bytes,
            "jaxcore": ours,
            "transformers": theirs,
            "time_ratio_transformers_over_jaxcore": theirs["seconds"] / slowest,
            "worst_rss_over_shard": worst,
            "target_rss_over_shard": 1.5,
            "load_average": {"before": load_before, "after": load_after},
        },
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("generate", "jaxcore", "transformers"):
        mode, *rest = sys.argv[1:]
        if mode == "generate":
            generate(rest[0], int(rest[1]))
        elif mode == "jaxcore":
            jaxcore_worker(*rest)
        else:
            transformers_worker(*rest)
    else:
        main()
