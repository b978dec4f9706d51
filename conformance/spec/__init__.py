"""The requirement catalog: data files, one per area, loaded and validated at start."""

from conformance.spec.catalog import AREAS, Requirement, SpecError, load_catalog

__all__ = ["AREAS", "Requirement", "SpecError", "load_catalog"]
