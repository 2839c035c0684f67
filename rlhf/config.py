"""YAML configs for ``jaxcore rlhf STAGE CONFIG.yaml``, validated into frozen dataclasses.

Each section becomes the dataclass the Python API takes (``model`` -> `TransformerConfig`,
``parallel`` -> `jaxcore.ParallelConfig`, ``serving`` -> `inference.ServingConfig`,
``ppo`` -> `PPOConfig`, ``grpo`` -> `GRPOConfig`, ``lora`` -> `rlhf.lora.LoRAConfig`,
``split`` -> `rlhf.split.SplitConfig`), so the CLI and the library validate the same fields
the same way. A key no dataclass has, or a value a dataclass rejects, raises
`jaxcore.ConfigError` naming the key's path (``ppo.kl_estimatr``) and the fields allowed.
"""

from __future__ import annotations

import dataclasses
import pathlib
import types
import typing
from typing import Any

import jax
import yaml

from inference import ServingConfig
from jaxcore import ConfigError, ParallelConfig
from jaxcore.models import TransformerConfig
from rlhf.grpo import GRPOConfig
from rlhf.lora import LoRAConfig
from rlhf.ppo import PPOConfig
from rlhf.rewards import RewardModelSection
from rlhf.split import SplitConfig

STAGES = ("sft", "reward", "ppo", "grpo", "dpo")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainSection:
    """How long and where: ``steps`` (iterations for PPO/GRPO, batches otherwise),
    ``out`` (metrics.jsonl and checkpoints), ``checkpoint_every`` (0: only at the end)."""

    out: str
    steps: int = 10
    lr: float = 1e-3
    critic_lr: float | None = None
    batch_size: int = 16
    seed: int = 0
    checkpoint_every: int = 1

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or self.checkpoint_every < 0:
            raise ConfigError(
                "train: steps and batch_size must be >= 1 and checkpoint_every >= 0 (got "
                f"{self.steps}, {self.batch_size}, {self.checkpoint_every})."
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class PromptSection:
    """PPO/GRPO prompts, ``count`` per iteration: from a JSONL file of ``{"prompt": ...}``
    (``path``), the next ``count`` in file order, wrapping to its start; else random
    prompts of ``length`` ids in ``[low, vocab)`` drawn from ``seed + iteration``. Either
    way a resumed run sees the same prompts. A file's prompts are token ids, or with
    ``tokenizer`` (a ``tokenizer.json`` file or its folder) text or chat messages
    (rendered by the chat template with the generation prompt)."""

    path: str | None = None
    tokenizer: str | None = None
    count: int = 16
    length: int = 3
    low: int = 0
    seed: int = 1000

    def __post_init__(self) -> None:
        if self.count < 1 or self.length < 1 or self.low < 0:
            raise ConfigError(
                f"count and length must be >= 1 and low >= 0 (got count={self.count}, "
                f"length={self.length}, low={self.low}); an empty prompt cannot be sampled."
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataSection:
    """SFT/reward/DPO records: a JSONL file (``path``) of ``{"prompt", "completion"}``
    (SFT) or ``{"prompt", "chosen", "rejected"}`` (reward, DPO) token-id lists, or ``n``
    synthetic records (`rlhf.tasks.synthetic_records`) where chosen completions are rich
    in ``token``. ``held_out`` records are kept for the final evaluation. ``tokenizer``
    (a ``tokenizer.json`` file or its folder; by default ``model.hf``'s when it holds
    one) lets ``path`` (JSONL, or Parquet when it ends in ``.parquet``) hold text and
    TRL's chat records instead of ids (`rlhf.tasks.read_jsonl`)."""

    path: str | None = None
    tokenizer: str | None = None
    n: int = 64
    held_out: int = 16
    seed: int = 0
    prompt_len: int = 4
    completion_len: int = 8
    token: int = 3
    low: int = 4

    def __post_init__(self) -> None:
        if self.n < 1 or self.held_out < 1:
            raise ConfigError(
                f"n and held_out must be >= 1 (got n={self.n}, held_out={self.held_out}); "
                "the run ends with an evaluation on the held_out records."
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class RewardSpec:
    """One Python reward ``fn(prompt_ids, completion_ids) -> float`` by ``module:name``;
    ``kwargs`` make it a factory call first (``module:name(**kwargs)`` returns the fn)."""

    fn: str
    weight: float = 1.0
    kwargs: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LossSection:
    """SFT/reward/DPO loss options: DPO ``beta``, ``label_smoothing``,
    ``reference_free`` (TRL's: no reference model, its log-probs taken as 0); reward
    ``center_coef``; SFT ``packing`` and ``length`` (tokens per row)."""

    beta: float = 0.1
    label_smoothing: float = 0.0
    reference_free: bool = False
    center_coef: float | None = None
    packing: bool = True
    length: int = 24


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
    """A whole ``jaxcore rlhf`` run."""

    stage: str
    model: TransformerConfig
    train: TrainSection
    parallel: ParallelConfig = dataclasses.field(default_factory=ParallelConfig)
    serving: ServingConfig = dataclasses.field(default_factory=ServingConfig)
    ppo: PPOConfig = dataclasses.field(default_factory=PPOConfig)
    grpo: GRPOConfig = dataclasses.field(default_factory=GRPOConfig)
    loss: LossSection = dataclasses.field(default_factory=LossSection)
    prompts: PromptSection = dataclasses.field(default_factory=PromptSection)
    data: DataSection = dataclasses.field(default_factory=DataSection)
    rewards: tuple[RewardSpec, ...] = ()
    lora: LoRAConfig | None = None
    split: SplitConfig | None = None
    reward: RewardModelSection | None = None  # a trained reward model (PPO/GRPO)
    # ``model: {hf: DIR}``: the Hugging Face checkpoint the run starts from (``model`` is
    # then its config.json as a `TransformerConfig`).
    model_hf: str | None = None


SECTIONS: dict[str, type] = {
    "model": TransformerConfig,
    "train": TrainSection,
    "parallel": ParallelConfig,
    "serving": ServingConfig,
    "ppo": PPOConfig,
    "grpo": GRPOConfig,
    "loss": LossSection,
    "prompts": PromptSection,
    "data": DataSection,
    "lora": LoRAConfig,
    "split": SplitConfig,
    "reward": RewardModelSection,
}


def build(cls: type, raw: Any, where: str) -> Any:
    """``cls(**raw)`` with errors that name ``where.key`` and list the allowed keys."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping of {cls.__name__} fields, got {raw!r}.")
    allowed = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = sorted(set(raw) - set(allowed))
    if unknown:
        raise ConfigError(
            f"{where}.{unknown[0]}: unknown key for {cls.__name__}; allowed keys: "
            f"{', '.join(allowed)}."
        )
    hints = _hints(cls)
    values = {k: _checked(v, hints.get(k, Any), f"{where}.{k}") for k, v in raw.items()}
    try:
        return cls(**values)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {cls.__name__} rejected {raw!r}: {e}") from None


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # an annotation that does not resolve: leave the checks to cls
        return {}


_NAMES = {int: "an int", float: "a float", bool: "a bool (true/false)", str: "a str"}


def _fits(value: Any, hint: Any) -> bool:
    """Whether a YAML value can stand for ``hint`` (unknown hints, e.g. classes: yes)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if hint is dict or origin is dict:
        return isinstance(value, dict)
    if hint is tuple or origin is tuple:
        if isinstance(value, str):  # one name where a tuple of names goes (LoRA targets)
            return args[:1] == (str,) and args[1:] == (Ellipsis,)
        if not isinstance(value, (list, tuple)):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_fits(v, args[0]) for v in value)
        return True
    return True


def _options(hint: Any) -> tuple[Any, ...]:
    """The alternatives of a union hint (``int | None``), or the hint alone."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    return typing.get_args(hint) if union else (hint,)


def _describe(hint: Any) -> str:
    if hint in _NAMES:
        return _NAMES[hint]
    if hint is tuple or typing.get_origin(hint) is tuple:
        return "a list"
    if hint is dict or typing.get_origin(hint) is dict:
        return "a mapping"
    return "null" if hint is type(None) else str(hint)


def _parses_as_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _yaml_number(text: str) -> bool:
    """Whether YAML reads ``text`` unquoted as a number (``1``, ``1.0e-3``; not ``1e-3``,
    which YAML 1.1 reads as a string)."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return False
    return isinstance(value, int | float) and not isinstance(value, bool)


def _checked(value: Any, hint: Any, where: str) -> Any:
    """``value`` (a list as a tuple where a tuple goes), or a `ConfigError` naming ``where``
    and the type wanted."""
    options = _options(hint)
    if not _fits(value, hint):
        fix = ""
        if (int in options or float in options) and isinstance(value, str):
            if _yaml_number(value):  # a number YAML reads: it was quoted
                fix = " (a quoted number is a string: write it without the quotes)"
            elif float in options and _parses_as_float(value):
                fix = " (YAML reads 1e-3 as a string: write 1.0e-3)"
        wanted = " or ".join(_describe(a) for a in options)
        raise ConfigError(f"{where}: expected {wanted}, got {value!r}{fix}.")
    if isinstance(value, list) and any(
        a is tuple or typing.get_origin(a) is tuple for a in options
    ):
        return tuple(value)
    return value


def parse_config(stage: str, raw: Any) -> RunConfig:
    """Validate a loaded YAML mapping for ``stage`` into a `RunConfig`."""
    if stage not in STAGES:
        raise ConfigError(f"rlhf stage {stage!r}: use one of {', '.join(STAGES)}.")
    if not isinstance(raw, dict):
        raise ConfigError("rlhf config: the file must hold a mapping of sections.")
    allowed = [*SECTIONS, "rewards"]
    unknown = sorted(set(raw) - set(allowed))
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown section; allowed: {', '.join(allowed)}.")
    for key in ("model", "train"):
        if key not in raw:
            raise ConfigError(f"{key}: missing section (required for every stage).")
    raw = dict(raw)
    hf_dir = _hf_model(stage, raw.get("model"), raw)
    if hf_dir is not None:
        raw.pop("model")
    fields = {k: build(SECTIONS[k], v, k) for k, v in raw.items() if k in SECTIONS}
    if hf_dir is not None:
        from jaxcore.hf import config_from_hf

        try:
            fields["model"] = config_from_hf(hf_dir)
        except ConfigError as e:
            raise ConfigError(f"model.hf: {e}") from None
        fields["model_hf"] = hf_dir
        data = fields.get("data") or DataSection()
        if data.tokenizer is None and (pathlib.Path(hf_dir) / "tokenizer.json").is_file():
            # The checkpoint's own tokenizer reads text records, as TRL's
            # AutoTokenizer.from_pretrained(model_name_or_path) does.
            fields["data"] = dataclasses.replace(data, tokenizer=hf_dir)
    rewards = raw.get("rewards", [])
    if not isinstance(rewards, list):
        raise ConfigError("rewards: expected a list of {fn: 'module:name', weight: ...}.")
    fields["rewards"] = tuple(build(RewardSpec, r, f"rewards[{i}]") for i, r in enumerate(rewards))
    if stage in ("ppo", "grpo") and not fields["rewards"] and "reward" not in fields:
        raise ConfigError(
            f"rewards: {stage} needs at least one reward {{fn: 'module:name'}} or a "
            "reward: {model: PATH} section."
        )
    _check_layout(stage, raw, fields)
    _check_synthetic_ids(stage, fields)
    _check_sft_rows(stage, fields)
    return RunConfig(stage=stage, **fields)


def _hf_model(stage: str, model: Any, raw: dict) -> str | None:
    """The directory of ``model: {hf: DIR}`` (a Hugging Face checkpoint any stage starts
    from, as TRL's ``model_name_or_path``: the policy of SFT, DPO and the PPO/GRPO actor,
    the trunk of a reward model), else None."""
    if not (isinstance(model, dict) and "hf" in model):
        return None
    if set(model) != {"hf"}:
        extra = sorted(set(model) - {"hf"})
        raise ConfigError(
            f"model.hf with model.{extra[0]}: the checkpoint's config.json sets the model; "
            "remove the other model keys (or model.hf for a model from scratch)."
        )
    if stage in ("ppo", "grpo") and "lora" in raw:
        raise ConfigError(
            f"model.hf with lora: {stage} starts a LoRA actor from fresh base weights; drop "
            "lora to train the checkpoint's weights (LoRA on a checkpoint is not supported yet)."
        )
    if not isinstance(model["hf"], str):
        raise ConfigError(f"model.hf: expected a str (a model directory), got {model['hf']!r}.")
    return model["hf"]


def _check_sft_rows(stage: str, fields: dict) -> None:
    """SFT rows hold ``loss.length + 1`` tokens (inputs and the shifted target): longer
    than ``model.max_seq_len + 1`` they stopped the first step, after compiling, with a
    batch error naming neither setting."""
    if stage != "sft":
        return
    length, limit = (fields.get("loss") or LossSection()).length, fields["model"].max_seq_len
    if length > limit:
        raise ConfigError(
            f"loss.length={length}: SFT rows hold loss.length + 1 = {length + 1} tokens, "
            f"past model.max_seq_len={limit} (+1 for the shifted target); use a loss.length "
            f"of at most {limit}."
        )


def _check_synthetic_ids(stage: str, fields: dict) -> None:
    """Random prompts and synthetic records draw ids in ``[low, vocab_size)``."""
    vocab = fields["model"].vocab_size
    rl = stage in ("ppo", "grpo")
    section = "prompts" if rl else "data"
    drawn = fields.get(section) or (PromptSection() if rl else DataSection())
    if drawn.path:  # ids come from the file (checked as it is read)
        return
    for name in ("low",) if rl else ("low", "token"):
        value = getattr(drawn, name)
        if value >= vocab:
            raise ConfigError(
                f"{section}.{name}={value}: random ids are drawn below model.vocab_size="
                f"{vocab}; use a value below it."
            )


def _check_layout(stage: str, raw: dict, fields: dict) -> None:
    """``lora`` (PPO/GRPO actors) and ``split`` (PPO roles) fit the stage and devices."""
    if "lora" in fields and stage not in ("ppo", "grpo"):
        raise ConfigError(f"lora: adapters are for the ppo and grpo actors; remove it for {stage}.")
    split = fields.get("split")
    if split is None:
        return
    if stage != "ppo":
        raise ConfigError(
            f"split: the split layout places PPO's actor, critic and reference; remove it "
            f"for {stage}."
        )
    if "parallel" in raw:
        raise ConfigError(
            "split and parallel: with split each role is fsdp over its own devices; remove "
            "the parallel section (or the split section for one shared mesh)."
        )
    split.assign(jax.devices())


def load_config(stage: str, path: str | pathlib.Path) -> RunConfig:
    """Read and validate ``path`` (YAML) for ``stage``."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise ConfigError(f"rlhf config {path}: no such file.")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"rlhf config {path}: not valid YAML ({e}).") from None
    return parse_config(stage, raw)
