"""The requirement catalog: data files, one per area, loaded and validated at start."""

from conformance.spec.catalog import AREAS, Requirement, load_catalog
from conformance.spec.datafile import SpecError

__all__ = ["AREAS", "Requirement", "SpecError", "load_catalog"]
