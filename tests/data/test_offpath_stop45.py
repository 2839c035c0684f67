"""Stop 45: reading the tokens of a build that kept no records."""

import json

import pytest

from data import open_dataset
from data.errors import BuildError


def test_tokens_of_a_build_that_kept_no_records_say_so(tmp_path):
    # Grain's source over the empty shards failed at the first read with a
    # ZeroDivisionError from its record index.
    tokens = tmp_path / "v1" / "tokens"
    tokens.mkdir(parents=True)
    shard = {"path": "tokens/tokens-00000-of-00001.array_record", "records": 0, "tokens": 0}
    index = {"records": 0, "tokens": 0, "vocab_size": 257, "shards": [shard]}
    (tokens / "index.json").write_text(json.dumps(index))
    with pytest.raises(BuildError, match=r"tokenized no records .* `jaxcore data stats`"):
        open_dataset(tokens / "index.json")
