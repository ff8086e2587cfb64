"""AReaL's trainer side between rollout steps: the weight sync its trainer makes with its SGLang servers, made by
AReaL's own `RemoteSGLangEngine` methods against the bench's server (`run --steps K`; imported in AReaL's
environment).

What AReaL 1.0.4's trainer does, in its default configuration (`actor.weight_update_mode = "xccl"`, an FSDP actor):

- once, when the actor connects to its rollout engine (`FSDPEngine.connect_engine` ->
  `_init_weight_update_from_distributed`): `POST /init_weights_update_group` on every server (group
  `update_weight_group`, `world_size` the servers' GPUs + 1, `rank_offset` 1; `SGLangBackend.
  build_init_weights_group_request`). No weights are pushed before the first rollout: the servers start from the
  model path, and the engine's version counter is 0.
- after each step's training (`PPOTrainer.train`, `areal/trainer/rl_trainer.py`): `rollout.pause()` (the workflow
  executor starts no new episode, and an interrupted request waits before it is sent again:
  `RemoteInfEngine.agenerate`), then the actor's `update_weights` (`FSDPEngine._update_weights_from_distributed`):
  `POST /pause_generation {}`, per bucket of tensors `POST /update_weights_from_distributed` (`names`, `dtypes`,
  `shapes`, `group_name`, `abort_all_requests` true; `SGLangBackend.build_distributed_weight_update_requests`)
  while the tensors are broadcast, `POST /continue_generation {}`; then `rollout.set_version(step + 1)` and, after
  saving and evaluating, `rollout.resume()`.

No update names a version: SGLang's `weight_version` label stays where it was (it moves only for an update that
names one), and AReaL stamps every generated token with its engine's own counter (`get_version()` when the answer
came back), the one `set_version` moves. That counter is the trainer's version, so it is what a sample's
`weight_versions` are, and what the sync returns.

No tensors are sent (CPU, no model): the one update call names none, nothing is broadcast, and the mock applies it
(aborting what runs, as `abort_all_requests` asks). A refused call raises, as AReaL's `arequest_with_retry` does
after its retries: the step fails before its rollout.
"""

from __future__ import annotations

from typing import Any

GROUP_NAME = "update_weight_group"  # FSDPEngine._init_weight_update_from_distributed, pipeline parallel size 1
ALLOCATION = "sglang:d1"  # one server of one GPU (the bench's)


def meta() -> Any:
    """AReaL's `WeightUpdateMeta` for an FSDP actor's xccl sync with one SGLang server (no NCCL group is made)."""
    from areal.api.alloc_mode import ModelAllocation
    from areal.api.io_struct import WeightUpdateMeta

    update = WeightUpdateMeta.from_fsdp_xccl(gen_allocation=ModelAllocation.from_str(ALLOCATION))
    update.nccl_master_address, update.nccl_master_port, update.nccl_group_name = "127.0.0.1", 0, GROUP_NAME
    return update


def connect(engine: Any, update: Any) -> None:
    """The actor joining its rollout engine's weight-update group (once, before the first rollout)."""
    engine.init_weights_update_group(update).result()


def publish(engine: Any, update: Any, version: int) -> None:
    """One weight sync after a step's training, in AReaL's trainer's order; the engine's counter becomes `version`."""
    engine.pause()
    engine.pause_generation()
    engine.update_weights_from_distributed(update.with_version(version), []).result()
    engine.continue_generation()
    engine.set_version(version)
    engine.resume()
