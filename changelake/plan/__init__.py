"""Composing operators into pipelines: the typed API, the planner and its executors.

``graph`` builds the logical graph (Python API; the YAML form is in ``yaml``), ``planner``
turns it into a :class:`~changelake.plan.physical.PhysicalPlan` with changelog modes decided
and materializers inserted, ``explain`` prints it, ``local`` runs it in-process.
"""

from changelake.connectors.lookup import CacheOptions, Lookup
from changelake.plan.graph import Pipeline, Stream
from changelake.plan.physical import PhysicalNode, PhysicalPlan

__all__ = ["CacheOptions", "Lookup", "Pipeline", "PhysicalNode", "PhysicalPlan", "Stream"]
