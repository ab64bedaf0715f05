"""Variant kinds: the rows a recipe can compare, one registered object each (as mergekit registers
its merge methods). `KINDS` maps the name used in recipes to the kind; its order is the order
in which recipes and messages list them. Adding a kind: one module here and one line below.
"""

from .arrow import ArrowKind
from .base import BaseKind
from .composed import ComposedKind
from .distilled import DistilledKind
from .experts import ExpertsKind
from .kind import Kind, Variant
from .merged import MergedKind
from .merged_lora import MergedLoraKind
from .oracle import OracleKind
from .routed import RoutedKind

KINDS: dict[str, Kind] = {k.name: k for k in (
    BaseKind(),
    ExpertsKind(),
    ComposedKind(),
    RoutedKind(),
    MergedKind(),
    MergedLoraKind(),
    ArrowKind(),
    DistilledKind(),
    OracleKind(),
)}

__all__ = ["KINDS", "Kind", "Variant"]
