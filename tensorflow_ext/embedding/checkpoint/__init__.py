"""Checkpoints of dynamic embeddings, one module per job.

  format.py        what a checkpoint holds per shard: tensor suffixes, the layout record, the delta record; pure
                   Python (parsing and validation, no graph)
  save.py          the shards' SaveableObjects and their spec mode (full, lean export, restore build)
  restore.py       a Saver's restore of one embedding, in named steps: read and check, place by partition, import,
                   gate
  delta.py         delta checkpoints (a full save every N saves, the rows changed since the previous save between)
  warm_start.py    warm start of dynamic embeddings from a checkpoint (any shard count, dims converted on request)
  policy_state.py  the admission and eviction policies' state, restored where present, started empty where not

The package sits above the shard (embedding/shard.py) and the embedding's state (embedding/state.py), and below the
embedding object (embedding/variable.py), whose distribution builds its shards' saveables (`save.shard_saveables`,
or a subclass's, as Horovod's model-parallel one). It reads a shard through its interface (table ref, name, dim,
width, slot groups, embedding) and never imports the modules above it.
"""
