"""Every step kind: one class each (fields, shape rule, kernel), registered by ``@register``."""

# registration order is the order of the op union (and of the generated schema and docs): not alphabetical
from . import attention, elementwise, layout, products, projection  # noqa: F401, I001
from . import pointwise, norms, positions, expansion, einsum, fused  # noqa: F401, I001  (modern attention: Llama, Mistral, GPT-2, BERT)
from . import conv, numeric, routing  # noqa: F401  (the zoo: ViT, Whisper, Mixtral; math, comparisons, reductions, ranges: T5, Llama 4)
from . import block  # noqa: F401  (op: block, expanded before analysis)
