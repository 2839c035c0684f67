"""Helper for the jaxcore.hf multi-process test, run under `jaxcore launch -n 2`.

``hf_load_sharded.py HF_DIR OUT``: load HF_DIR onto an fsdp=8 mesh spanning both
processes while counting the bytes this process reads through safetensors slices, check
every local shard against a plain read, save the sharded params back (process 0 writes),
and write OUT/rank{i}.json.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from jaxcore.distributed import initialize

initialize()

import jax  # noqa: E402
import numpy as np  # noqa: E402

import jaxcore as jc  # noqa: E402
from jaxcore import hf  # noqa: E402
from jaxcore.hf import reader as hf_load  # noqa: E402

read = {"bytes": 0, "files": set()}
real_safe_open = hf_load.safe_open


class CountingSlice:
    def __init__(self, inner):
        self.inner = inner

    def get_shape(self):
        return self.inner.get_shape()

    def __getitem__(self, index):
        out = self.inner[index]
        read["bytes"] += out.numel() * out.element_size()
        return out


class CountingFile:
    def __init__(self, path, **kwargs):
        self.inner = real_safe_open(path, **kwargs)
        read["files"].add(Path(path).name)

    def __enter__(self):
        self.handle = self.inner.__enter__()
        return self

    def __exit__(self, *exc):
        return self.inner.__exit__(*exc)

    def keys(self):
        return self.handle.keys()

    def get_slice(self, name):
        return CountingSlice(self.handle.get_slice(name))


def main(directory: str, out: str) -> None:
    mesh = jc.build_mesh(jc.ParallelConfig(fsdp=8))
    hf_load.safe_open = CountingFile
    cfg, params = hf.load(directory, mesh)
    hf_load.safe_open = real_safe_open
    counted = {"bytes": read["bytes"], "files": sorted(read["files"])}
    _, full = hf.load(directory)  # every tensor, plainly (not counted)
    shards = 0
    for name, array in params.items():
        assert not array.is_fully_addressable, name
        for shard in array.addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), full[name][shard.index])
            shards += 1
    hf.save(params, cfg, Path(out) / "saved")
    result = {
        "rank": jax.process_index(),
        "bytes_read": counted["bytes"],
        "files_opened": counted["files"],
        "total_bytes": int(sum(v.nbytes for v in full.values())),
        "replicated_bytes": int(
            sum(full[k].nbytes for k, v in params.items() if v.sharding.is_fully_replicated)
        ),
        "shards_checked": shards,
    }
    (Path(out) / f"rank{jax.process_index()}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
