"""The importer: a PyTorch module, run once on example inputs, as tracer's YAML.

Data flows through five modules, one stage each (docs/import.md, docs/architecture.md):

- ``capture``: ``torch.export`` of the module, under the settings that keep ops whole (``leaves``:
  a sparse mixture of experts captured whole, one ``tracer::experts`` call);
- ``idioms``: the captured graph canonicalised, its constant regions evaluated, and the idioms
  that are one tracer step (RMSNorm, RoPE, repeat_kv, masks, ``nn.MultiheadAttention``) found;
- ``rules``: one rule per ATen op or idiom, writing a step with the name a person would write;
- ``naming``: sizes as dims named after the model's config (``d_model``, ``H``, ``Dh``);
- ``writer``: the YAML files, repeated layers folded into a block.

``tracer.from_module`` (``tracer/importing.py``) loads what they write as a pipeline.
"""
