"""What verl needs before its rollout can run on CPU: a model folder, its trainer config, a local Ray runtime.

- The model folder: verl's `HFModelConfig` loads a tokenizer and an HF model config from one path. The
  bench's tokenizer is copied beside a tiny Qwen2 config written by transformers (never downloaded).
- The config: verl's own `ppo_trainer` config composed with Hydra, with the few values a CPU run needs
  (the model folder, group size, prompt/response window, two agent-loop workers, two storage units).
- Ray (`local_ray`): 8 logical CPUs on a 2-core machine, since TransferQueue reserves three for its actors and
  `tq.init()` waits forever with fewer.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

RAY_CPUS = 8  # TransferQueue's controller and storage need 3; agent-loop workers and the bench's actors the rest
AGENT_LOOP_WORKERS = 2
STORAGE_UNITS = 2


def model_folder(tokenizer_path: Path, into: Path) -> Path:
    """The bench's tokenizer plus a tiny Qwen2 model config: what `HFModelConfig` loads from one path."""
    from transformers import AutoTokenizer, Qwen2Config

    folder = into / "model"
    shutil.copytree(tokenizer_path, folder)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    Qwen2Config(architectures=["Qwen2ForCausalLM"], vocab_size=len(tokenizer), hidden_size=16,
                intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id).save_pretrained(folder)
    return folder


def trainer_config(model: Path, group_size: int, prompt_length: int, response_length: int) -> Any:
    """verl's `ppo_trainer` config, composed as its entry point composes it, set for a CPU rollout."""
    import verl
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    overrides = [
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.rollout.name=sglang",  # the engine the bench server stands in for
        f"actor_rollout_ref.rollout.n={group_size}",
        f"actor_rollout_ref.rollout.prompt_length={prompt_length}",
        f"actor_rollout_ref.rollout.response_length={response_length}",
        f"actor_rollout_ref.rollout.agent.num_workers={AGENT_LOOP_WORKERS}",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        f"data.max_prompt_length={prompt_length}",
        f"data.max_response_length={response_length}",
        "transfer_queue.enable=true",
        f"transfer_queue.backend.SimpleStorage.num_data_storage_units={STORAGE_UNITS}",
    ]
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    with open_dict(config):
        config.actor_rollout_ref.model.override_config = {"attn_implementation": "eager"}
    return config
