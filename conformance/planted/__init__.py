"""Planted defects for the defect matrix: test machinery, kept out of the product path.

Only ``conformance.defect_matrix`` (and the suite's own tests) import this package. It holds the
front-end mutants (``frontend``), the defective group builder (``builders``), the list of every
planted defect (``mutants``), the rank task that runs one check with one of them applied (``task``)
and the lanes that run the matrix's cases in parallel (``lanes``). The simulator's own planted
defects are flawed parts (``simulator/flaws.py``, named in ``simulator/defects.py``); the front-end mutants
patch torch through ``simulator/patches.py``.
"""
