"""Every step kind: one class each (fields, shape rule, kernel), registered by ``@register``."""

from . import attention, elementwise, layout, products, projection  # noqa: F401
