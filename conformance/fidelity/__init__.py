"""The fidelity job: torch's own distributed tests (DistributedTest) on gloo and on the simulator, side by side."""
