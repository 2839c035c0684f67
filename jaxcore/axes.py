"""The logical axis vocabulary.

Models name every parameter and activation dimension with one of these; the sharding
rules table (`jaxcore.sharding`) maps names to mesh axes. Keeping the names in one place
means a model never mentions a mesh axis, so parallelism stays configuration.
"""

BATCH = "batch"
LENGTH = "length"
EMBED = "embed"
MLP = "mlp"
HEADS = "heads"
KV_HEADS = "kv_heads"
HEAD_DIM = "head_dim"
VOCAB = "vocab"
LAYERS = "layers"
NORM = "norm"

ALL = (BATCH, LENGTH, EMBED, MLP, HEADS, KV_HEADS, HEAD_DIM, VOCAB, LAYERS, NORM)
