"""The seams the trainers share: mixins that override one `GRPOTrainer` method each (or a few), and the helpers the
trainers call around TRL's batch code.

- `scoping`: attribute swaps around one call of a `GRPOTrainer` method, and the per-turn generation settings.
- `call_record`: what TRL generated and scored in one call (`RecordsCalls`).
- `row_batches`, `row_kind_forwards`: batches of several row kinds, and their loss forward (`RowKindForwards`).
- `generation_backends`, `context_limit`, `tool_rounds`: generation through every backend, in step across processes.
- `heldout`, `model_card`, `trainer_state`: held-out evaluation, model cards, checkpointed state.
- `init_checks`: the arguments and datasets checked at init.
- `policy_reference`: the policy as its own reference on chosen rows or tokens (a KL of exactly 0 there).
"""
