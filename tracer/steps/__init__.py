"""Every step kind: one class each (fields, shape rule, kernel), registered by ``@register``."""

# registration order is the order of the op union (and of the generated schema and docs): not alphabetical
from . import attention, elementwise, layout, products, projection  # noqa: F401, I001
from . import pointwise, norms, positions, expansion, einsum, fused  # noqa: F401, I001  (modern attention: Llama, Mistral, GPT-2, BERT)
from . import numeric  # noqa: F401  (math, comparisons, reductions, ranges: T5's buckets, Llama 4's temperature)
from . import block  # noqa: F401  (op: block, expanded before analysis)
