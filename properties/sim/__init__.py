"""Properties of the simulator: request conservation, monotone time, dLLM schedulers held to the
spec inside the simulation, and Z3 optimality of the SBS water-filling allocation.

`properties` reaches the simulator only through import strings (never `import reference`)."""
