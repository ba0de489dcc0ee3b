"""Every step kind: one class each (fields, shape rule, kernel), registered by ``@register``."""

from . import attention, elementwise, layout, products, projection  # noqa: F401
from . import block  # noqa: F401  (op: block, expanded before analysis)
