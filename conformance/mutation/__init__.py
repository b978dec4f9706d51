"""Mutation testing: generated mutants of the simulator and of the example vendor backend, each judged by the suite.

``targets`` names what is mutated and how it is judged, ``judge`` is the per-mutant judge (the suite's verdict,
stopping at the first failing MUST), ``harness`` enumerates and samples mutants with cosmic-ray and runs them in
copies of the tree, ``report`` writes ``reports/mutation.{json,md}`` with the triage of every surviving mutant.
"""
